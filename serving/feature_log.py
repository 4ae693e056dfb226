"""Feature logging in the server: the vectors served for services with `logging`, handed to a writer process
(`serving.feature_log_writer`) that writes them as Parquet in Feast's feature-logging layout.

The request path decides whether a request is sampled and appends the bytes of the answer it sends (Feast's JSON
response body, however it was written: the one-row fast path of `serving.row_answer` included) to a queue: one
tuple per answer, no parsing, no Python per value. The queue is bounded in rows and never waits: an answer that
would pass the bound is dropped and counted. The bound counts a row until the writer process has parsed it, so the
rows on their way (here, in the pipe, in the writer's queue) are bounded together.

The first answer queued starts a courier thread and the writer process (a worker that logs nothing runs neither).
The courier takes the whole queue every `SEND_S` and sends it to the writer process as one message through a
non-blocking pipe, and reads the writer's reports (rows parsed, written, failed) into the server's counters. Its
work per batch is one pickle of the answers' bytes and one write, nothing per value, so it holds the GIL, which the
event loop needs, briefly: the parsing, Arrow and Parquet run in the other process, on another core when there is
one.

A writer process that dies loses the rows it held: they are counted as `failed`, a log line says so, and a new
writer is started (`MAX_RESTARTS` times; then logging stops in this worker, with a log line, and the rows of
logged services are counted as `dropped`). Requests are answered as before throughout.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import random
import secrets
import select
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Optional

from common.config import FeatureLogSettings
from serving.catalog import LogSpec
from serving.feature_log_pipe import FrameReader, frame
from serving.stats import ServerStats

logger = logging.getLogger(__name__)

SEND_S = 0.02  # how often the courier hands the queue to the writer process
MAX_RESTARTS = 3  # writer processes started after the first one died, per worker
PIPE_BYTES = 1 << 20  # asked of the kernel for the pipe to the writer (Linux's default most: 1 MiB)
_SPAN = 1 << 32  # deterministic sampling: the CRC-32 of a request id against sample_rate * 2^32
_ROOT = Path(__file__).resolve().parents[1]  # the folder holding `serving`: the writer imports the same code

Queued = tuple[LogSpec, bytes, int, str, int, bytes]  # spec, answer as sent, rows, request id, log time (µs),
# request data (JSON; b"" for a service without on-demand request data)


class _WriterProcess:
    """One writer process, the bytes not yet written to it, and what it was sent and reported, per service."""

    def __init__(self, settings: FeatureLogSettings, token: str):
        path = os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving.feature_log_writer", settings.model_dump_json(), token],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path})
        self.to_writer = self.process.stdin.fileno()  # type: ignore[union-attr]
        self.from_writer = self.process.stdout.fileno()  # type: ignore[union-attr]
        os.set_blocking(self.to_writer, False)
        try:
            fcntl.fcntl(self.to_writer, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:  # above the host's /proc/sys/fs/pipe-max-size: the default 64 KiB works, in more writes
            pass
        self.unsent = bytearray()
        self.keys: dict[LogSpec, int] = {}  # the services it was told about, and their key in its messages
        self.sent: dict[str, int] = {}  # rows per service
        self.taken = 0  # rows it has parsed (its last report)
        self.counts: dict[str, tuple[int, int, int, int]] = {}  # written, failed, files, bytes per service
        self._reports = FrameReader()

    def send(self, queued: list[Queued]) -> None:
        """Frame a batch of answers (preceded by the services the writer does not know yet)."""
        by_spec: dict[int, int] = {}  # id(spec) -> key, for this batch: a spec is hashed once per batch
        answers, rows_by_service = [], {}
        for spec, answer, rows, request_id, log_us, request_data in queued:
            key = by_spec.get(id(spec))
            if key is None:
                key = by_spec[id(spec)] = self._key(spec)
            answers.append((key, answer, rows, request_id, log_us, request_data))
            rows_by_service[spec.service] = rows_by_service.get(spec.service, 0) + rows
        self.unsent += frame(("answers", sum(rows_by_service.values()), answers))
        for service, count in rows_by_service.items():
            self.sent[service] = self.sent.get(service, 0) + count

    def _key(self, spec: LogSpec) -> int:
        key = self.keys.get(spec)
        if key is None:
            key = self.keys[spec] = len(self.keys)
            self.unsent += frame(("service", key, spec.service, spec.path, spec.schema, spec.features,
                                  spec.request_fields))
        return key

    def exchange(self, wait_s: float) -> Optional[list[tuple]]:
        """Write what the pipe takes and read the writer's reports, waiting up to `wait_s` for either; None when
        the writer is gone."""
        writable = [self.to_writer] if self.unsent else []
        try:
            readable, writable, _ = select.select([self.from_writer], writable, [], wait_s)
            if writable:
                del self.unsent[:os.write(self.to_writer, self.unsent)]
            if readable:
                data = os.read(self.from_writer, 1 << 16)
                return self._reports.feed(data) if data else None
        except BlockingIOError:  # the pipe filled between select and write
            pass
        except OSError:  # BrokenPipeError: it exited
            return None
        return []

    def finish(self, timeout_s: float) -> tuple[list[tuple], bool]:
        """Send everything, close its input (it writes its files and exits) and read its reports to the end: the
        reports, and False when it died or did not finish within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        reports: list[tuple] = []
        while self.unsent and time.monotonic() < deadline:
            got = self.exchange(0.1)
            if got is None:
                return reports, False
            reports += got
        self.process.stdin.close()  # type: ignore[union-attr]
        while time.monotonic() < deadline:
            got = self.exchange(0.1)
            if got is None:
                return reports, self.process.wait() == 0
            reports += got
        self.process.kill()
        return reports, False


