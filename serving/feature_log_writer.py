"""The feature log writer process: one per server worker, started by `serving.feature_log`, it turns the answers
the worker logged into Parquet in Feast's feature-logging layout (the schema of Feast's
`FeatureServiceLoggingSource`, one folder per `__log_date`, hive-style), so that Feast's file offline store reads
them.

It reads messages (`serving.feature_log_pipe`) on stdin: a logged service (its log folder, schema and feature
columns) once per service and writer, then batches of answers (Feast's JSON response body as sent, its rows,
request id and log time). Every `DRAIN_S`, or sooner once it holds half the worker's queue bound, it parses the
answers back into columns (per result its values, statuses and event timestamps, as sent) and makes them Arrow;
it writes one file per service and date every `flush_s` or `flush_rows`, and when stdin ends (the worker stopped
or died). After each step it reports on stdout, cumulatively: the rows taken off its queue (the worker's bound
counts rows until then), the rows held in Arrow, and per service the rows written and failed, files and bytes.
Files are named by worker, writer and sequence and appear whole, by rename.

Run as `python -m serving.feature_log_writer SETTINGS_JSON TOKEN`. It runs at idle priority (SCHED_IDLE). It
ignores SIGINT and SIGTERM, which a terminal or a service manager sends to the whole process group: it stops when
its worker closes stdin, after the last write.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple, Optional

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.log_columns import LOG_DATE, LOG_TIMESTAMP, REQUEST_ID
from serving.feature_log_pipe import FrameReader, frame
from serving.result import NOT_FOUND, NULL_VALUE, OUTSIDE_MAX_AGE, PRESENT
from serving.stats import FeatureLogCounts

logger = logging.getLogger(__name__)

STATUS_CODES = {PRESENT: 1, NULL_VALUE: 2, NOT_FOUND: 3, OUTSIDE_MAX_AGE: 4}  # Feast's FieldStatus
DRAIN_S = 0.2  # the longest an answer waits before it becomes Arrow: the queue bound's headroom
READ_BYTES = 1 << 20
_US_PER_DAY = 86_400_000_000
_VALUES, _STATUSES, _STAMPS = itemgetter("values"), itemgetter("statuses"), itemgetter("event_timestamps")


class LoggedService(NamedTuple):
    """What the writer needs of a logged service (`serving.catalog.LogSpec` less the sample rate)."""

    service: str
    path: str
    schema: pa.Schema
    features: tuple[str, ...]
    request_fields: tuple[str, ...]


def _consume(calls: Iterator) -> None:
    deque(calls, maxlen=0)  # runs a lazy map in C


class _Columns:
    """Answers of one service (one version of it) not yet in Arrow, column by column. An answer's results are its
    join keys, then the service's features in order; the request data of its on-demand views comes beside it."""

    def __init__(self, spec: LoggedService, names: list[str]):
        self.spec = spec
        self.keys = names[:len(names) - len(spec.features)]
        self.width = len(names)
        self.values: list[list] = [[] for _ in names]
        self.statuses: list[list] = [[] for _ in spec.features]
        self.stamps: list[list] = [[] for _ in spec.features]
        self.request: list[list] = [[] for _ in spec.request_fields]
        self.request_ids: list[str] = []
        self.log_us: list[int] = []
        self.rows = 0

    def add(self, results: list[dict], rows: int, request_id: str, log_us: int, request_data: bytes) -> bool:
        """Append one answer's columns; False (nothing appended) when it does not have this service's shape."""
        if len(results) != self.width:
            return False
        if self.request:
            data = orjson.loads(request_data or b"{}")
            values = [data.get(name) for name in self.spec.request_fields]
            if not all(isinstance(v, list) and len(v) == rows for v in values):
                return False
            _consume(map(list.extend, self.request, values))
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

    spec: LoggedService
    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0


