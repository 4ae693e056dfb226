"""Materialization: the latest offline row per entity in an interval -> Redis, in Feast's layout, fast.

Same semantics as Feast's `materialize`: rows with `start <= event_timestamp <= end`, the latest per entity wins,
and the interval is recorded on the feature view in the registry. Differences are in how, not what:
- the offline table is scanned in Arrow record batches, so memory stays flat whatever its size;
- keys, values and the RESP bytes of every HSET are built column by column by Arrow and numpy
  (`redis_store.columns`), never row by row in Python nor through protobuf objects;
- a key that does not exist yet is created whole by one RESTORE of a prebuilt hash (`redis_store.dump`);
  the others are written check-and-set with WATCH/MULTI/EXEC (`batch.redis_writer`), or on a Redis Cluster by
  a guarded script per key (`batch.cluster_writer`), so an older row never overwrites a newer one, also against
  a concurrent streaming writer;
- encoding and Redis round trips overlap: two threads encode batches while the writer's threads send.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from batch.cluster_writer import ClusterChunkWriter
from batch.redis_writer import CheckedChunkWriter, RowCommands
from common.errors import FeaturectlError
from common.instants import as_utc
from common.storage import Storage, as_storage
from dsl.assets import AssetSource
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.feature_view import FeatureView
from redis_store import columns, dump, freshness, layout
from redis_store.settings import RedisSettings

log = logging.getLogger(__name__)
RESTORE_ROWS = 512  # rows per RESTORE round trip; the ones whose key exists go on in checked chunks
NO_STREAM = 2**63 - 1  # a view no stream writes: every row may replace an equal `_ts`


class MaterializeError(FeaturectlError, RuntimeError):
    """Materialization cannot run as asked; the message says why and what to do."""


@dataclass
class MaterializeStats:
    view: str
    rows_read: int = 0
    entities_written: int = 0
    skipped_older: int = 0
    seconds: float = 0.0
    newest_event_ms: Optional[int] = None  # the greatest event time among the rows of the interval

    @property
    def rows_per_s(self) -> float:
        return self.rows_read / self.seconds if self.seconds else 0.0


def _scan(path: Path | Storage, view: FeatureView, start: datetime, end: datetime,
          batch_rows: int) -> Iterator[pa.RecordBatch]:
    dataset = as_storage(path).dataset()
    if dataset is None:
        fill = (f"featurectl assets process --source {view.source.name}" if isinstance(view.source, AssetSource)
                else "featurectl backfill")
        raise MaterializeError(f"feature view `{view.name}` has no offline table at {path}: run `{fill}` for it "
                               "first")
    columns = [*view.entity.join_keys, EVENT_TIMESTAMP, *view.output_schema()]
    missing = [c for c in columns if c not in dataset.schema.names]
    if missing:
        raise MaterializeError(f"offline table {path} lacks columns {missing}: re-run `featurectl backfill`")
    ts = ds.field(EVENT_TIMESTAMP)
    first, last = timestamp_bounds(start, end, dataset.schema.field(EVENT_TIMESTAMP).type)
    yield from dataset.to_batches(columns=columns, filter=(ts >= first) & (ts <= last), batch_size=batch_rows)


def timestamp_bounds(start: datetime, end: datetime, ts_type: pa.TimestampType) -> tuple[pa.Scalar, pa.Scalar]:
    """[start, end] as scalars of the table's timestamp type, holding the same stored times: start rounded up and
    end rounded down to its unit, since a bound finer than the column (microseconds against milliseconds) cannot
    be cast to it without losing data."""
    ns_per_unit = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}[ts_type.unit]
    first, last = _epoch_us(start) * 1_000, _epoch_us(end) * 1_000
    return pa.scalar(-(-first // ns_per_unit), ts_type), pa.scalar(last // ns_per_unit, ts_type)


def _epoch_us(value: datetime) -> int:
    return (as_utc(value) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def latest_per_entity(batch: pa.RecordBatch, keys: list[str]) -> pa.Table:
    """Keep the row with the greatest event time of each entity in the batch (ties: the later row)."""
    table = pa.Table.from_batches([batch])
    if table.num_rows == 0:
        return table
    table = table.append_column("__row", pa.array(np.arange(table.num_rows)))
    order = table.sort_by([*((k, "ascending") for k in keys), (EVENT_TIMESTAMP, "ascending"),
                           ("__row", "ascending")])
    key_cols = [order.column(k).combine_chunks() for k in keys]
    last = np.ones(order.num_rows, dtype=bool)
    if order.num_rows > 1:
        same_as_next = np.ones(order.num_rows - 1, dtype=bool)
        for col in key_cols:
            same_as_next &= pc.equal(col[:-1], col[1:]).to_numpy(zero_copy_only=False)
        last[:-1] = ~same_as_next
    return order.filter(pa.array(last)).drop_columns(["__row"])


def encode_commands(table: pa.Table, view: FeatureView, project: str,
                    listpack_limits: Optional[tuple[int, int]] = None, key_ttl_s: int = 0,
                    replace_equal_before_ms: int = NO_STREAM) -> RowCommands:
    """Per row of `table`: its Redis key, event time, `_ts` check and values in Feast's layout; with the server's
    `listpack_limits`, also the RESTORE that creates the key when it does not exist yet. `key_ttl_s`: the expiry
    every written key gets (Feast's `key_ttl_seconds`; 0: none). Rows older than `replace_equal_before_ms` may
    overwrite an equal stored `_ts` (`RowCommands.newest_replaceable`)."""
    encoder = layout.KeyEncoder(project, view.entity.join_keys)
    key_bulks = columns.bulk(columns.key_column(encoder, [table.column(k) for k in encoder.order]))
    millis = table.column(EVENT_TIMESTAMP).cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_numpy()
    schema = view.output_schema()
    fields = [layout.field_name(view.name, name) for name in schema] + [layout.ts_field(view.name)]
    values = [columns.value_encoding(table.column(name), kind) for name, kind in schema.items()]
    values.append(columns.timestamp_column(millis))
    reads = columns.hget_commands(key_bulks, layout.ts_field(view.name))
    if listpack_limits is None:
        return RowCommands(key_bulks, millis, reads, fields, values, key_ttl_s=key_ttl_s,
                           replace_equal_before_ms=replace_equal_before_ms).with_writes()
    restorable = dump.restorable(fields, values, *listpack_limits)
    restores = dump.restore_commands(key_bulks, fields, values, key_ttl_s) if restorable.any() else None
    return RowCommands(key_bulks, millis, reads, fields, values, restores, restorable, key_ttl_s=key_ttl_s,
                       replace_equal_before_ms=replace_equal_before_ms)


def materialize_view(settings: RedisSettings, view: FeatureView, project: str, offline_path: Path | Storage,
                     start: datetime, end: datetime, batch_rows: int = 16_384, encoders: int = 2, key_ttl_s: int = 0,
                     stream_cutover_ms: int = NO_STREAM, on_rows: Optional[Callable[[int], None]] = None,
                     on_written: Optional[Callable[[pa.Table], None]] = None) -> MaterializeStats:
    """Write the latest value per entity in [start, end] of one view's offline table to the Redis of `settings`;
    every key written expires after `key_ttl_s` when it is set (Feast's `online_store.key_ttl_seconds`). The
    newest event time of the rows is recorded as the view's (`redis_store.freshness`) once all are written.

    A row replaces a newer `_ts` never, an equal one only before `stream_cutover_ms`, where the view's stream (if
    any) writes nothing: there an equal `_ts` is an earlier materialization of the same boundary, whose values a
    backfill may have recomputed since; from the cutover on it may be the stream's value at that instant, which
    counts the events at it (Feast's writer skips every equal `_ts`).

    `on_written` gets each batch of rows once they are sent (the latest per entity), from the encoding threads:
    the vector index is filled from it.

    `encoders` threads encode batches side by side (Arrow and numpy release the GIL) while the writer's threads
    send; at most that many batches are in flight, so memory stays flat."""
    stats = MaterializeStats(view.name)
    started = time.perf_counter()
    writer = ClusterChunkWriter(settings) if settings.cluster else CheckedChunkWriter(settings)
    limits = writer.listpack_limits

    def encode_and_send(batch: pa.RecordBatch) -> tuple[int, Optional[int]]:
        latest = latest_per_entity(batch, list(view.entity.join_keys))
        if not latest.num_rows:
            return batch.num_rows, None
        rows = encode_commands(latest, view, project, limits if writer.wants_restores() else None, key_ttl_s,
                               stream_cutover_ms)
        chunk = RESTORE_ROWS if rows.restores is not None else writer.checked_rows
        for lo in range(0, len(rows), chunk):
            writer.send(rows.slice(lo, chunk))
        if on_written is not None:
            on_written(latest)
        return batch.num_rows, int(rows.millis.max())

    in_flight: deque = deque()
    try:
        with ThreadPoolExecutor(max_workers=encoders, thread_name_prefix="materialize-encode") as pool:
            for batch in _scan(offline_path, view, start, end, batch_rows):
                in_flight.append(pool.submit(encode_and_send, batch))
                while len(in_flight) >= encoders or (in_flight and in_flight[0].done()):
                    _finished(in_flight.popleft().result(), stats, on_rows)
            while in_flight:
                _finished(in_flight.popleft().result(), stats, on_rows)
    finally:
        written = writer.close()
    stats.entities_written = written
    stats.skipped_older = writer.skipped_older
    if stats.newest_event_ms is not None:
        freshness.record_newest(settings, project, {view.name: stats.newest_event_ms})
    stats.seconds = time.perf_counter() - started
    log.info("materialized %s: %d rows read, %d entities written (%d created by RESTORE) in %.2fs", view.name,
             stats.rows_read, written, writer.restored, stats.seconds)
    return stats


def _finished(done: tuple[int, Optional[int]], stats: MaterializeStats,
              on_rows: Optional[Callable[[int], None]]) -> None:
    rows, newest = done
    stats.rows_read += rows
    if newest is not None and (stats.newest_event_ms is None or newest > stats.newest_event_ms):
        stats.newest_event_ms = newest
    if on_rows:
        on_rows(rows)
