"""Writes that must land, on one node or a Redis Cluster: sent again while Redis is away, a slot moves or a master
fails over, so that a writer (the streaming sink; materialization on a cluster) carries on instead of failing.

Every command given must be safe to send twice (the guarded write of `redis_store.guarded`, RESTORE without
REPLACE): a reply lost with its connection is answered by sending the command again.

On a cluster each command touches keys of one hash slot (Redis Cluster refuses others). The commands of each master
go in one pipeline, every master written before any is read. A master with replicas gets `WAIT 1` at the end of
its pipeline, so a write counts once a replica holds it too: a master killed after that loses nothing to the
replica promoted in its place, and one killed before it has its commands sent again, to the new master. MOVED
reloads the slot map; ASK sends to the node named, after ASKING; a node that cannot be reached, CLUSTERDOWN and
TRYAGAIN are retried after a pause and a reload, for up to `retry_s`, then a RedisUnavailableError says so.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

import hiredis
from redis.crc import key_slot

from redis_store.cluster import SyncCluster
from redis_store.errors import RedisUnavailableError
from redis_store.node import SyncNode
from redis_store.settings import RedisSettings

log = logging.getLogger(__name__)

RETRYABLE = ("CLUSTERDOWN", "TRYAGAIN", "LOADING", "MASTERDOWN")  # the cluster is failing over or moving a slot
REPLICA_WAIT_MS = 2_000  # how long a pipeline waits for a replica to acknowledge its writes
_ASKING = hiredis.pack_command((b"ASKING",))
_WAIT = hiredis.pack_command((b"WAIT", 1, REPLICA_WAIT_MS))
_FIRST_PAUSE_S, _LONGEST_PAUSE_S = 0.05, 1.0

Address = tuple[str, int]


def slots_of(keys: Sequence[bytes]) -> list[int]:
    """The hash slot of each key (for `ClusterWrites.execute`)."""
    return [key_slot(key) for key in keys]


def _gave_up(retry_s: float, exc: Exception) -> RedisUnavailableError:
    return RedisUnavailableError(f"redis did not take the writes for {retry_s:.0f}s ({exc}); check that it is "
                                 "running (`featurectl services up` starts the local one), then run this again")


def _missing_script(reply: object) -> bool:
    return isinstance(reply, hiredis.ReplyError) and str(reply).startswith("NOSCRIPT")


class NodeWrites:
    """One node: all commands in one pipeline, sent again while the node is away (a restart)."""

    cluster = False

    def __init__(self, settings: RedisSettings, purpose: str, retry_s: float, script: Optional[bytes] = None):
        self.node = SyncNode(settings, settings.single_node(purpose))
        self.where = self.node.where
        self.retry_s, self.script = retry_s, script
        if script is not None:
            self.node.read([], [script])

    def execute(self, slots: Optional[Sequence[int]], commands: Sequence[bytes]) -> list:
        """The replies to `commands`, in order (`slots` matter only to a cluster)."""
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                replies = self.node.execute(list(commands))
            except RedisUnavailableError as exc:
                if time.monotonic() > deadline:
                    raise _gave_up(self.retry_s, exc) from exc
                log.warning("writing to Redis failed (%s); retrying", exc)
                time.sleep(_LONGEST_PAUSE_S)
                continue
            if self.script is not None and any(map(_missing_script, replies)):  # restarted without our script
                self.node.read([], [self.script])
                continue
            return replies

    def run_id(self) -> str:
        """The server process's run id (a new one after a restart); raises while it is away."""
        return self.node.info("server")["run_id"]

    def close(self) -> None:
        self.node.close()


