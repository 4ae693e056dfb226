"""Feature logging in the server: the vectors served for services with `logging`, written as Parquet in Feast's
feature-logging layout (the schema of Feast's `FeatureServiceLoggingSource`, one folder per `__log_date`,
hive-style), so that Feast's file offline store reads them.

The request path decides whether a request is sampled and appends the bytes of the answer it sends (Feast's JSON
response body, however it was written: the one-row fast path of `serving.row_answer` included) to a queue: one
tuple per answer, no parsing, no Python per value. The queue is bounded in rows and never waits: an answer that
would pass the bound is dropped and counted. A writer thread takes the whole queue every `DRAIN_S`, parses the
answers back into columns (per result its values, statuses and event timestamps, as sent), turns them into Arrow,
and writes one file per service and date every `flush_s` or `flush_rows`, and at shutdown. Files are named by
worker and sequence and appear whole, by rename.

The writer shares the GIL with the event loop. It parses `PARSE_ANSWERS` answers at a time and makes one column
Arrow at a time, sleeping `PAUSE_S` after each step, so a request that arrives meanwhile waits for one step's
work at most: a thread that held on to the GIL would keep the loop waiting up to the interpreter's switch
interval (5 ms).
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import secrets
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.config import FeatureLogSettings
from serving.catalog import LogSpec
from serving.result import NOT_FOUND, NULL_VALUE, OUTSIDE_MAX_AGE, PRESENT
from serving.stats import ServerStats

logger = logging.getLogger(__name__)

LOG_TIMESTAMP, LOG_DATE, REQUEST_ID = "__log_timestamp", "__log_date", "__request_id"  # feast.feature_logging's
STATUS_CODES = {PRESENT: 1, NULL_VALUE: 2, NOT_FOUND: 3, OUTSIDE_MAX_AGE: 4}  # Feast's FieldStatus
DRAIN_S = 0.2  # the longest an answer waits before it becomes Arrow: the queue bound's headroom
PAUSE_S = 0.0002  # between two steps: long enough for the event loop's thread to wake up and take the GIL
PARSE_ANSWERS = 4  # answers parsed in one step, between two pauses
_US_PER_DAY = 86_400_000_000
_SPAN = 1 << 32  # deterministic sampling: the CRC-32 of a request id against sample_rate * 2^32
_VALUES, _STATUSES, _STAMPS = itemgetter("values"), itemgetter("statuses"), itemgetter("event_timestamps")


def _consume(calls: Iterator) -> None:
    deque(calls, maxlen=0)  # runs a lazy map in C


class _Queued:
    """Answers of one service (one catalog version of it) not yet in Arrow, column by column. An answer's results
    are its join keys, then the service's features in order."""

    def __init__(self, spec: LogSpec, names: list[str]):
        self.spec = spec
        self.keys = names[:len(names) - len(spec.features)]
        self.width = len(names)
        self.values: list[list] = [[] for _ in names]
        self.statuses: list[list] = [[] for _ in spec.features]
        self.stamps: list[list] = [[] for _ in spec.features]
        self.request_ids: list[str] = []
        self.log_us: list[int] = []
        self.rows = 0

    def add(self, results: list[dict], rows: int, request_id: str, log_us: int) -> bool:
        """Append one answer's columns; False (nothing appended) when it does not have this service's shape."""
        if len(results) != self.width:
            return False
        _consume(map(list.extend, self.values, map(_VALUES, results)))
        _consume(map(list.extend, self.statuses, map(_STATUSES, islice(results, len(self.keys), None))))
        _consume(map(list.extend, self.stamps, map(_STAMPS, islice(results, len(self.keys), None))))
        self.request_ids.extend(itertools.repeat(request_id, rows))
        self.log_us.extend(itertools.repeat(log_us, rows))
        self.rows += rows
        return True


@dataclass
class _Buffer:
    """Arrow batches of one service converted and not yet written."""

    spec: LogSpec
    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0


