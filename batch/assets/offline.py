"""Derived asset rows written where the rest of the platform reads them: the source's Parquet history (one file
per run) and each view's offline table (`batch.offline_table` layout), with the run recorded in the backfill log
so that `featurectl materialize` checks their version as it does a backfill's.

A view's rows are keyed by (join keys, event time = the asset's update time). A write replaces the whole days its
new rows fall on (`RangeWriter`) with the rows already there plus the new ones, a new row replacing one of the
same key: writing the same run twice leaves the table as writing it once.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from batch.backfill import BackfillTarget
from batch.backfill_log import BackfillLog, BackfillRecord
from batch.offline_table import DAY_MS, RangeWriter, WriteStats
from dsl.assets import ASSET_TIMESTAMP, AssetSource
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.compile_flink import SourceSettings, compile_view, source_path
from dsl.feature_view import FeatureView
from dsl.view_version import view_version

TIMESTAMP_TYPE = pa.timestamp("ms", "UTC")


def write_history(source: AssetSource, data_dir: Path, derived: pa.Table) -> Path | None:
    """The run's rows (the source's columns) as one new Parquet file of the source's history."""
    if not derived.num_rows:
        return None
    folder = source_path(source, data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"assets-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}.parquet"
    staged = folder / f".{name}"
    pq.write_table(derived.select(list(source.schema)), staged)
    os.replace(staged, folder / name)
    return folder / name


def view_rows(view: FeatureView, derived: pa.Table) -> pa.Table:
    """Join keys, event time and the view's features of each derived row."""
    schema = view.output_schema()
    columns = {key: derived.column(key) for key in view.entity.join_keys}
    columns[EVENT_TIMESTAMP] = derived.column(ASSET_TIMESTAMP).cast(pa.int64()).cast(TIMESTAMP_TYPE)
    for name, kind in schema.items():
        column = next(f.column for f in view.attributes if f.feature_names[0] == name)
        columns[name] = derived.column(column).cast(kind.arrow_type())
    return pa.table(columns)


def write_view(path: Path, rows: pa.Table, keys: list[str]) -> WriteStats:
    """Replace the days of `rows` in the offline table at `path` with what they held plus `rows` (new wins)."""
    if not rows.num_rows:
        return WriteStats()
    millis = rows.column(EVENT_TIMESTAMP).cast(pa.int64())
    start = pc.min(millis).as_py() // DAY_MS * DAY_MS
    end = (pc.max(millis).as_py() // DAY_MS + 1) * DAY_MS
    kept = _rows_in(path, rows.schema, start, end)
    if kept.num_rows:
        kept = kept.filter(pc.invert(pc.is_in(_row_keys(kept, keys), value_set=_row_keys(rows, keys))))
    with RangeWriter(path, rows.schema, start, end) as writer:
        writer.write(pa.concat_tables([kept, rows]))
        return writer.commit()


def _rows_in(path: Path, schema: pa.Schema, start: int, end: int) -> pa.Table:
    if not path.is_dir():
        return schema.empty_table()
    dataset = ds.dataset(path, format="parquet", partitioning="hive")
    ts = ds.field(EVENT_TIMESTAMP).cast(pa.int64())
    table = dataset.to_table(columns=[c for c in schema.names if c in dataset.schema.names],
                             filter=(ts >= start) & (ts < end))
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.table(columns, schema=schema)


def _row_keys(table: pa.Table, keys: list[str]) -> pa.Array:
    parts = [table.column(k).cast(pa.string()) for k in keys]
    parts.append(table.column(EVENT_TIMESTAMP).cast(pa.int64()).cast(pa.string()))
    return pc.binary_join_element_wise(*parts, "\x1f").combine_chunks()


def write_views(views: list[FeatureView], derived: pa.Table, target: BackfillTarget) -> dict:
    """Each view's new rows into its offline table, recorded in the backfill log with the view's version; returns
    view name -> (first, last) event time written, in ms."""
    written: dict[str, tuple[int, int]] = {}
    backfill_log = BackfillLog(target.registry_url)
    settings = SourceSettings(target.bootstrap_servers, target.data_dir)
    try:
        for view in views:
            rows = view_rows(view, derived)
            stats = write_view(offline_table_path(target.data_dir, view), rows, list(view.entity.join_keys))
            if not stats.rows:
                continue
            millis = rows.column(EVENT_TIMESTAMP).cast(pa.int64())
            first, last = pc.min(millis).as_py(), pc.max(millis).as_py()
            written[view.name] = (first, last)
            day = dt.timedelta(days=1)
            start = dt.datetime.fromtimestamp(first // DAY_MS * DAY_MS / 1000, dt.timezone.utc)
            end = dt.datetime.fromtimestamp((last // DAY_MS) * DAY_MS / 1000, dt.timezone.utc) + day
            backfill_log.record(BackfillRecord(target.project, view.name, start, end, stats.rows, stats.files,
                                               dt.datetime.now(dt.timezone.utc),
                                               view_version(view, compile_view(view, settings))))
    finally:
        backfill_log.close()
    return written
