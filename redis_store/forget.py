"""Removing one entity's online values: the hashes of a project that the entity keys, on one node or a cluster.

A hash holds every view of the project keyed by the same entity, so deleting it removes the entity from all of
them at once. An entity named by all its join keys is one key, deleted directly. One named by some of its keys
(`user_id` of an entity keyed by `asset_id` and `user_id`) matches many keys: those are found with SCAN and a
glob of the key's fixed bytes, and each candidate is decoded and compared before it is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import hiredis

from dsl.types import ValueType
from redis_store.layout import KeyEncoder
from redis_store.node import SyncNode
from redis_store.settings import RedisSettings
from redis_store.writes import ClusterWrites, NodeWrites, slots_of, writes_for

RETRY_S = 30.0
SCAN_COUNT = 1_000
DELETE_BATCH = 500
_GLOB_SPECIAL = frozenset(b"*?[]\\")


@dataclass(frozen=True)
class EntityMatch:
    """The keys of one entity (its join keys and types) in `project` whose values match `given`."""

    project: str
    join_keys: Mapping[str, ValueType]
    given: Mapping[str, Any]

    @property
    def complete(self) -> bool:
        return set(self.given) == set(self.join_keys)

    @property
    def encoder(self) -> KeyEncoder:
        return KeyEncoder(self.project, dict(self.join_keys))

    def key(self) -> bytes:
        encoder = self.encoder
        return encoder.key([self.given[name] for name in encoder.order])

    def pattern(self) -> bytes:
        """A SCAN glob: the fixed bytes of the key, `*` where a join key not given sits."""
        encoder = self.encoder
        parts = [_escape(encoder.head)]
        for index, name in enumerate(encoder.order):
            if name in self.given:
                parts.append(_escape(encoder.part(index, self.given[name])))
            elif parts[-1] != b"*":
                parts.append(b"*")
        parts.append(_escape(encoder.suffix))
        return b"".join(parts)

    def matches(self, key: bytes) -> bool:
        """Whether a key the glob found is this entity's with the given values (a `*` may have matched across
        a value's bytes)."""
        encoder = self.encoder
        values = encoder.decode(key)
        return values is not None and all(values[encoder.order.index(name)] == value
                                          for name, value in self.given.items())


def _escape(raw: bytes) -> bytes:
    return b"".join(b"\\" + bytes([b]) if b in _GLOB_SPECIAL else bytes([b]) for b in raw)


def _masters(writes: NodeWrites | ClusterWrites) -> Iterator[SyncNode]:
    if isinstance(writes, ClusterWrites):
        for address in sorted(writes.redis.slots.masters):
            yield writes.redis.node(address)
    else:
        yield writes.node


def _scan(node: SyncNode, pattern: bytes) -> Iterator[list[bytes]]:
    cursor = b"0"
    while True:
        cursor, keys = node.execute([hiredis.pack_command((b"SCAN", cursor, b"MATCH", pattern,
                                                           b"COUNT", SCAN_COUNT))])[0]
        yield keys
        if cursor == b"0":
            return


class OnlineEraser:
    """Finds and deletes entities' hashes in the Redis of `settings`."""

    def __init__(self, settings: RedisSettings):
        self.writes = writes_for(settings, "deleting an entity's online values", RETRY_S)

    def keys(self, match: EntityMatch) -> list[bytes]:
        """The keys of `match` that exist now."""
        if match.complete:
            key = match.key()
            exists = self.writes.execute(slots_of([key]), [hiredis.pack_command((b"EXISTS", key))])
            return [key] if exists[0] else []
        found: set[bytes] = set()
        for node in _masters(self.writes):
            for batch in _scan(node, match.pattern()):
                found.update(key for key in batch if match.matches(key))
        return sorted(found)

    def delete(self, keys: list[bytes]) -> int:
        """Delete `keys`; how many existed."""
        deleted = 0
        for lo in range(0, len(keys), DELETE_BATCH):
            batch = keys[lo:lo + DELETE_BATCH]
            replies = self.writes.execute(slots_of(batch), [hiredis.pack_command((b"DEL", key)) for key in batch])
            deleted += sum(int(r) for r in replies if isinstance(r, int))
        return deleted

    def close(self) -> None:
        self.writes.close()
