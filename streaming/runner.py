"""Runs one stream until told to stop: the Flink job (tiles and dead letters) and the window writers that turn
tiles into Redis values (`parallelism` processes, `streaming.writer_pool`, watched from here); a status file every
second; a clean stop that leaves a checkpoint.

One job per set of views: its folder `<state>/stream/<job>/` holds a lock (one runner at a time), the status
file, Flink's log, the checkpoints, the generation (`streaming.bootstrap`) and its history tiles. Killed at any
point, the next run resumes from the newest checkpoint; with none, it starts a new generation from the history.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from confluent_kafka import KafkaException

from common.errors import FeaturectlError
from common.instants import from_epoch_ms
from common.storage import Storage
from dsl.compile_flink import SourceSettings, compile_view
from dsl.compile_stream_source import MAX_AHEAD_MS
from dsl.feature_view import FeatureView
from redis_store.errors import RedisUnavailableError
from redis_store.settings import RedisSettings
from streaming.bootstrap import Generation, History, history_folder, prune_history
from streaming.config import StreamSettings
from streaming.flink_job import FlinkJob, flink_options, latest_checkpoint, prune_checkpoints
from streaming.job_sql import JobPlan, job_name, plan_job
from streaming.metrics import StreamMetrics
from streaming.orphans import stop_orphans
from streaming.partitioning import require_partitioner
from streaming.redis_sink import RedisSink
from streaming.status import stream_root, write_status
from streaming.topics import SourceLag, ensure_topics
from streaming.writer_pool import WriterPool, WriterSpec

log = logging.getLogger(__name__)

JOB_CHECK_INTERVAL_S = 2.0
LOCK_ATTEMPTS = 5  # 50 ms apart


class StreamError(FeaturectlError, RuntimeError):
    """The stream cannot start or keep running; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    """Where a stream runs: the project, its Redis, its Kafka, the state folder, and optionally a Flink cluster
    (`jobmanager`: its REST address); `key_ttl_s` is Feast's `online_store.key_ttl_seconds` (0: keys never expire);
    `storage`: where the Flink job's checkpoints and the history tiles go (`common.storage`):
    `<storage>/streams/<job>/`, else the stream's folder under `state_dir`."""

    project: str
    redis: RedisSettings
    source_settings: SourceSettings
    state_dir: Path
    jobmanager: Optional[str] = None
    key_ttl_s: int = 0
    storage: Optional[Storage] = None  # shared storage for checkpoints and history tiles; None: the state folder


def start_ms(target: Target, views: Sequence[FeatureView], generation: Generation) -> int:
    """Where a new generation's job starts reading its topics (by record timestamp): the hour an event time may
    lead its record's timestamp before the earliest event that can count, which is the later of one lookback
    before the start (every window filled) and, for a source with history, its cutover; the earliest over the
    job's sources."""
    starts = []
    for view in views:
        compiled = compile_view(view, target.source_settings)
        start = generation.started_ms - compiled.lookback_ms
        cutover = generation.cutovers.get(view.source.name)
        starts.append((start if cutover is None else max(start, cutover)) - MAX_AHEAD_MS)
    return max(min(starts), 0)


def plan_for(target: Target, views: Sequence[FeatureView], all_views: Sequence[FeatureView],
             settings: StreamSettings, generation: Generation) -> JobPlan:
    startup = {"scan.startup.mode": "timestamp",
               "scan.startup.timestamp-millis": str(start_ms(target, views, generation))}
    placed = dataclasses.replace(target.source_settings, cutovers=dict(generation.cutovers))
    return plan_job(target.project, views, all_views, placed, startup, int(settings.state_ttl_margin_s * 1000),
                    generation.started_ms)


