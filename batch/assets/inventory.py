"""The assets of a source and which of them need deriving: listed (a Parquet list or a folder), their files
stat'ed, and compared with the record of the last runs.

An asset is derived again when its file's path, size or modification time, or its listed update time, differ
from those recorded (a stat per file, no read); the task that derives it then compares the file's SHA-256 with
the recorded one, so a file touched but not changed costs a read and a hash, never a new row. A file that failed
is tried again when it changes. An asset's update time is the later of its listed `updated_at` and its file's
modification time, so a file rewritten without a new list row is still a newer version (Redis keeps a row only
when it is newer than the one it holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batch.assets.derive import INPUT_SCHEMA
from batch.assets.state import AssetRecord
from common.errors import FeaturectlError
from dsl.assets import ASSET_CATEGORY, ASSET_ID, ASSET_TIMESTAMP, MESH_FILE_TYPES, AssetSource

FINGERPRINT = ["path", "size", "mtime_ns", ASSET_TIMESTAMP]


class AssetListError(FeaturectlError, ValueError):
    """The asset list or folder of a source cannot be read; the message says why and what to do."""


@dataclass
class Inventory:
    todo: pa.Table  # INPUT_SCHEMA: the assets to derive
    missing: pa.Table  # asset_id, path: listed files that do not exist
    listed: int
    same: int = 0  # not derived again: the file is the version derived last
    still_failed: int = 0  # not tried again: the file is the one that failed


def assets_location(source: AssetSource, data_dir: Path) -> Path:
    path = Path(source.assets)
    return path if path.is_absolute() else data_dir / path


def list_assets(source: AssetSource, data_dir: Path) -> pa.Table:
    """asset_id, absolute path, category (NULL from a folder), listed update time (ms; 0 from a folder)."""
    location = assets_location(source, data_dir)
    if source.assets_is_list:
        if not location.is_file():
            raise AssetListError(f"asset source `{source.name}`: no asset list at {location}; write one (columns "
                                 "asset_id, path, updated_at[, category]) or run `featurectl datagen assets N`")
        table = pq.read_table(location)
        missing = {ASSET_ID, "path", ASSET_TIMESTAMP} - set(table.column_names)
        if missing:
            raise AssetListError(f"asset list {location} lacks columns {sorted(missing)}: it needs asset_id, path "
                                 "and updated_at (epoch ms), and may have category")
        paths = [None if p is None else str(p if Path(p).is_absolute() else location.parent / p)
                 for p in table.column("path").to_pylist()]
        category = (table.column(ASSET_CATEGORY).cast(pa.string()) if ASSET_CATEGORY in table.column_names
                    else pa.nulls(table.num_rows, pa.string()))
        return pa.table({ASSET_ID: table.column(ASSET_ID).cast(pa.string()), "path": pa.array(paths, pa.string()),
                         ASSET_CATEGORY: category, ASSET_TIMESTAMP: table.column(ASSET_TIMESTAMP).cast(pa.int64())})
    if not location.is_dir():
        raise AssetListError(f"asset source `{source.name}`: {location} is not a folder; give assets= a folder of "
                             f"mesh files ({', '.join(MESH_FILE_TYPES)}) or a Parquet list")
    files = sorted(p for p in location.rglob("*") if p.suffix.lstrip(".").lower() in MESH_FILE_TYPES)
    return pa.table({ASSET_ID: [p.stem for p in files], "path": [str(p) for p in files],
                     ASSET_CATEGORY: pa.nulls(len(files), pa.string()), ASSET_TIMESTAMP: [0] * len(files)},
                    schema=pa.schema([f for f in INPUT_SCHEMA if f.name in (ASSET_ID, "path", ASSET_CATEGORY,
                                                                             ASSET_TIMESTAMP)]))


def take_inventory(source: AssetSource, data_dir: Path, record: AssetRecord) -> Inventory:
    """The listed assets whose file differs from the recorded version (or failure), stat'ed, with known hashes."""
    listed = list_assets(source, data_dir)
    _check_ids(source, listed)
    stats = [_stat(p) for p in listed.column("path").to_pylist()]
    exists = pa.array([s is not None for s in stats], pa.bool_())
    sizes = pa.array([s.st_size if s else None for s in stats], pa.int64())
    mtimes = pa.array([s.st_mtime_ns if s else None for s in stats], pa.int64())
    updated = pc.max_element_wise(listed.column(ASSET_TIMESTAMP), pc.divide(mtimes, 1_000_000))
    listed = listed.set_column(listed.column_names.index(ASSET_TIMESTAMP), ASSET_TIMESTAMP, updated)
    listed = listed.append_column("size", sizes).append_column("mtime_ns", mtimes)
    known = {row[ASSET_ID]: row for row in record.derived.to_pylist()}
    failed = {row[ASSET_ID]: row for row in record.failures.to_pylist()}
    rows, same, still_failed = [], 0, 0
    for row in listed.filter(exists).to_pylist():
        derived, failure = known.get(row[ASSET_ID]), failed.get(row[ASSET_ID])
        if failure is not None and all(failure[k] == row[k] for k in FINGERPRINT):
            still_failed += 1
        elif derived is not None and all(derived[k] == row[k] for k in FINGERPRINT):
            same += 1
        else:
            rows.append({**row, "known_sha256": derived["sha256"] if derived else None})
    missing = listed.filter(pc.invert(exists)).select([ASSET_ID, "path"])
    return Inventory(pa.Table.from_pylist(rows, INPUT_SCHEMA), missing, listed.num_rows, same, still_failed)


def _check_ids(source: AssetSource, listed: pa.Table) -> None:
    """Every asset has one id, given once: an AssetListError naming the rows (or files) that break it."""
    ids, paths = listed.column(ASSET_ID).to_pylist(), listed.column("path").to_pylist()
    where = "row" if source.assets_is_list else "file"
    unnamed = [str(i + 1) for i, asset in enumerate(ids) if not asset]
    if unnamed:
        raise AssetListError(f"asset list of source `{source.name}`: rows {', '.join(unnamed[:10])} have no "
                             f"asset_id: give every row one")
    seen: dict[str, list[int]] = {}
    for i, asset in enumerate(ids):
        seen.setdefault(asset, []).append(i)
    twice = {asset: rows for asset, rows in seen.items() if len(rows) > 1}
    if twice:
        def named(i: int) -> str:
            return str(i + 1) if source.assets_is_list else Path(paths[i]).name
        shown = "; ".join(f"`{asset}` ({', '.join(named(i) for i in rows)})" for asset, rows in list(twice.items())[:5])
        advice = ("give each asset one row" if source.assets_is_list
                  else "a folder's ids are its file names without the extension: rename one of each")
        raise AssetListError(f"asset source `{source.name}` has {len(twice)} id(s) more than once, by {where}: "
                             f"{shown}; {advice}")


def _stat(path: Optional[str]):
    if path is None:
        return None
    try:
        return Path(path).stat()
    except OSError:
        return None
