"""Window values -> Redis in Feast's layout (`redis_store`), pipelined and event-time guarded.

Each write is `redis_store.guarded`'s EVALSHA over blocks of entities: a key is written only when its stored
`_ts:{view}` is not newer than ours, so a replay after a restart, or a slower writer, never moves a value back in
time. `_ts` is the view's clock (the greatest event time seen), the instant the values are as of. A refused key is
reported with the `_ts` it holds, so the writer can write it again once its clock gets there (a materialized row
at a later boundary, say). I/O goes through `redis_store.writes` (one node or a cluster's masters, sent again
while Redis restarts or fails over), on `redis_store.node`, the client every part of featurectl uses. On a Redis
Cluster a script call may only touch keys of one hash slot, so keys are grouped by slot: one call per slot (rarely
more than a key each), all of one master's calls in one pipeline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from dsl.types import ValueType
from redis_store import freshness, guarded, layout
from redis_store.errors import RedisReplyError, RedisUnavailableError
from redis_store.node import check_replies
from redis_store.settings import RedisSettings
from redis_store.writes import slots_of, writes_for
from streaming.windows import ViewLayout

log = logging.getLogger(__name__)

RETRY_S = 60.0


_FLOATS = (ValueType.FLOAT32, ValueType.FLOAT64)


def _encode(values: list, kind: ValueType) -> list[bytes]:
    """One feature of many entities as Value bytes; numbers go through numpy (NULLs masked)."""
    if not (kind.is_numeric or kind is ValueType.TIMESTAMP):
        return layout.encode_column(values, kind)
    mask = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    numbers = np.array([0 if v is None else v for v in values], dtype=np.float64 if kind in _FLOATS else np.int64)
    return layout.encode_column(numbers, kind, mask if mask.any() else None)


@dataclass(frozen=True)
class GuardedWrites:
    """Packed guarded writes; `slots[c]` is the hash slot of command c's keys (None on one node) and
    `positions[c]` the positions of its keys among the rows given to `RedisSink.commands`."""

    commands: list[bytes]
    slots: Optional[list[int]]
    positions: list[Sequence[int]]


class RedisSink:
    """Writes rows of one project to one Redis node or a Redis Cluster; one pipelined round trip per `send` (per
    master, side by side). Keys expire `key_ttl_s` after their last write when it is set (Feast's
    `online_store.key_ttl_seconds`). Raises RedisUnavailableError when Redis does not answer at the start."""

    def __init__(self, settings: RedisSettings, project: str, key_ttl_s: int = 0):
        self.redis = writes_for(settings.for_bulk_writes(), "the streaming sink", RETRY_S, guarded.LOAD)
        self.project = project
        self.key_ttl_s = key_ttl_s
        self._views: dict[str, tuple] = {}

    def _view(self, view_layout: ViewLayout) -> tuple:
        name = view_layout.name
        if name not in self._views:
            encoder = layout.KeyEncoder(self.project, view_layout.join_keys)
            positions = [view_layout.key_columns.index(k) for k in encoder.order]
            fields = [layout.field_name(name, s.name) for s in view_layout.specs]
            kinds = [s.kind for s in view_layout.specs]
            self._views[name] = (encoder, positions, layout.ts_field(name), fields, kinds)
        return self._views[name]

    def commands(self, view_layout: ViewLayout, rows: Sequence[tuple[tuple, list[Any]]],
                 ts_ms: int | Sequence[int]) -> GuardedWrites:
        """Packed guarded writes of `rows` (entity key, values in the layout's feature order) as of `ts_ms`, one
        for all rows or one per row."""
        encoder, positions, ts_field, fields, kinds = self._view(view_layout)
        ts_ms = list(ts_ms) if isinstance(ts_ms, (list, tuple)) else [ts_ms] * len(rows)
        columns = zip(*(values for _, values in rows))
        encoded = list(zip(*(_encode(list(c), k) for c, k in zip(columns, kinds))))
        keys = [encoder.key([key[p] for p in positions]) for key, _ in rows]
        if not self.redis.cluster:
            commands = guarded.commands(keys, ts_ms, ts_field, fields, encoded, self.key_ttl_s)
            return GuardedWrites(commands, None, [range(lo, min(lo + guarded.BLOCK, len(keys)))
                                                  for lo in range(0, len(keys), guarded.BLOCK)])
        by_slot: dict[int, list[int]] = {}
        for i, slot in enumerate(slots_of(keys)):
            by_slot.setdefault(slot, []).append(i)
        out = GuardedWrites([], [], [])
        for slot, group in by_slot.items():
            for lo in range(0, len(group), guarded.BLOCK):
                block = group[lo:lo + guarded.BLOCK]
                out.commands.extend(guarded.commands([keys[i] for i in block], [ts_ms[i] for i in block], ts_field,
                                                     fields, [encoded[i] for i in block], self.key_ttl_s))
                out.slots.append(slot)
                out.positions.append(block)
        return out

    def send(self, writes: GuardedWrites) -> list[tuple[int, int]]:
        """One round trip (per master) for all writes; returns the rows refused as older than Redis's: (position
        among the rows given to `commands`, the `_ts` in ms that Redis holds).

        Writes are idempotent, so a failed round trip is sent again, for up to `RETRY_S` while Redis is away or
        fails over (`redis_store.writes`)."""
        if not writes.commands:
            return []
        replies = self.redis.execute(writes.slots, writes.commands)
        return guarded.refused(check_replies(replies, self.redis.where), writes.positions)

    def record_newest(self, newest_ms: dict[str, int]) -> None:
        """Raise the views' recorded newest event times to those just written (`redis_store.freshness`): one
        command, sent like the writes."""
        key = freshness.record_key(self.project)
        command = freshness.record_command(self.project, newest_ms)
        check_replies(self.redis.execute(slots_of([key]) if self.redis.cluster else None, [command]),
                      self.redis.where)

    def run_id(self) -> Optional[str]:
        """The Redis process's run id (a new one after a restart; on a cluster, the masters'); None while it is
        away."""
        try:
            return self.redis.run_id()
        except (RedisUnavailableError, RedisReplyError, KeyError):
            return None

    def close(self) -> None:
        self.redis.close()