def _take_lock(fd: int) -> bool:
    """Whether the exclusive lock was taken. A reader asking `is_running` holds a shared lock for microseconds
    (the feature servers ask every second), so a refusal is asked again a few times before it counts."""
    for attempt in range(LOCK_ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt < LOCK_ATTEMPTS - 1:
                time.sleep(0.05)
    return False


@contextmanager
def job_lock(home: Path) -> Iterator[None]:
    """Holds `<home>/lock` while the stream runs; the kernel drops it when the process dies, however it dies."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _take_lock(fd):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise StreamError(f"stream `{home.name}` is already running (pid {holder}); stop it first, "
                              f"or see `featurectl stream --status`")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def _iso(ms: Optional[float]) -> Optional[str]:
    """ISO 8601 in UTC; an instant outside the calendar (an event time of year 300,000,000) is shown as its ms,
    never an error that would stop the stream."""
    if ms is None:
        return None
    try:
        return from_epoch_ms(ms).isoformat()
    except (ValueError, OverflowError, OSError):
        return f"{ms:.0f} ms since the epoch"


class StreamRunner:
    """One run of one stream; `run` blocks until `stop` is set or the job fails."""

    def __init__(self, target: Target, views: Sequence[FeatureView], all_views: Sequence[FeatureView],
                 settings: StreamSettings, history: Optional[History] = None, reset: bool = False):
        """`history`: the batch side a new generation starts its windows from (None: Kafka alone); `reset`
        starts a new generation even when the last one could be resumed."""
        if not views:
            raise StreamError("no feature views to stream: define views whose source has a kafka_topic, "
                              "or name them with --view")
        self.target = target
        self.settings = settings
        self.history = history
        self.home = stream_root(target.state_dir) / job_name(target.project, views)
        self.shared = (target.storage.child("streams", self.home.name) if target.storage is not None
                       else Storage.local(self.home))
        self.generation, self.plan = self._resume(views, all_views, reset)
        self.fresh = self.plan is None
        if self.fresh:
            now = int(time.time() * 1000)
            sources = list({v.source.name: v.source for v in views}.values())
            generation = Generation(now, history.cutovers(sources, now) if history is not None else {})
            self.plan = plan_for(target, views, all_views, settings, generation)
            self.generation = dataclasses.replace(generation, fingerprint=self.plan.fingerprint)
        self.checkpoints = self.shared.child("checkpoints", self.plan.fingerprint)
        self.metrics = StreamMetrics([v.view.name for v in self.plan.views],
                                     {v.view.name: v.view.source.name for v in self.plan.views})
        self.started = time.time()
        self.state = "starting"
        self.job: Optional[FlinkJob] = None
        self.writers: Optional[WriterPool] = None
        self.restored_from: Optional[Path] = None
        self.bootstrap: Optional[dict] = None
        self.flink_status: Optional[str] = None
        self.source_lag: Optional[SourceLag] = None
        self.orphans_stopped: list[str] = []

    def _resume(self, views: Sequence[FeatureView], all_views: Sequence[FeatureView],
                reset: bool) -> tuple[Optional[Generation], Optional[JobPlan]]:
        """The saved generation and its plan when a checkpoint of it remains, else (None, None)."""
        saved = None if reset else Generation.load(self.home)
        if saved is None:
            return None, None
        plan = plan_for(self.target, views, all_views, self.settings, saved)
        if plan.fingerprint != saved.fingerprint or not latest_checkpoint(
                self.shared.child("checkpoints", plan.fingerprint)):
            return None, None
        return saved, plan

    def run(self, stop: threading.Event) -> None:
        with job_lock(self.home):
            self.checkpoints.make()
            self._write_status()
            try:
                self._start()
                self._loop(stop)
            except BaseException:
                self.state = "failed"
                raise
            finally:
                self._stop()

    def _start(self) -> None:
        if self.target.jobmanager:  # before anything reads the checkpoints an orphan would go on deleting
            self.orphans_stopped = stop_orphans(self.target.jobmanager, self.plan, self.checkpoints)
        try:
            RedisSink(self.target.redis, self.target.project, self.target.key_ttl_s).close()
        except RedisUnavailableError as exc:
            raise StreamError(f"{exc}; the stream needs Redis up at its start") from exc
        require_partitioner()
        ensure_topics(self.plan, self.settings)
        self.source_lag = SourceLag(self.plan)
        history = history_folder(self.shared, self.plan.fingerprint)
        exported_s = None
        if self.fresh or (self.plan.cutovers and not history.exists()):
            exported_s = self._start_generation(history)
        spec = WriterSpec(self.plan, self.settings, self.target.redis, self.target.project, self.target.key_ttl_s,
                          history)
        self.writers = WriterPool(spec, self.settings.parallelism, self.metrics)
        self.state = "catching up"
        self._write_status()
        self.bootstrap = {**self.writers.start(), "export_s": exported_s}
        self.restored_from = latest_checkpoint(self.checkpoints)
        if self.restored_from:
            log.info("resuming from checkpoint %s", self.restored_from)
        options = flink_options(self.plan, self.settings, self.checkpoints, self.restored_from)
        self.job = FlinkJob.start(self.plan, options, self.home / "flink-log", self.target.jobmanager,
                                  self.settings.parallelism, self.target.storage)
        self.state = "running"

    def _start_generation(self, history: Storage) -> Optional[float]:
        """Export the history tiles of a new generation (when its sources have history), then record it; returns
        how long the export took."""
        history.delete()
        seconds = None
        if self.plan.cutovers:
            if self.history is None:
                raise StreamError(f"stream `{self.plan.name}` starts from history but was given none to read; "
                                  "run it with `featurectl stream`")
            self.state = "exporting history"
            self._write_status()
            began = time.monotonic()
            self.history.export([(v.view, v.compiled) for v in self.plan.views], self.plan.cutovers, history)
            seconds = round(time.monotonic() - began, 2)
            log.info("exported the history tiles before the cutovers in %.1f s", seconds)
        self.generation.save(self.home)
        prune_history(self.shared, self.plan.fingerprint)
        return seconds

    def _loop(self, stop: threading.Event) -> None:
        next_status = next_check = 0.0
        while not stop.wait(0.05):
            self.writers.check()
            now = time.monotonic()
            if now >= next_check:
                self.flink_status = self.job.check()
                prune_checkpoints(self.checkpoints, self.job.job_id)
                next_check = now + JOB_CHECK_INTERVAL_S
            if now >= next_status:
                self._write_status()
                next_status = now + self.settings.status_interval_s

    def _stop(self) -> None:
        failed = self.state == "failed"
        if not failed:
            self.state = "stopping"
            self._write_status()
        if self.job is not None:
            self.job.cancel()
            self.flink_status = "CANCELED"
        if self.writers is not None:
            self.writers.stop()
        if self.source_lag is not None:
            self.source_lag.close()
            self.source_lag = None
        if not failed:
            self.state = "stopped"
        self._write_status()

    def _progress(self) -> dict:
        """How far the stream is from having applied every event produced so far: the source offsets its last
        checkpoint committed against the topics' ends, then (asked after them) the tile updates not yet read and
        the entities not yet written."""
        offsets = self.source_lag.offsets()
        source_events = sum(end - applied for _, _, applied, end in offsets)
        answered = self.writers.reports()
        writers = self.writers.progress()
        return {"caught_up": source_events == 0 and answered and writers["clocks_agree"]
                and writers["tile_updates"] == 0 and writers["unwritten_entities"] == 0,
                "source_events": source_events, "tile_updates": writers["tile_updates"],
                "unwritten_entities": writers["unwritten_entities"], "writers_answered": answered,
                "offsets": [{"topic": t, "partition": p, "applied": a, "end": e} for t, p, a, e in offsets]}

    def _lag(self) -> Optional[dict]:
        """The progress while running (the writers' figures summed into the metrics meanwhile), else None."""
        if self.writers is None or self.source_lag is None or self.state != "running":
            return None
        try:
            return self._progress()
        except KafkaException as exc:  # Kafka away for a moment: the status goes out without the lag
            log.warning("measuring the lag: %s", exc)
            self.writers.reports()
            return None

    def _checkpoint(self) -> Optional[dict]:
        latest = latest_checkpoint(self.checkpoints)
        if latest is None:
            return None
        return {"path": latest.display, "at": _iso(latest.mtime_ns("_metadata") / 1e6)}

    def _write_status(self) -> None:
        lag = self._lag()
        status = {
            "job": self.plan.name, "fingerprint": self.plan.fingerprint, "pid": os.getpid(), "state": self.state,
            "project": self.target.project, "started_at": _iso(self.started * 1000),
            "updated_at": _iso(time.time() * 1000),
            "flink_job_id": self.job.job_id if self.job else None, "flink_status": self.flink_status,
            "restored_from": str(self.restored_from) if self.restored_from else None,
            "jobmanager": self.target.jobmanager, "orphans_stopped": self.orphans_stopped,
            "checkpoint": self._checkpoint(),
            "topics": {"tiles": [v.tiles_topic for v in self.plan.views],
                       "dead_letters": [s.dead_letter_topic for s in self.plan.sources]},
            "consumer_groups": self.plan.consumer_groups,
            "parallelism": self.settings.parallelism,
            "writers": self.writers.health() if self.writers is not None else [],
            **self.metrics.snapshot(),
        }
        status["generation"] = {"started_at": _iso(self.generation.started_ms),
                                "cutovers": {s: _iso(ms) for s, ms in self.plan.cutovers.items()},
                                "cutovers_ms": dict(self.plan.cutovers), "history": self.bootstrap}
        if lag is not None:
            status["lag"] = lag
        if self.writers is not None:
            for view, held in self.writers.held().items():
                status["views"][view].update(entities=held["entities"], tiles=held["tiles"],
                                             head_event_time=_iso(held["clock_ms"]))
        write_status(self.home, status)
