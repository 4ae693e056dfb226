"""Removing one entity's rows from Parquet folders (offline feature tables, source histories) in place.

Each file holding rows of the entity is rewritten without them: the kept rows go to a hidden file beside it, which
then replaces it by one rename, so a reader sees the old file or the new one, never half of either; a file left
with no rows is removed. Files without the entity's rows are not touched. Hidden files and folders (a backfill's
staging, Arrow's own `_` files) are skipped, as Arrow's dataset discovery skips them, but not a hive partition
folder whose key starts with `_` (the feature logs' `__log_date=...`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def parquet_files(folder: Path) -> Iterator[Path]:
    """The data files of a Parquet folder (or the file itself), as a dataset reader would find them."""
    if folder.is_file():
        yield folder
        return
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and (not d.startswith("_") or "=" in d))
        for name in sorted(files):
            if name.endswith(".parquet") and not name.startswith((".", "_")):
                yield Path(root) / name


def _mask(table: pa.Table, given: Mapping[str, Any]) -> pa.ChunkedArray:
    mask = None
    for name, value in given.items():
        column = table.column(name)
        equal = pc.fill_null(pc.equal(column, pa.scalar(value).cast(column.type)), False)
        mask = equal if mask is None else pc.and_(mask, equal)
    return mask


def has_columns(file: Path, names: Mapping[str, Any]) -> bool:
    return set(names) <= set(pq.read_schema(file).names)


def remove_rows(file: Path, given: Mapping[str, Any], dry_run: bool = False) -> int:
    """Remove from `file` the rows whose columns equal `given` (unless `dry_run`); how many there were."""
    keys = pq.read_table(file, columns=list(given))
    found = pc.sum(_mask(keys, given).cast(pa.int64())).as_py() or 0
    if found == 0 or dry_run:
        return found
    table = pq.read_table(file)
    kept = table.filter(pc.invert(_mask(table, given)))
    if kept.num_rows == 0:
        file.unlink()
        return found
    staged = file.with_name(f".forget-{uuid.uuid4().hex[:12]}-{file.name}")
    try:
        pq.write_table(kept, staged)
        os.replace(staged, file)
    finally:
        staged.unlink(missing_ok=True)
    return found
