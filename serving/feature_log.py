"""Feature logging in the server: the vectors served for services with `logging`, written as Parquet in Feast's
feature-logging layout (the schema of Feast's `FeatureServiceLoggingSource`, one folder per `__log_date`,
hive-style), so that Feast's file offline store reads them.

The request path decides whether a request is sampled and appends the answer it already encoded (Feast's JSON,
one bytes object: nothing for the garbage collector to scan while it waits) to a queue bounded in rows; it never
waits: an answer that would pass the bound is dropped and counted. A writer thread parses the queued answers
every `DRAIN_S`, turns them into Arrow, and writes one file per service and date every `flush_s` or `flush_rows`,
and at shutdown. So the log holds what the answers said. Files are named by worker and sequence and appear
whole, by rename.

The writer shares the GIL with the event loop. It works in steps of about 0.1 ms (a few answers parsed, one
column made Arrow) and sleeps `PAUSE_S` between two, so a request that arrives meanwhile waits for one step at
most: a thread that held on to the GIL would keep the loop waiting up to the interpreter's switch interval (5 ms).
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
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterator, Optional

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
DRAIN_S = 0.2  # the longest an answer waits before it is parsed: the queue bound's headroom
PAUSE_S = 0.0002  # between two steps: long enough for the event loop's thread to wake up and take the GIL
CHUNK = 1024  # answers per Arrow batch
PARSE_CHUNK = 16  # answers parsed at a time: a step of about 0.1 ms, and few live objects for the GC
_US_PER_DAY = 86_400_000_000
_SPAN = 1 << 32  # deterministic sampling: the CRC-32 of a request id against sample_rate * 2^32
_VALUES, _STATUSES, _STAMPS = itemgetter("values"), itemgetter("statuses"), itemgetter("event_timestamps")


@dataclass(slots=True)
class _Entry:
    spec: LogSpec
    answer: bytes  # the JSON body sent
    request_id: str
    log_us: int  # when it was served, epoch microseconds
    rows: int


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
        self._queue: deque[_Entry] = deque()
        self._offered = 0  # rows queued so far, by the event loop's thread only
        self._taken = 0  # rows converted (or failed) so far, by the writer's thread only
        self._token = f"{os.getpid()}-{secrets.token_hex(4)}"  # unique per worker: file names, generated ids
        self._ids = itertools.count()
        self._files = itertools.count()
        self._buffers: dict[str, _Buffer] = {}
        self._wake = threading.Event()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None

    def offer(self, spec: LogSpec, answer: bytes, rows: int, request_id: Optional[str]) -> Optional[str]:
        """Queue an answer of `rows` entity rows when its request is sampled: deterministically by `request_id`
        when the client gave one (the same id is logged by every worker or by none), at random otherwise.
        Returns the request id logged, None when the request is not logged."""
        rate = spec.sample_rate
        if request_id is None:
            if rate < 1.0 and random.random() >= rate:
                return None
            request_id = f"{self._token}-{next(self._ids)}"
        elif rate < 1.0 and zlib.crc32(request_id.encode()) >= rate * _SPAN:
            return None
        queued = self._offered - self._taken
        counts = self.stats.log_counts(spec.service)
        if not rows or queued + rows > self.settings.queue_rows:
            counts.dropped += rows
            return None
        self._queue.append(_Entry(spec, answer, request_id, time.time_ns() // 1000, rows))
        self._offered += rows
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
        """Turn what is queued now into Arrow batches of up to CHUNK answers of one service (and one catalog
        version of its schema)."""
        entries = [self._queue.popleft() for _ in range(len(self._queue))]
        groups: dict[int, list[_Entry]] = {}
        for entry in entries:
            groups.setdefault(id(entry.spec), []).append(entry)
        for group in groups.values():
            for start in range(0, len(group), CHUNK):
                self._convert(group[start:start + CHUNK])
        self.stats.log_buffered = sum(b.rows for b in self._buffers.values())

    def _convert(self, entries: list[_Entry]) -> None:
        spec, rows = entries[0].spec, sum(e.rows for e in entries)
        try:
            arrays: dict[str, pa.Array] = {}
            for _ in _arrays(spec, entries, arrays):
                time.sleep(PAUSE_S)
            batch = pa.RecordBatch.from_arrays([arrays[f.name] for f in spec.schema], schema=spec.schema)
        except (pa.ArrowException, KeyError, IndexError, TypeError, ValueError) as exc:
            logger.error("feature log of `%s`: %d rows do not fit its logged schema: %s", spec.service, rows, exc)
            self.stats.log_counts(spec.service).failed += rows
        else:
            buffer = self._buffers.get(spec.service)
            if buffer is not None and buffer.spec.schema != spec.schema:
                self._write_buffer(spec.service)  # the service changed: its older rows get their own file
            buffer = self._buffers.setdefault(spec.service, _Buffer(spec))
            buffer.batches.append(batch)
            buffer.rows += rows
        self._taken += rows
        self.stats.log_queued = self._offered - self._taken

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


def _arrays(spec: LogSpec, entries: list[_Entry], out: dict[str, pa.Array]) -> Iterator[None]:
    """Fill `out` with the log columns of one service's answers, yielding after each step so that the writer can
    pause: answers are parsed PARSE_CHUNK at a time into one list per column (their parsed objects die at once,
    before any garbage collection has to look at them), then each column becomes Arrow. An answer's results are
    its join keys, then the service's features in order: values, statuses and timestamps as the answer said them
    (timestamps to the second, Feast's log type)."""
    schema = spec.schema
    names = orjson.loads(entries[0].answer)["metadata"]["feature_names"]
    keys = len(names) - len(spec.features)
    values: list[list] = [[] for _ in names]
    statuses: list[list] = [[] for _ in spec.features]
    stamps: list[list] = [[] for _ in spec.features]
    for start in range(0, len(entries), PARSE_CHUNK):
        results = [orjson.loads(e.answer)["results"] for e in entries[start:start + PARSE_CHUNK]]
        for j, column in enumerate(values):
            column.extend(_flat(results, j, _VALUES))
        for i in range(len(spec.features)):
            statuses[i].extend(_flat(results, keys + i, _STATUSES))
            stamps[i].extend(_flat(results, keys + i, _STAMPS))
        del results
        yield
    for key, column in zip(names[:keys], values):
        out[key] = pa.array(column, schema.field(key).type)
    last_stamps, seconds = None, None
    for column, feature_values, feature_statuses, feature_stamps in zip(spec.features, values[keys:], statuses,
                                                                         stamps):
        yield
        out[column] = _values(feature_values, schema.field(column).type)
        out[f"{column}__status"] = pa.array(list(map(STATUS_CODES.__getitem__, feature_statuses)), pa.int32())
        if feature_stamps != last_stamps:  # the features of a view share their timestamps: parsed once
            last_stamps, seconds = feature_stamps, _seconds(feature_stamps)
        kind = schema.field(f"{column}__timestamp").type
        out[f"{column}__timestamp"] = seconds.cast(pa.timestamp("s", kind.tz)).cast(kind)
    counts = [e.rows for e in entries]
    out[REQUEST_ID] = pa.array(_repeated([e.request_id for e in entries], counts), pa.string())
    log_us = np.asarray(_repeated([e.log_us for e in entries], counts), dtype=np.int64)
    out[LOG_TIMESTAMP] = pa.array(log_us, schema.field(LOG_TIMESTAMP).type)
    out[LOG_DATE] = pa.array((log_us // _US_PER_DAY).astype(np.int32)).cast(pa.date32())


def _seconds(stamps: list[str]) -> pa.Array:
    """RFC 3339 times (`2026-03-01T22:00:01.5Z`, the answer's spelling) to the second, as a naive timestamp."""
    return pc.utf8_slice_codeunits(pa.array(stamps, pa.string()), 0, 19).cast(pa.timestamp("s"))


def _flat(results: list[list[dict]], j: int, part: Callable[[dict], list]) -> Iterator:
    """One part (values, statuses, timestamps) of result `j` of every answer, rows after rows."""
    return chain.from_iterable(map(part, map(itemgetter(j), results)))


def _values(values: list, kind: pa.DataType) -> pa.Array:
    """A feature's values; the JSON spelling of non-finite floats ("NaN", "Infinity") read back as floats."""
    if pa.types.is_floating(kind) and str in set(map(type, values)):
        values = [float(v) if isinstance(v, str) else v for v in values]
    return pa.array(values, kind)


def _repeated(values: list, counts: list[int]) -> list:
    """Each value repeated its count of times (once per entity row of its request)."""
    if all(count == 1 for count in counts):
        return values
    return list(chain.from_iterable(map(itertools.repeat, values, counts)))