class LogWriter:
    """The answers received, their Arrow batches and files; `report` writes its counts to the worker."""

    def __init__(self, settings: dict, token: str, report_to: Optional[BinaryIO]):
        self.queue_rows, self.flush_rows, self.flush_s = (settings["queue_rows"], settings["flush_rows"],
                                                          settings["flush_s"])
        self.queued_rows = 0
        self._token = token
        self._report_to = report_to
        self._services: dict[int, LoggedService] = {}
        self._answers: list[tuple[int, bytes, int, str, int, bytes]] = []  # service key, answer, rows, id, time,
        # request data
        self._buffers: dict[str, _Buffer] = {}
        self._counts: dict[str, FeatureLogCounts] = {}  # since this writer started
        self._taken = 0
        self._files = itertools.count()
        self._last_write = time.monotonic()
        self._reported: Optional[tuple] = None

    def receive(self, message: tuple) -> None:
        if message[0] == "service":
            self._services[message[1]] = LoggedService(*message[2:])
        else:  # ("answers", rows, [(service key, answer, rows, request id, log time, request data), ...])
            self._answers.extend(message[2])
            self.queued_rows += message[1]

    def step(self, final: bool = False) -> None:
        """Convert what was received; write files when due (`final`: everything); report."""
        self._drain()
        buffered = sum(b.rows for b in self._buffers.values())
        if final or buffered >= self.flush_rows or (buffered and time.monotonic() - self._last_write
                                                    >= self.flush_s):
            for service in list(self._buffers):
                self._write_buffer(service)
            self._last_write = time.monotonic()
        self._report()

    def _report(self) -> None:
        buffered = sum(b.rows for b in self._buffers.values())
        report = ("counts", self._taken, buffered,
                  {name: (c.written, c.failed, c.files, c.bytes) for name, c in self._counts.items()})
        if report == self._reported or self._report_to is None:
            return
        try:
            self._report_to.write(frame(report))
            self._report_to.flush()
            self._reported = report
        except OSError:  # the worker is gone: still write what it sent
            self._report_to = None

    def _counted(self, service: str) -> FeatureLogCounts:
        return self._counts.setdefault(service, FeatureLogCounts())

    def _drain(self) -> None:
        """Turn the answers received into one Arrow batch per service (and version of it)."""
        taken, self._answers = self._answers, []
        for columns in self._parse(taken).values():
            if columns.rows:
                self._convert(columns)
        self._taken += self.queued_rows
        self.queued_rows = 0

    def _parse(self, taken: list[tuple[int, bytes, int, str, int, bytes]]) -> dict[int, _Columns]:
        parsed: dict[int, _Columns] = {}
        for key, answer, rows, request_id, log_us, request_data in taken:
            spec = self._services[key]
            response = orjson.loads(answer)
            columns = parsed.get(key)
            if columns is None:
                columns = parsed[key] = _Columns(spec, response["metadata"]["feature_names"])
            if not columns.add(response["results"], rows, request_id, log_us, request_data):
                self._counted(spec.service).failed += rows  # the catalog changed under the plan: rare
        return parsed

    def _convert(self, columns: _Columns) -> None:
        spec = columns.spec
        try:
            arrays = _arrays(columns)
            batch = pa.RecordBatch.from_arrays([arrays[f.name] for f in spec.schema], schema=spec.schema)
        except (pa.ArrowException, KeyError, TypeError, ValueError) as exc:
            logger.error("feature log of `%s`: %d rows do not fit its logged schema: %s", spec.service,
                         columns.rows, exc)
            self._counted(spec.service).failed += columns.rows
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
        counts = self._counted(service)
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


def _arrays(columns: _Columns) -> dict[str, pa.Array]:
    """The log columns of parsed answers: values, statuses and timestamps as the answers said them (timestamps to
    the second, Feast's type)."""
    schema, features = columns.spec.schema, columns.spec.features
    out = {key: pa.array(values, schema.field(key).type) for key, values in zip(columns.keys, columns.values)
           if key in schema.names}  # an on-demand view's entity rows: answered, not in Feast's log schema
    for name, values in zip(columns.spec.request_fields, columns.request):
        out[name] = _values(values, schema.field(name).type)
    rows = columns.rows
    present = pa.array(np.full(rows, STATUS_CODES[PRESENT], dtype=np.int32))
    last_stamps, seconds = None, None
    for column, values, statuses, stamps in zip(features, columns.values[len(columns.keys):], columns.statuses,
                                                columns.stamps):
        out[column] = _values(values, schema.field(column).type)
        if statuses.count(PRESENT) == rows:
            out[f"{column}__status"] = present
        else:
            out[f"{column}__status"] = pa.array(list(map(STATUS_CODES.__getitem__, statuses)), pa.int32())
        if stamps != last_stamps:  # the features of a view share their timestamps: converted once
            last_stamps, seconds = stamps, _seconds(stamps)
        kind = schema.field(f"{column}__timestamp").type
        out[f"{column}__timestamp"] = seconds.cast(pa.timestamp("s", kind.tz)).cast(kind)
    out[REQUEST_ID] = pa.array(columns.request_ids, pa.string())
    log_us = np.asarray(columns.log_us, dtype=np.int64)
    out[LOG_TIMESTAMP] = pa.array(log_us, schema.field(LOG_TIMESTAMP).type)
    out[LOG_DATE] = pa.array((log_us // _US_PER_DAY).astype(np.int32)).cast(pa.date32())
    return out


def _seconds(stamps: list[str]) -> pa.Array:
    """RFC 3339 times (`2026-03-01T22:00:01.5Z`, the answer's spelling) to the second, as a naive timestamp."""
    return pc.utf8_slice_codeunits(pa.array(stamps, pa.string()), 0, 19).cast(pa.timestamp("s"))


def _values(values: list, kind: pa.DataType) -> pa.Array:
    """A feature's values; the JSON spelling of non-finite floats ("NaN", "Infinity") read back as floats."""
    if pa.types.is_floating(kind) and str in set(map(type, values)):
        values = [float(v) if isinstance(v, str) else v for v in values]
    return pa.array(values, kind)


def run(writer: LogWriter, source: int) -> None:
    """Receive from `source` until it ends, a step every DRAIN_S or once half the queue bound is received; then the
    last step, which writes everything."""
    reader = FrameReader()
    next_step = time.monotonic() + DRAIN_S
    while True:
        if select.select([source], [], [], max(0.0, next_step - time.monotonic()))[0]:
            data = os.read(source, READ_BYTES)
            if not data:
                break
            for message in reader.feed(data):
                writer.receive(message)
        if time.monotonic() >= next_step or writer.queued_rows * 2 >= writer.queue_rows:
            writer.step()
            next_step = time.monotonic() + DRAIN_S
    writer.step(final=True)


def _yield_to_the_server() -> None:
    """Run only on CPU time the server leaves idle (Linux's SCHED_IDLE; elsewhere the lowest nice): logging must
    never slow a request, and on a busy host the bounded queue drops and counts rows instead."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def main() -> None:
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s %(process)d: %(message)s")
    _yield_to_the_server()
    settings, token = json.loads(sys.argv[1]), sys.argv[2]
    reports = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print goes to the log, not into the reports
    run(LogWriter(settings, token, reports), sys.stdin.fileno())


if __name__ == "__main__":
    main()
