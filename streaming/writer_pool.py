"""The window writers of one stream: `parallelism` processes (Python threads would share one GIL), each owning a
disjoint share of the tile partitions (`streaming.writer`), started and watched by the stream's process.

Start: every writer loads its entities' history tiles and reads its partitions to their end without writing
Redis; once all have, each writes all of its entities (their windows slid to the views' shared clocks, each at
its own last change), and only then does the Flink
job start, as with one writer. A writer process that dies (a crash, SIGKILL, out of memory) is restarted: it reads
its partitions back from the beginning before it writes again, so its entities' values never move back and end
exact, as after a restart of the stream; the other writers keep going meanwhile. A writer that dies more than
`MAX_RESTARTS` times in `RESTART_WINDOW_S` stops the stream with its last error. A writer whose parent dies sees
its pipe close and exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Optional

from confluent_kafka import KafkaException

from common.errors import FeaturectlError
from common.storage import Storage
from redis_store.settings import RedisSettings
from streaming.config import StreamSettings
from streaming.job_sql import JobPlan
from streaming.metrics import StreamMetrics
from streaming.redis_sink import RedisSink
from streaming.shared_clock import NONE, SharedClock
from streaming.writer import WindowWriter

log = logging.getLogger(__name__)

MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
START_TIMEOUT_S = 900.0
REPORT_TIMEOUT_S = 5.0


class WriterError(FeaturectlError, RuntimeError):
    """A window writer process failed for good; the message says which, why, and what to do."""


@dataclass(frozen=True)
class WriterSpec:
    """What every writer process is started with (pickled into it)."""

    plan: JobPlan
    settings: StreamSettings
    redis: RedisSettings
    project: str
    key_ttl_s: int
    history: Storage


def writer_main(spec: WriterSpec, index: int, count: int, heads: Any, conn: Any) -> None:
    """One writer process: history and catch-up, then on "write" every entity, then its partitions until "stop"
    or until the stream's process is gone (its pipe closes). Asked "report", it answers its figures."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the stream's: it stops its writers itself
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s writer {index}: %(message)s")
    plan = spec.plan
    metrics = StreamMetrics([v.view.name for v in plan.views], {v.view.name: v.view.source.name for v in plan.views})
    writer = None
    try:
        writer = WindowWriter(plan, RedisSink(spec.redis, spec.project, spec.key_ttl_s), metrics, spec.settings,
                              index, count, SharedClock(heads, len(plan.views), index))
        loaded = writer.load_history(spec.history)
        began = time.monotonic()
        writer.catch_up()
        conn.send(("read", {"history": loaded, "catch_up_s": round(time.monotonic() - began, 2),
                            "partitions": writer.assignment()}))
        if conn.recv() != "write":
            return
        writer.write_all()
        conn.send(("ready", None))
        while True:
            writer.step()
            while conn.poll():
                if conn.recv() == "stop":
                    return
                try:
                    report = _report(writer, metrics)
                except KafkaException as exc:  # the broker away for a moment: no figures now, the stream goes on
                    log.warning("report: the tile topics' ends are unknown (%s)", exc)
                    continue
                conn.send(("report", report))
    except (EOFError, BrokenPipeError):
        return  # the stream's process is gone, and this writer's work with it
    except Exception as exc:
        log.exception("window writer %d failed", index)
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
        raise SystemExit(1) from exc
    finally:
        if writer is not None:
            writer.close()


def _report(writer: WindowWriter, metrics: StreamMetrics) -> dict:
    """This writer's figures; the broker is asked first, so a report it cannot answer keeps the lag samples."""
    behind = writer.tiles_behind()
    lags = list(metrics.lags)
    metrics.lags.clear()
    return {"totals": metrics.totals(), "lags": lags, "held": writer.held(), "tiles_behind": behind,
            "unwritten": writer.unwritten()}


@dataclass
class _Writer:
    index: int
    process: Any
    conn: Any
    state: str = "reading"  # reading -> read -> writing -> running
    info: dict = field(default_factory=dict)
    error: Optional[str] = None
    answered: bool = False


def _exit_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