class FeatureLogger:
    """One per server worker: `offer` on the event loop, `start` and `close` at start-up and shutdown."""

    def __init__(self, settings: FeatureLogSettings, stats: ServerStats):
        self.settings = settings
        self.stats = stats
        self._lock = threading.Lock()  # the queue: appended to by the event loop, taken whole by the writer
        self._queued: list[tuple[LogSpec, bytes, int, str, int]] = []  # spec, answer as sent, rows, id, log time
        self._queued_rows = 0
        self._token = f"{os.getpid()}-{secrets.token_hex(4)}"  # unique per worker: file names, generated ids
        self._ids = itertools.count()
        self._files = itertools.count()
        self._buffers: dict[str, _Buffer] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def offer(self, spec: LogSpec, answer: bytes, rows: int, request_id: Optional[str]) -> Optional[str]:
        """Queue an answer (Feast's JSON response body of `rows` entity rows, as sent) when its request is
        sampled: deterministically by `request_id` when the client gave one (the same id is logged by every worker
        or by none), at random otherwise. Returns the request id logged, None when the request is not logged."""
        rate = spec.sample_rate
        if request_id is None:
            if rate < 1.0 and random.random() >= rate:
                return None
            request_id = f"{self._token}-{next(self._ids)}"
        elif rate < 1.0 and zlib.crc32(request_id.encode()) >= rate * _SPAN:
            return None
        counts = self.stats.log_counts(spec.service)
        with self._lock:
            queued = self._queued_rows
            if not rows or queued + rows > self.settings.queue_rows:
                counts.dropped += rows
                return None
            self._queued.append((spec, answer, rows, request_id, time.time_ns() // 1000))
            self._queued_rows = queued + rows
        counts.logged += rows
        self.stats.log_queued = queued + rows
        if queued * 2 < self.settings.queue_rows <= (queued + rows) * 2:
            self._wake.set()  # half full: convert now rather than at the next DRAIN_S
        return request_id

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="feature-log-writer", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 60.0) -> None:
        """Convert and write everything queued (the server has stopped serving), then stop the thread."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.error("feature log writer still busy after %.0f s at shutdown: rows not yet written are lost",
                         timeout_s)

    def _run(self) -> None:
        last_write = time.monotonic()
        while not self._stopping:
            self._wake.wait(DRAIN_S)
            self._wake.clear()
            self._drain()
            buffered = self.stats.log_buffered
            if buffered >= self.settings.flush_rows or (buffered and time.monotonic() - last_write
                                                        >= self.settings.flush_s):
                for service in list(self._buffers):
                    self._write_buffer(service)
                last_write = time.monotonic()
        self._drain()
        for service in list(self._buffers):
            self._write_buffer(service)

    def _drain(self) -> None:
        """Take the whole queue and turn it into one Arrow batch per service (and catalog version of it)."""
        with self._lock:
            taken, self._queued, self._queued_rows = self._queued, [], 0
        self.stats.log_queued = 0
        for columns in self._parse(taken).values():
            if columns.rows:
                self._convert(columns)
        self.stats.log_buffered = sum(b.rows for b in self._buffers.values())

    def _parse(self, taken: list[tuple[LogSpec, bytes, int, str, int]]) -> dict[int, _Queued]:
        """The queued answers as columns, per spec (by its id: each _Queued keeps its spec alive)."""
        parsed: dict[int, _Queued] = {}
        for i, (spec, answer, rows, request_id, log_us) in enumerate(taken, 1):
            response = orjson.loads(answer)
            columns = parsed.get(id(spec))
            if columns is None:
                columns = parsed[id(spec)] = _Queued(spec, response["metadata"]["feature_names"])
            if not columns.add(response["results"], rows, request_id, log_us):
                self.stats.log_counts(spec.service).failed += rows  # the catalog changed under the plan: rare
            if i % PARSE_ANSWERS == 0:
                time.sleep(PAUSE_S)
        return parsed

    def _convert(self, columns: _Queued) -> None:
        spec = columns.spec
        try:
            arrays: dict[str, pa.Array] = {}
            for _ in _arrays(columns, arrays):
                time.sleep(PAUSE_S)
            batch = pa.RecordBatch.from_arrays([arrays[f.name] for f in spec.schema], schema=spec.schema)
        except (pa.ArrowException, KeyError, TypeError, ValueError) as exc:
            logger.error("feature log of `%s`: %d rows do not fit its logged schema: %s", spec.service,
                         columns.rows, exc)
            self.stats.log_counts(spec.service).failed += columns.rows
            return
        buffer = self._buffers.get(spec.service)
        if buffer is not None and buffer.spec.schema != spec.schema:
            self._write_buffer(spec.service)  # the service changed: its older rows get their own file
        buffer = self._buffers.setdefault(spec.service, _Buffer(spec))
        buffer.batches.append(batch)
        buffer.rows += columns.rows

    def _write_buffer(self, service: str) -> None:
        """One file per date of the service's buffered rows; rows that cannot be written are counted, not kept."""
        buffer = self._buffers.pop(service)
        counts = self.stats.log_counts(service)
        try:
            table = pa.Table.from_batches(buffer.batches, schema=buffer.spec.schema)
            for date, part in _by_date(table):
                counts.bytes += self._write(Path(buffer.spec.path) / f"{LOG_DATE}={date}", part)
                counts.files += 1
                counts.written += part.num_rows
                buffer.rows -= part.num_rows
        except (OSError, pa.ArrowException) as exc:
            logger.error("feature log of `%s`: %d rows could not be written under %s: %s", service, buffer.rows,
                         buffer.spec.path, exc)
            counts.failed += buffer.rows
        self.stats.log_buffered = sum(b.rows for b in self._buffers.values())

    def _write(self, folder: Path, table: pa.Table) -> int:
        """One Parquet file, written under a hidden name (readers skip names starting with `.`) and renamed."""
        folder.mkdir(parents=True, exist_ok=True)
        name = f"{self._token}-{next(self._files):06d}.parquet"
        hidden = folder / f".{name}.tmp"
        pq.write_table(table, hidden)
        hidden.replace(folder / name)
        return (folder / name).stat().st_size


def _by_date(table: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """The rows of each `__log_date`, without that column (the folder name carries it)."""
    dates = table.column(LOG_DATE)
    rest = table.drop_columns([LOG_DATE])
    for date in pc.unique(dates).to_pylist():
        yield date.isoformat(), rest.filter(pc.equal(dates, pa.scalar(date, pa.date32())))


def _arrays(columns: _Queued, out: dict[str, pa.Array]) -> Iterator[None]:
    """Fill `out` with the log columns of queued answers, yielding after each feature so that the writer can
    pause: values, statuses and timestamps as the answers said them (timestamps to the second, Feast's type)."""
    schema, features = columns.spec.schema, columns.spec.features
    for key, values in zip(columns.keys, columns.values):
        out[key] = pa.array(values, schema.field(key).type)
    rows = columns.rows
    present = pa.array(np.full(rows, STATUS_CODES[PRESENT], dtype=np.int32))
    last_stamps, seconds = None, None
    for column, values, statuses, stamps in zip(features, columns.values[len(columns.keys):], columns.statuses,
                                                columns.stamps):
        yield
        out[column] = _values(values, schema.field(column).type)
        if statuses.count(PRESENT) == rows:
            out[f"{column}__status"] = present
        else:
            out[f"{column}__status"] = pa.array(list(map(STATUS_CODES.__getitem__, statuses)), pa.int32())
        if stamps != last_stamps:  # the features of a view share their timestamps: converted once
            last_stamps, seconds = stamps, _seconds(stamps)
        kind = schema.field(f"{column}__timestamp").type
        out[f"{column}__timestamp"] = seconds.cast(pa.timestamp("s", kind.tz)).cast(kind)
    yield
    out[REQUEST_ID] = pa.array(columns.request_ids, pa.string())
    log_us = np.asarray(columns.log_us, dtype=np.int64)
    out[LOG_TIMESTAMP] = pa.array(log_us, schema.field(LOG_TIMESTAMP).type)
    out[LOG_DATE] = pa.array((log_us // _US_PER_DAY).astype(np.int32)).cast(pa.date32())


def _seconds(stamps: list[str]) -> pa.Array:
    """RFC 3339 times (`2026-03-01T22:00:01.5Z`, the answer's spelling) to the second, as a naive timestamp."""
    return pc.utf8_slice_codeunits(pa.array(stamps, pa.string()), 0, 19).cast(pa.timestamp("s"))


def _values(values: list, kind: pa.DataType) -> pa.Array:
    """A feature's values; the JSON spelling of non-finite floats ("NaN", "Infinity") read back as floats."""
    if pa.types.is_floating(kind) and str in set(map(type, values)):
        values = [float(v) if isinstance(v, str) else v for v in values]
    return pa.array(values, kind)
