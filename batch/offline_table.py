"""A view's offline feature table: Parquet partitioned by UTC date, `date=YYYY-MM-DD/part-*.parquet`, in a local
folder or in shared storage (`common.storage`).

A write replaces one time range [start, end). New files are staged beside the table; the rows of touched dates that
lie outside the range are carried over into the staged partition; then each touched partition is swapped in. So
re-running a range replaces it and never duplicates it, and rows outside it survive. A write may also hold rows
before `start` (a backfill's row at an entity's last change before its range): each goes to its own date's
partition, replacing a row of the same entity and time there, if any (the same change, as an earlier range or an
earlier run wrote it). In a local folder the swap is two renames, so a reader sees the old or the new partition of a
date, never a mix (between the two renames, briefly, neither). An object store has no rename of a folder: there the
old partition's files are deleted and the staged ones moved in one by one, and a reader during the swap may see part
of a date.
Staged and retired folders start with a dot, which Arrow's dataset discovery (and so Feast's and ours) skips.
A vector feature (Arrow's fixed-size list) is stored as a variable-size list with NULLs of length 0: Parquet has
no fixed-size list anyway, and pyarrow 16 cannot write a NULL one (as a vector is once it outlives the ttl).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from common.errors import FeaturectlError
from common.storage import Storage, as_storage
from dsl.compile_feast import EVENT_TIMESTAMP

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
PARTITION = "date"


class OfflineTableError(FeaturectlError, RuntimeError):
    """The offline table cannot be read or written as asked; the message says why and what to do."""


@dataclass
class WriteStats:
    rows: int = 0
    files: int = 0


def partition_name(day: int) -> str:
    """`date=YYYY-MM-DD` of a day number (days since the epoch, UTC)."""
    return f"{PARTITION}={np.datetime64(day, 'D')}"


def _days(start_ms: int, end_ms: int) -> range:
    return range(start_ms // DAY_MS, (end_ms - 1) // DAY_MS + 1)


class RangeWriter:
    """Replaces [start_ms, end_ms) of the table at `path` with the rows given to `write`, on `commit`.

    Use as a context manager: leaving the block by an exception discards everything staged.
    """

    def __init__(self, path: Path | Storage, schema: pa.Schema, start_ms: int, end_ms: int):
        self.table = as_storage(path)
        self.schema = schema
        self.start_ms, self.end_ms = start_ms, end_ms
        self.staging = self.table.parent.child(f".staging-{self.table.name}-{uuid.uuid4().hex[:12]}")
        self.stats = WriteStats()
        self._parts = 0
        self._keys = schema.names[:schema.get_field_index(EVENT_TIMESTAMP) + 1]  # join keys and the time
        self._before: dict[int, list[pa.Table]] = {}  # per date: the keys and times of the rows before the range

    def __enter__(self) -> "RangeWriter":
        self.staging.make()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.staging.delete()

    def write(self, rows: pa.Table) -> None:
        """Stage rows (before `end`), one file per date they fall on."""
        if rows.num_rows == 0:
            return
        ms = rows.column(EVENT_TIMESTAMP).cast(pa.int64())
        if pc.max(ms).as_py() >= self.end_ms:
            raise OfflineTableError(f"{self.table}: a row at {pc.max(ms).as_py()} ms is past the range written, "
                                    f"which ends at {self.end_ms} ms")
        days = pc.divide(ms, DAY_MS).to_numpy()
        order = np.argsort(days, kind="stable")
        days = days[order]
        early = ms.to_numpy()[order] < self.start_ms
        rows = rows.take(order)
        cuts = [0, *(np.flatnonzero(np.diff(days)) + 1).tolist(), len(days)]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            day, part = int(days[lo]), rows.slice(lo, hi - lo)
            self._stage(day, part, f"part-{self._parts:05d}.parquet")
            self.stats.rows += hi - lo
            if early[lo:hi].any():
                self._before.setdefault(day, []).append(part.filter(pa.array(early[lo:hi])).select(self._keys))
        self._parts += 1

    def commit(self) -> WriteStats:
        """Carry over rows outside the range from touched dates (less those a row before the range replaces),
        then swap each touched partition in."""
        days = sorted({*_days(self.start_ms, self.end_ms), *self._before})
        for day in days:
            kept = self._rows_outside_range(day)
            if kept is not None and day in self._before:
                kept = self._not_replaced(kept, pa.concat_tables(self._before[day]))
            if kept is not None and kept.num_rows:
                self._stage(day, kept, "part-kept.parquet")
        for day in days:
            current, staged = self.table.child(partition_name(day)), self.staging.child(partition_name(day))
            if self.table.is_local:
                self._rename_in(Path(current.display), Path(staged.display))
            else:
                current.delete()
                staged.move_files(current)
        log.info("offline table %s: %d rows in %d files for [%d, %d)", self.table, self.stats.rows,
                 self.stats.files, self.start_ms, self.end_ms)
        return self.stats

    def _rename_in(self, current: Path, staged: Path) -> None:
        """Swap a staged partition folder in for the current one by two renames (the current one is retired
        into the staging folder, which goes on exit)."""
        retired = Path(self.staging.display) / ".retired"
        retired.mkdir(exist_ok=True)
        if current.exists():
            current.rename(retired / current.name)
        if staged.exists():
            current.parent.mkdir(parents=True, exist_ok=True)
            staged.rename(current)

    def _stage(self, day: int, rows: pa.Table, name: str) -> None:
        self.staging.write_parquet(f"{partition_name(day)}/{name}", storable(rows))
        self.stats.files += 1

    def _not_replaced(self, kept: pa.Table, new: pa.Table) -> pa.Table:
        """`kept` less its rows of the same join keys and time as a row of `new`."""
        index = kept.select(self._keys).append_column("__row", pa.array(np.arange(kept.num_rows)))
        left = index.join(new, keys=self._keys, join_type="left anti").column("__row").to_numpy()
        return kept.take(np.sort(left))

    def _rows_outside_range(self, day: int) -> pa.Table | None:
        if self.start_ms <= day * DAY_MS and (day + 1) * DAY_MS <= self.end_ms:
            return None
        partition = self.table.child(partition_name(day))
        dataset = partition.dataset()
        if dataset is None:
            return None
        table = dataset.to_table()
        ts = table.column(EVENT_TIMESTAMP).cast(pa.int64())
        outside = pc.or_(pc.less(ts, self.start_ms), pc.greater_equal(ts, self.end_ms))
        return _conform(table.filter(outside), self.schema, partition)


def storable(table: pa.Table) -> pa.Table:
    """`table` with each fixed-size list column as a variable-size list whose NULL rows hold no values."""
    for index, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type):
            column = table.column(index).combine_chunks()
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            lengths = np.where(valid, field.type.list_size, 0)
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            values = column.filter(pa.array(valid)).flatten()
            stored = pa.ListArray.from_arrays(offsets, values, mask=pa.array(~valid))
            table = table.set_column(index, pa.field(field.name, stored.type, field.nullable), stored)
    return table


def _conform(table: pa.Table, schema: pa.Schema, where: Storage) -> pa.Table:
    """Old rows in the current schema: columns the view no longer has dropped, new ones NULL."""
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        try:
            columns.append(table.column(field.name).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise OfflineTableError(
                f"{where}: column `{field.name}` is {table.schema.field(field.name).type}, the view now makes "
                f"{field.type}; backfill whole days (midnight to midnight, UTC) or delete {where.parent} and "
                "backfill again") from exc
    return pa.table(columns, schema=schema)


def read_range(path: Path | Storage, columns: list[str], start_ms: int, end_ms: int) -> pa.Table:
    """Rows with start_ms <= event_timestamp < end_ms, reading only the partitions of those dates."""
    dataset = as_storage(path).dataset(partitioning="hive")
    if dataset is None:
        raise FileNotFoundError(path)
    missing = [c for c in columns if c not in dataset.schema.names]
    if missing:
        raise OfflineTableError(f"offline table {path} lacks columns {missing}: re-run `featurectl backfill` "
                                "for this view")
    first, last = (partition_name(day).split("=", 1)[1] for day in (start_ms // DAY_MS, (end_ms - 1) // DAY_MS))
    ts = ds.field(EVENT_TIMESTAMP).cast(pa.int64())
    row_filter = ((ds.field(PARTITION) >= first) & (ds.field(PARTITION) <= last)
                  & (ts >= start_ms) & (ts < end_ms))
    return dataset.to_table(columns=columns, filter=row_filter)