class FeatureLogger:
    """One per server worker: `offer` on the event loop, `start` and `close` at start-up and shutdown."""

    def __init__(self, settings: FeatureLogSettings, stats: ServerStats):
        self.settings = settings
        self.stats = stats
        self._lock = threading.Lock()  # the queue and the bound: the event loop appends, the courier takes
        self._queued: list[Queued] = []
        self._open_rows = 0  # accepted and not yet parsed by the writer: what the bound counts
        self._token = f"{os.getpid()}-{secrets.token_hex(4)}"  # unique per worker: generated ids
        self._ids = itertools.count()
        self._off = False  # the writer died too often: nothing more is logged
        self._stopping = threading.Event()
        self._started = False  # the server runs: the first answer queued starts the courier and the writer
        self._thread: Optional[threading.Thread] = None
        self._restarts = 0
        self._finish_s = 60.0

    def offer(self, spec: LogSpec, answer: bytes, rows: int, request_id: Optional[str],
              request_data: bytes = b"") -> Optional[str]:
        """Queue an answer (Feast's JSON response body of `rows` entity rows, as sent, and `request_data`, the
        JSON object of the request's values of `spec.request_fields`, which the answer does not echo) when its
        request is sampled: deterministically by `request_id` when the client gave one (the same id is logged by
        every worker or by none), at random otherwise. Returns the request id logged, None when it is not logged."""
        rate = spec.sample_rate
        if request_id is None:
            if rate < 1.0 and random.random() >= rate:
                return None
            request_id = f"{self._token}-{next(self._ids)}"
        elif rate < 1.0 and zlib.crc32(request_id.encode()) >= rate * _SPAN:
            return None
        counts = self.stats.log_counts(spec.service)
        with self._lock:
            held = self._open_rows
            if self._off or not rows or held + rows > self.settings.queue_rows:
                counts.dropped += rows
                return None
            self._queued.append((spec, answer, rows, request_id, time.time_ns() // 1000, request_data))
            self._open_rows = held + rows
        counts.logged += rows
        self.stats.log_queued = held + rows
        if self._thread is None and self._started:
            self._launch()
        return request_id

    def start(self) -> None:
        """From now on, the first answer queued starts the writer process: a server with no logged service, or
        whose logged services are not requested, runs none."""
        self._started = True
        if self._queued:
            self._launch()

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._run, name="feature-log-courier", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Hand over everything queued (the server has stopped serving), let the writer write it and stop."""
        if self._thread is None:
            return
        self._finish_s = timeout_s
        self._stopping.set()
        self._thread.join(timeout_s + 1)
        if self._thread.is_alive():
            logger.error("feature log writer still busy after %.0f s at shutdown: rows not yet written are lost",
                         timeout_s)

    def _take(self) -> list[Queued]:
        with self._lock:
            taken, self._queued = self._queued, []
        return taken

    def _run(self) -> None:
        writer = None
        try:
            writer = self._new_writer()
            while writer is not None:
                stopping = self._stopping.is_set()
                taken = self._take()
                if taken:
                    writer.send(taken)
                if stopping:
                    self._finished(writer)
                    return
                reports = writer.exchange(SEND_S)
                if reports is None:
                    writer = self._replaced(writer)
                elif reports:
                    self._account(writer, reports)
        except Exception:  # a bug here must not go unnoticed, nor reach the requests
            logger.exception("feature log courier failed; feature logging is off in this worker")
            if writer is not None:
                self._lost(writer, "was stopped")
            self._turn_off()

    def _finished(self, writer: _WriterProcess) -> None:
        reports, finished = writer.finish(self._finish_s)
        if reports:
            self._account(writer, reports)
        if not finished:
            self._lost(writer, "did not finish its last write")

    def _new_writer(self) -> Optional[_WriterProcess]:
        try:
            return _WriterProcess(self.settings, f"{self._token}-{self._restarts}")
        except OSError as exc:
            logger.error("feature log writer process could not start (%s); feature logging is off in this worker",
                         exc)
            self._turn_off()
            return None

    def _account(self, writer: _WriterProcess, reports: list[tuple]) -> None:
        """The writer's latest report into the counters: what changed since the one before."""
        _, taken, buffered, counts = reports[-1]
        for service, now in counts.items():
            before = writer.counts.get(service, (0, 0, 0, 0))
            mine = self.stats.log_counts(service)
            mine.written += now[0] - before[0]
            mine.failed += now[1] - before[1]
            mine.files += now[2] - before[2]
            mine.bytes += now[3] - before[3]
        writer.counts = counts
        with self._lock:
            self._open_rows -= taken - writer.taken
            self.stats.log_queued = self._open_rows
        writer.taken = taken
        self.stats.log_buffered = buffered

    def _replaced(self, writer: _WriterProcess) -> Optional[_WriterProcess]:
        self._lost(writer, f"exited with code {writer.process.wait()}")
        if self._restarts >= MAX_RESTARTS:
            logger.error("feature log writer died %d times; feature logging is off in this worker until it "
                         "restarts (logged services are served, their rows counted as dropped)", self._restarts + 1)
            self._turn_off()
            return None
        self._restarts += 1
        return self._new_writer()

    def _lost(self, writer: _WriterProcess, what: str) -> None:
        """Count the rows a writer was sent and neither wrote nor reported failed; release them from the bound."""
        writer.process.kill()
        writer.process.wait()
        lost = 0
        for service, sent in writer.sent.items():
            written, failed = writer.counts.get(service, (0, 0, 0, 0))[:2]
            self.stats.log_counts(service).failed += sent - written - failed
            lost += sent - written - failed
        with self._lock:
            self._open_rows -= sum(writer.sent.values()) - writer.taken
            self.stats.log_queued = self._open_rows
        self.stats.log_buffered = 0
        logger.error("feature log writer process %d %s: %d logged rows not yet written are lost (counted as failed)",
                     writer.process.pid, what, lost)

    def _turn_off(self) -> None:
        with self._lock:
            self._off = True
            taken, self._queued = self._queued, []
            self._open_rows = 0
        for spec, _, rows, _, _ in taken:
            self.stats.log_counts(spec.service).failed += rows
        self.stats.log_queued = 0