class WriterPool:
    """`count` writer processes of one stream; `start`, then `check` often, `reports` once a status, `stop`."""

    def __init__(self, spec: WriterSpec, count: int, metrics: StreamMetrics):
        self.spec = spec
        self.count = count
        self.metrics = metrics
        self.ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds Kafka clients' threads
        self.heads = self.ctx.Array("q", [NONE] * SharedClock.slots(len(spec.plan.views), count), lock=False)
        self.writers: list[_Writer] = []
        self.last: list[Optional[dict]] = [None] * count  # each writer's latest report, kept across a restart
        self.restarts: list[list[float]] = [[] for _ in range(count)]
        self.running = False

    def _spawn(self, index: int) -> _Writer:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=writer_main, args=(self.spec, index, self.count, self.heads, child),
                                   name=f"featurectl-writer-{index}", daemon=True)
        process.start()
        child.close()
        return _Writer(index, process, parent)

    def start(self) -> dict:
        """Start every writer and return once all have written their entities; what they loaded and how long."""
        self.writers = [self._spawn(i) for i in range(self.count)]
        self._await("read", "to read their tile partitions")
        for writer in self.writers:
            writer.conn.send("write")
            writer.state = "writing"
        self._await("running", "to write their entities to Redis")
        self.running = True
        views: dict[str, dict] = {}
        for writer in self.writers:
            for name, n in writer.info["history"]["views"].items():
                total = views.setdefault(name, {"tiles": 0, "entities": 0})
                total["tiles"] += n["tiles"]
                total["entities"] += n["entities"]
        return {"views": views, "load_s": max(w.info["history"]["load_s"] for w in self.writers),
                "catch_up_s": max(w.info["catch_up_s"] for w in self.writers)}

    def _await(self, state: str, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while any(w.state != state for w in self.writers):
            if time.monotonic() > deadline:
                raise WriterError(f"the window writers took over {START_TIMEOUT_S:.0f}s {what}; is Kafka up?")
            self._receive(0.2)
            for writer in self.writers:
                if not writer.process.is_alive():
                    self._receive(0)  # its last words, if any
                    raise WriterError(f"window writer {writer.index} exited while starting "
                                      f"({writer.error or _exit_text(writer.process.exitcode)}); see its log above")

    def _receive(self, timeout_s: float) -> None:
        """Take every message that arrives within `timeout_s`."""
        conns = {w.conn: w for w in self.writers}
        for conn in wait(list(conns), timeout_s):
            writer = conns[conn]
            try:
                kind, body = conn.recv()
            except (EOFError, OSError):
                continue  # it died: `check` or `_await` sees it
            if kind == "read":
                writer.info, writer.state = body, "read"
                if self.running:  # a restarted writer: the others' clocks are already shared
                    conn.send("write")
                    writer.state = "writing"
            elif kind == "ready":
                writer.state = "running"
            elif kind == "report":
                self.last[writer.index], writer.answered = body, True
                self.metrics.lags.extend(body["lags"])
            elif kind == "error":
                writer.error = body

    def check(self) -> None:
        """Take the writers' messages; restart a writer that died (or stop the stream when it keeps dying)."""
        self._receive(0)
        for i, writer in enumerate(self.writers):
            if writer.process.is_alive():
                continue
            cause = writer.error or _exit_text(writer.process.exitcode)
            now = time.monotonic()
            self.restarts[i] = [t for t in self.restarts[i] if now - t < RESTART_WINDOW_S]
            if len(self.restarts[i]) >= MAX_RESTARTS:
                raise WriterError(f"window writer {i} ({', '.join(writer.info.get('partitions', []))}) died "
                                  f"{MAX_RESTARTS + 1} times in {RESTART_WINDOW_S / 60:.0f} minutes, last: {cause}; "
                                  "the stream stopped: fix the cause (see the writer's log above) and start it again")
            log.error("window writer %d (pid %s, %s) died: %s; restarting it: it reads its tile partitions back "
                      "before it writes Redis again", i, writer.process.pid,
                      ", ".join(writer.info.get("partitions", [])), cause)
            writer.conn.close()
            self.restarts[i].append(now)
            self.writers[i] = self._spawn(i)

    def reports(self) -> bool:
        """Ask every running writer for its figures and wait for them (up to `REPORT_TIMEOUT_S`); the metrics are
        then their sums. True when every writer is running and answered."""
        asked = [w for w in self.writers if w.state == "running" and w.process.is_alive()]
        for writer in asked:
            writer.answered = False
            try:
                writer.conn.send("report")
            except OSError:
                pass  # it died: `check` restarts it
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while any(not w.answered for w in asked) and time.monotonic() < deadline:
            self._receive(0.05)
        reports = [r for r in self.last if r is not None]
        if reports:
            self.metrics.sum_totals([r["totals"] for r in reports])
        return len(asked) == self.count and all(w.answered for w in asked)

    def progress(self) -> dict:
        """From the latest reports: tile updates not read, entities not written, and whether the writers' clocks
        agree (a writer that has not followed the others yet has values to slide)."""
        reports = [r for r in self.last if r is not None]
        clocks = {name: {r["held"][name]["clock_ms"] for r in reports} for name in self.metrics.views}
        return {"tile_updates": sum(r["tiles_behind"] for r in reports),
                "unwritten_entities": sum(r["unwritten"] for r in reports),
                "clocks_agree": all(len(c) <= 1 for c in clocks.values())}

    def held(self) -> dict[str, dict]:
        """Per view, over the writers: entities and tiles in memory, and the clock."""
        out: dict[str, dict] = {}
        for report in (r for r in self.last if r is not None):
            for name, held in report["held"].items():
                total = out.setdefault(name, {"entities": 0, "tiles": 0, "clock_ms": None})
                total["entities"] += held["entities"]
                total["tiles"] += held["tiles"]
                if held["clock_ms"] is not None and (total["clock_ms"] is None or held["clock_ms"] > total["clock_ms"]):
                    total["clock_ms"] = held["clock_ms"]
        return out

    def health(self) -> list[dict]:
        """Per writer: pid, state, partitions, restarts (for the status file)."""
        return [{"writer": w.index, "pid": w.process.pid, "alive": w.process.is_alive(), "state": w.state,
                 "partitions": w.info.get("partitions", []), "restarts": len(self.restarts[w.index])}
                for w in self.writers]

    def stop(self, timeout_s: float = 10.0) -> None:
        for writer in self.writers:
            try:
                writer.conn.send("stop")
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        for writer in self.writers:
            writer.process.join(max(0.0, deadline - time.monotonic()))
            if writer.process.is_alive():
                writer.process.kill()
                writer.process.join(5)
            writer.conn.close()
