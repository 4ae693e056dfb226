"""The window writer: the job's tile topics -> per-view window state -> Redis, and dead letters -> counts.

`featurectl stream --parallelism N` runs N of them, each in a process of its own (`streaming.writer_pool`):
writer `i` reads the partitions `p % N == i` of every tile and dead-letter topic, holds the windows of the
entities there (all tiles of an entity share a partition, `streaming.partitioning`) and shares each view's
clock with the others (`streaming.shared_clock`).

It keeps no state of its own on disk. On start it reads the tile topics from their beginning to their current
end (compaction and retention keep them at one version per entity and tile within the longest window) and only
then writes Redis, so a restart resumes from state at least as new as what Redis holds; it then follows the
topics, writing after every batch it takes (at most once a second while it is behind, so that the updates of an
entity in that time become one write). A Redis that restarts without persistence comes back empty: the writer
notices its new run id (checked once a second) and writes every entity it holds again.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable, Optional

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from common.storage import Storage
from streaming.bootstrap import read_tiles
from streaming.config import StreamSettings
from streaming.job_sql import JobPlan
from streaming.metrics import StreamMetrics
from streaming.partitioning import entity_partition, owned_partitions
from streaming.redis_sink import RedisSink
from streaming.shared_clock import SharedClock
from streaming.tile_codec import TileDecoder
from streaming.windows import ViewLayout, WindowState

log = logging.getLogger(__name__)

REDIS_CHECK_S = 1.0


class _View:
    def __init__(self, job, metrics: StreamMetrics):
        self.compiled = job.compiled
        self.layout = ViewLayout(job.compiled)
        self.state = WindowState(self.layout)
        self.decoder = TileDecoder(self.layout)
        self.counters = metrics.views[job.view.name]


def latest_versions(messages: list) -> list:
    """The newest version of each tile in a batch, in log order. A batch taken while behind holds several versions
    of the busy tiles (one per mini-batch); each version carries all of its tile's events, so the newest replaces
    the others and decoding and applying them is wasted work (about half of a full batch). After a restart a
    replayed, older version may come last: it is applied only if newer than the one held, and the replay brings
    the tile back to the version it passed over. Tombstones are left out: no tile is ever deleted by one."""
    seen: set = set()
    out = []
    for message in reversed(messages):
        key = (message.topic(), message.key())
        if message.value() is not None and key not in seen:
            seen.add(key)
            out.append(message)
    out.reverse()
    return out


def write_rows(sink: RedisSink, view_layout: ViewLayout, rows: list, stamps: list[int],
               served_ms: int) -> list[tuple[int, int]]:
    """Guarded writes of `rows` at `stamps`; a row Redis refuses for a `_ts` it holds at or before the served
    boundary (an entity written before it was forgotten, then seen again with an earlier change) is sent again at
    that `_ts` at once. Returns the rows still refused, (position, Redis's `_ts`): those whose stored `_ts` lies
    ahead of the served boundary (materialization), to write once the clock is there."""
    refused = sink.send(sink.commands(view_layout, rows, stamps))
    now = [(position, stored) for position, stored in refused if stored <= served_ms]
    if not now:
        return refused
    again = sink.send(sink.commands(view_layout, [rows[p] for p, _ in now], [stored for _, stored in now]))
    return [r for r in refused if r[1] > served_ms] + [(now[i][0], stored) for i, stored in again]


class WindowWriter:
    """Follows its partitions of the tile topics of `plan` (writer `writer` of `writers`) and keeps Redis equal to
    the window values they imply; `clock` shares the views' clocks with the other writers (None: the only one)."""

    def __init__(self, plan: JobPlan, sink: RedisSink, metrics: StreamMetrics, settings: StreamSettings,
                 writer: int = 0, writers: int = 1, clock: Optional[SharedClock] = None):
        self.sink = sink
        self.metrics = metrics
        self.batch = settings.consume_batch
        self.coalesce_s = settings.coalesce_ms / 1000
        self._flushed = time.monotonic()
        self._clocks: list[int] = []
        self._redis_run_id = self.sink.run_id()
        self._redis_checked = time.monotonic()
        self.views = {job.tiles_topic: _View(job, metrics) for job in plan.views}
        self.cutovers = dict(plan.cutovers)
        self.writer, self.writers, self.clock = writer, writers, clock
        common = {"bootstrap.servers": plan.bootstrap_servers, "enable.auto.commit": False,
                  "group.id": f"featurectl-writer-{plan.fingerprint}", "fetch.wait.max.ms": 10}
        self.tiles = Consumer({**common, "isolation.level": "read_uncommitted"})
        self.tiles.assign(self._partitions(list(self.views)))
        self.dead = Consumer({**common, "isolation.level": "read_committed"})
        self.dead.assign(self._partitions([s.dead_letter_topic for s in plan.sources]))

    def _partitions(self, topics: list[str]) -> list[TopicPartition]:
        """This writer's partitions of `topics`, from their beginning."""
        metadata = self.tiles.list_topics(timeout=30)
        return [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics
                for p in owned_partitions(len(metadata.topics[t].partitions), self.writer, self.writers)]

    def _owns(self, topic: str) -> Callable[[tuple], bool]:
        """Whether an entity's tiles are in this writer's partitions of `topic`."""
        count = len(self.tiles.list_topics(topic, timeout=30).topics[topic].partitions)
        mine = set(owned_partitions(count, self.writer, self.writers))
        return lambda key: entity_partition(key, count) in mine

    def assignment(self) -> list[str]:
        """`topic[partition]` of every tile partition this writer reads."""
        return [f"{tp.topic}[{tp.partition}]" for tp in self.tiles.assignment()]

    def load_history(self, folder: Storage) -> dict:
        """Seed every view's windows with its history tiles (`<folder>/<view>/`, tiles before its source's
        cutover); returns what was loaded and how long it took."""
        began = time.monotonic()
        loaded = {}
        for topic, view in self.views.items():
            cutover = self.cutovers.get(view.compiled.source)
            if cutover is None:
                continue
            owns = self._owns(topic)
            rows = [row for row in read_tiles(folder.child(view.compiled.view), view.compiled) if owns(row[0])]
            loaded[view.layout.name] = {"tiles": len(rows), "entities": view.state.load_history(rows, cutover)}
        seconds = time.monotonic() - began
        if loaded:
            log.info("history loaded in %.1f s: %s", seconds, ", ".join(
                f"{name}: {n['entities']} entities, {n['tiles']} tiles" for name, n in loaded.items()))
        return {"views": loaded, "load_s": round(seconds, 2)}

    def catch_up(self, timeout_s: float = 600.0) -> int:
        """Read every tile update written so far without writing Redis (`write_all` then writes them)."""
        ends = {(tp.topic, tp.partition): self.tiles.get_watermark_offsets(tp, timeout=30)[1]
                for tp in self.tiles.assignment()}
        done = {k: 0 for k in ends}
        deadline = time.monotonic() + timeout_s
        applied = 0
        while any(done[k] < ends[k] for k in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the tile topics took over {timeout_s:.0f}s; is Kafka up?")
            messages = self._take(1.0)
            for message in messages:
                done[(message.topic(), message.partition())] = message.offset() + 1
            for message in latest_versions(messages):
                applied += bool(self._apply(message)[0])
        self._share_clock()
        log.info("caught up on %d tile updates (%s)", applied, ", ".join(
            f"{v.layout.name}: {len(v.state.entities)} entities" for v in self.views.values()))
        return applied

    def write_all(self) -> None:
        """Write every entity held, each at its last change (once every writer has caught up: the clocks, which
        slide every writer's windows, are theirs too)."""
        self._share_clock()
        for view in self.views.values():
            view.state.dirty = set(view.state.entities)
            view.counters.history.clear()
        self._flush([])

    def _share_clock(self) -> None:
        """Publish this writer's clock of each view and follow the greatest over all writers."""
        if self.clock is None:
            return
        for i, view in enumerate(self.views.values()):
            self.clock.publish(i, view.state.head_ms)
            view.state.follow(self.clock.head(i))

    def step(self, timeout_s: float = 0.1) -> int:
        """Take one batch of tile updates and write what changed; returns how many updates it took.

        A full batch means more is waiting: the writer is behind, and it holds the write back (up to
        `coalesce_s`) so that several updates of an entity become one write."""
        messages = self._take(timeout_s)
        for message in latest_versions(messages):
            added, clock = self._apply(message)
            if added:
                self._clocks.append(clock)
        self._share_clock()
        behind = len(messages) == self.batch
        if time.monotonic() - self._redis_checked >= REDIS_CHECK_S:
            self._rewrite_if_redis_restarted()
        if not behind or time.monotonic() - self._flushed >= self.coalesce_s:
            self._flush(self._clocks)
            self._clocks = []
            self._count_dead_letters()
        return len(messages)

    def _rewrite_if_redis_restarted(self) -> None:
        """Mark every entity for writing when Redis is another process than at the last check."""
        self._redis_checked = time.monotonic()
        run_id = self.sink.run_id()  # None while Redis is away: the next check, or the sink's retries, see it back
        if run_id is None:
            return
        if self._redis_run_id is not None and run_id != self._redis_run_id:
            for view in self.views.values():
                view.state.dirty = set(view.state.entities)
            log.warning("Redis restarted or a cluster master failed over (run id %s -> %s): writing every entity again",
                        self._redis_run_id, run_id)
        self._redis_run_id = run_id

    def _take(self, timeout_s: float) -> list:
        """A batch of tile messages; transient Kafka errors are logged (the client retries), fatal ones raised."""
        out = []
        for message in self.tiles.consume(num_messages=self.batch, timeout=timeout_s):
            error = message.error()
            if error is None:
                out.append(message)
            elif error.fatal():
                raise KafkaException(error)
            else:
                log.warning("reading the tile topics: %s", error)
        return out

    def _apply(self, message) -> tuple[int, int]:
        """(events the update adds, greatest event time in its tile)."""
        view = self.views[message.topic()]
        row = view.decoder.decode(message.value())
        if row is None:
            return 0, 0
        added = view.state.apply(*row)
        if added:
            view.counters.events += added
            view.counters.tiles_applied += 1
        else:
            view.counters.tiles_stale += 1
        return added, row[2][view.layout.clock_column]

    def _flush(self, clocks: list[int]) -> None:
        """Write every changed entity, each at its last change (`streaming.windows`), then record the clocks of the
        views written as their newest event times (one command per flush, `redis_store.freshness`)."""
        written = {}
        for view in self.views.values():
            dirty = view.state.take_dirty()
            if not dirty:
                continue
            rows = [(key, values) for key, values, _ in dirty]
            refused = write_rows(self.sink, view.layout, rows, [ts for _, _, ts in dirty], view.state.served_ms)
            view.counters.writes += len(rows) - len(refused)
            view.counters.refused += len(refused)
            for position, stored_ms in refused:
                view.state.write_again_at(rows[position][0], stored_ms)
            if len(refused) < len(rows):
                written[view.layout.name] = view.state.head_ms
        if written:
            self.sink.record_newest(written)
        self._flushed = time.monotonic()
        if clocks:
            self.metrics.record_lags(int(time.time() * 1000), clocks)

    def _count_dead_letters(self) -> None:
        for message in self.dead.consume(num_messages=1000, timeout=0):
            if message.error() or message.value() is None:
                continue
            reason = json.loads(message.value()).get("reason", "unknown")
            self.metrics.dead_letters[reason] = self.metrics.dead_letters.get(reason, 0) + 1

    def tiles_behind(self) -> int:
        """Tile updates written to the topics and not read yet (the topics' ends asked of the broker): above zero
        and growing, the writer is behind."""
        behind = 0
        for tp in self.tiles.position(self.tiles.assignment()):
            high = self.tiles.get_watermark_offsets(tp, timeout=5)[1]
            behind += max(0, high - max(tp.offset, 0))
        return behind

    def unwritten(self) -> int:
        """Entities whose new values are not in Redis yet."""
        return sum(len(view.state.dirty) for view in self.views.values())

    def held(self) -> dict[str, dict]:
        """Per view: entities and tiles in memory, and the clock (greatest event time, ms)."""
        return {v.layout.name: {"entities": len(v.state.entities), "tiles": v.state.tiles_held(),
                                     "clock_ms": v.state.head_ms} for v in self.views.values()}

    def close(self) -> None:
        self.tiles.close()
        self.dead.close()
        self.sink.close()