class ClusterWrites:
    """A Redis Cluster: each command to the master of its slot, one pipeline per master, followed through MOVED,
    ASK and failovers (module docstring). `unreplicated` counts pipelines no replica acknowledged in time."""

    cluster = True
    where = "redis cluster"

    def __init__(self, settings: RedisSettings, retry_s: float, script: Optional[bytes] = None):
        self.redis = SyncCluster(settings)
        self.retry_s, self.script = retry_s, script
        self.unreplicated = 0
        self._unloaded: set[Address] = set(self.redis.slots.masters) if script is not None else set()

    def execute(self, slots: Sequence[int], commands: Sequence[bytes]) -> list:
        """The replies to `commands` (each on the keys of `slots[i]`), in order; an error reply other than a
        redirection or a failover is returned for the caller to judge."""
        replies: list = [None] * len(commands)
        owner = self.redis.slots.owner
        routes: dict[tuple[Address, bool], list[int]] = {}
        for i, slot in enumerate(slots):
            routes.setdefault((owner[slot], False), []).append(i)
        began = time.monotonic()
        pause, failed = _FIRST_PAUSE_S, False
        while routes:
            again, failure = self._round(routes, commands, replies)
            if not again:
                break
            if failure is not None:  # a node away or the cluster failing over: give it a moment
                if time.monotonic() > began + self.retry_s:
                    raise _gave_up(self.retry_s, failure)
                (log.debug if failed else log.warning)("redis cluster: %s; retrying %d writes for up to %.0f s",
                                                       failure, len(again), self.retry_s)
                failed = True
                time.sleep(pause)
                pause = min(2 * pause, _LONGEST_PAUSE_S)
            if any(asked is None for _, asked in again):
                self._reload()
            routes = {}
            for i, asked in again:
                routes.setdefault((asked, True) if asked else (self.redis.slots.owner[slots[i]], False), []).append(i)
        if failed:
            log.warning("redis cluster: writes carried on after %.1f s", time.monotonic() - began)
        return replies

    def _reload(self) -> None:
        try:
            self.redis.reload()
        except RedisUnavailableError as exc:  # no node answered: the next round fails and comes back here
            log.warning("redis cluster: reloading the slot map failed (%s)", exc)

    def _round(self, routes: dict[tuple[Address, bool], list[int]], commands: Sequence[bytes],
               replies: list) -> tuple[list[tuple[int, Optional[Address]]], Optional[Exception]]:
        """One pipeline per route, all written before any is read; fills `replies` and returns what to send
        again ((position, the node an ASK named)) and why, when it was a failure rather than a redirection."""
        again: list[tuple[int, Optional[Address]]] = []
        failure: Optional[Exception] = None
        sent = []
        for (address, asking), positions in routes.items():
            head = [self.script] if address in self._unloaded else []
            body = [commands[i] for i in positions]
            if asking:  # the node named by ASK serves an importing slot only to a command after ASKING
                body = [c for command in body for c in (_ASKING, command)]
            tail = [_WAIT] if self.redis.slots.replicas.get(address) else []
            node = self.redis.node(address)
            try:
                sent.append((address, asking, positions, node, node.send(head + body + tail), head, tail))
            except RedisUnavailableError as exc:
                again += [(i, None) for i in positions]
                failure = exc
        for address, asking, positions, node, pending, head, tail in sent:
            try:
                got = node.receive(pending, len(head) + len(positions) * (1 + asking) + len(tail))
            except RedisUnavailableError as exc:
                again += [(i, None) for i in positions]
                failure = exc
                continue
            self._unloaded.discard(address)
            if tail and not (isinstance(got[-1], int) and got[-1] >= 1):
                self._not_replicated(address, got[-1])
            body = got[len(head):len(got) - len(tail)]
            for i, reply in zip(positions, body[1::2] if asking else body):
                retry = self._retry(address, reply) if isinstance(reply, hiredis.ReplyError) else False
                if retry is False:
                    replies[i] = reply
                    continue
                again.append((i, retry))
                if retry is None and str(reply).startswith(RETRYABLE):
                    failure = RedisUnavailableError(f"{address[0]}:{address[1]} answered {reply}")
        return again, failure

    def _retry(self, address: Address, reply: hiredis.ReplyError) -> Optional[Address] | bool:
        """False: a final reply; None: send again where the slot map says; an address: send there (ASK)."""
        text = str(reply)
        if text.startswith("ASK "):
            host, _, port = text.split()[2].rpartition(":")
            return host, int(port)
        if text.startswith(("MOVED ", *RETRYABLE)):
            return None
        if self.script is not None and text.startswith("NOSCRIPT"):
            self._unloaded.add(address)
            return None
        return False

    def _not_replicated(self, address: Address, reply: object) -> None:
        self.unreplicated += 1
        log.warning("redis cluster: no replica of %s:%d acknowledged a pipeline within %d ms (WAIT: %s); those "
                    "writes are lost if that master fails before it replicates them", *address, REPLICA_WAIT_MS,
                    reply)

    def run_id(self) -> str:
        """The run ids of the masters: another value after a master restarts or a replica takes over."""
        masters = sorted(self.redis.slots.masters)
        return ",".join(self.redis.node(a).info("server")["run_id"] for a in masters)

    def close(self) -> None:
        self.redis.close()


def writes_for(settings: RedisSettings, purpose: str, retry_s: float,
               script: Optional[bytes] = None) -> NodeWrites | ClusterWrites:
    """The writer's way to the Redis of `settings`: a cluster's masters or the one node."""
    if settings.cluster:
        return ClusterWrites(settings, retry_s, script)
    return NodeWrites(settings, purpose, retry_s, script)
