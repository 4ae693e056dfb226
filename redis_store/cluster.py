"""Redis Cluster: each key goes to the node owning its hash slot; all nodes are written before any is read, so a
request costs one round trip per node in parallel, never one per key.

The slot map comes from `CLUSTER SLOTS` and is reloaded when a node answers MOVED or ASK (resharding), or cannot
be reached (a master killed, its replica promoted); the request is then sent again (HMGET is idempotent). Routing
and merging are shared by the sync and the async cluster; only the I/O differs. Writers route through
`redis_store.writes`, which uses the sync cluster's nodes and slot map.
"""

from __future__ import annotations

import asyncio
from typing import Iterable

import hiredis
from redis.crc import key_slot

from redis_store.errors import RedisConfigError, RedisUnavailableError
from redis_store.node import AsyncNode, SyncNode, check_replies
from redis_store.settings import RedisSettings

CLUSTER_SLOTS = hiredis.pack_command((b"CLUSTER", b"SLOTS"))
_ATTEMPTS = 3
_SLOTS = 16384


class SlotMap:
    """Hash slot -> (host, port) of the master serving it; how many replicas each master has."""

    def __init__(self, reply: list):
        self.owner: list = [None] * _SLOTS
        self.replicas: dict[tuple[str, int], int] = {}
        for start, end, master, *replicas in reply:
            address = (master[0].decode(), int(master[1]))
            self.owner[start:end + 1] = [address] * (end - start + 1)
            self.replicas[address] = len(replicas)  # CLUSTER SLOTS leaves out replicas marked failed
        if None in self.owner:
            raise RedisUnavailableError("the redis cluster does not cover all 16384 hash slots (CLUSTERDOWN?); "
                                        "check `redis-cli cluster info`")

    @property
    def masters(self) -> set[tuple[str, int]]:
        return set(self.owner)

    def split(self, keys: list[bytes], commands: list[bytes]) -> list[tuple[tuple[str, int], list[int], list]]:
        """(node, positions, commands) for each node that owns some of the keys."""
        by_node: dict[tuple[str, int], list[int]] = {}
        owner = self.owner
        for i, key in enumerate(keys):
            by_node.setdefault(owner[key_slot(key)], []).append(i)
        return [(node, idx, [commands[i] for i in idx]) for node, idx in by_node.items()]


def _merge(count: int, parts: Iterable[tuple[list[int], list]]) -> tuple[list, bool]:
    """Replies back in request order, and whether some node redirected (MOVED/ASK: reload the slot map)."""
    replies: list = [None] * count
    redirected = False
    for positions, part in parts:
        for i, reply in zip(positions, part):
            replies[i] = reply
            if isinstance(reply, hiredis.ReplyError) and str(reply).startswith(("MOVED ", "ASK ")):
                redirected = True
    return replies, redirected


def _slot_map(replies: list, address: tuple[str, int]) -> SlotMap:
    """The slot map from a node's CLUSTER SLOTS reply; a node without cluster mode is a configuration error."""
    reply = replies[0]
    if isinstance(reply, hiredis.ReplyError) and "cluster support disabled" in str(reply):
        raise RedisConfigError(f"redis at {address[0]}:{address[1]} is not a Redis Cluster node, but "
                               "online_store.redis_type is redis_cluster: set `redis_type: redis` for a single node, "
                               "or point online_store.connection_string at the cluster's nodes")
    return SlotMap(check_replies(replies, str(address))[0])


def _redirect_error(settings: RedisSettings) -> RedisUnavailableError:
    return RedisUnavailableError(f"redis cluster {settings.nodes} kept redirecting after {_ATTEMPTS} slot map "
                                 "reloads; is it resharding? retry later")


class SyncCluster:
    def __init__(self, settings: RedisSettings):
        self.settings = settings
        self._nodes: dict[tuple[str, int], SyncNode] = {}
        self.slots = self._load_slots()

    def node(self, address: tuple[str, int]) -> SyncNode:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = SyncNode(self.settings, address)
        return node

    def reload(self) -> None:
        """Ask the nodes for the slot map again (after MOVED, or a master that went away)."""
        self.slots = self._load_slots()

    def _load_slots(self) -> SlotMap:
        error: Exception = RedisUnavailableError("no cluster node configured")
        for address in [*self._nodes, *self.settings.nodes]:
            try:
                return _slot_map(self.node(address).execute([CLUSTER_SLOTS]), address)
            except RedisUnavailableError as exc:
                error = exc
        raise error

    def read(self, keys: list[bytes], commands: list[bytes]) -> list:
        for attempt in range(_ATTEMPTS):
            received, failure = [], None
            pending = []
            for address, idx, cmds in self.slots.split(keys, commands):
                node = self.node(address)
                try:
                    pending.append((node, idx, node.send(cmds), len(cmds)))
                except RedisUnavailableError as exc:
                    failure = exc
            for node, idx, sent, count in pending:  # read every node even if one fails: no connection left dirty
                try:
                    received.append((idx, node.receive(sent, count)))
                except RedisUnavailableError as exc:
                    failure = exc
            if failure is not None:  # a master gone: its replica may serve its slots now
                if attempt == _ATTEMPTS - 1:
                    raise failure
                self.slots = self._reload_or_raise(failure)
                continue
            replies, redirected = _merge(len(commands), received)
            if not redirected:
                return check_replies(replies, "redis cluster")
            self.slots = self._load_slots()
        raise _redirect_error(self.settings)

    def _reload_or_raise(self, failure: RedisUnavailableError) -> SlotMap:
        """The slot map again; when it still names the same masters, the read's own failure is the answer."""
        slots = self._load_slots()
        if slots.owner == self.slots.owner:
            raise failure
        return slots

    def ping(self) -> None:
        for address in self.slots.masters:
            self.node(address).ping()

    def close(self) -> None:
        for node in self._nodes.values():
            node.close()


class AsyncCluster:
    def __init__(self, settings: RedisSettings):
        self.settings = settings
        self._nodes: dict[tuple[str, int], AsyncNode] = {}
        self.slots: SlotMap | None = None

    def _node(self, address: tuple[str, int]) -> AsyncNode:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = AsyncNode(self.settings, address)
        return node

    async def _load_slots(self) -> SlotMap:
        error: Exception = RedisUnavailableError("no cluster node configured")
        for address in [*self._nodes, *self.settings.nodes]:
            try:
                return _slot_map(await self._node(address).execute([CLUSTER_SLOTS]), address)
            except RedisUnavailableError as exc:
                error = exc
        raise error

    async def read(self, keys: list[bytes], commands: list[bytes]) -> list:
        for attempt in range(_ATTEMPTS):
            if self.slots is None:
                self.slots = await self._load_slots()
            parts = self.slots.split(keys, commands)
            results = await asyncio.gather(*(self._node(a).execute(cmds) for a, _, cmds in parts),
                                           return_exceptions=True)
            failure = next((r for r in results if isinstance(r, BaseException)), None)
            if failure is not None:  # a master gone: reload the slot map, its replica may serve its slots now
                if attempt == _ATTEMPTS - 1 or not isinstance(failure, RedisUnavailableError):
                    raise failure
                self.slots = None
                continue
            replies, redirected = _merge(len(commands), ((idx, r) for (_, idx, _), r in zip(parts, results)))
            if not redirected:
                return check_replies(replies, "redis cluster")
            self.slots = None
        raise _redirect_error(self.settings)

    async def ping(self) -> None:
        if self.slots is None:
            self.slots = await self._load_slots()
        await asyncio.gather(*(self._node(a).ping() for a in self.slots.masters))

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.close()
