"""What `featurectl assets process` has derived, per asset source: the file version each asset's row came from
(`state.parquet`) and the assets whose file could not be derived, with the reason (`failures.parquet`).

The record lives beside the offline tables, in `DATA_DIR/offline/.assets-<source>/` (the dot keeps Arrow's, hence
Feast's, dataset discovery out of it), because it describes their contents: copying or deleting the data folder
keeps them consistent, and no database is needed to run the pipeline on a cluster's shared storage. It is replaced
by an atomic rename after the offline tables are written; a run killed before that leaves the old record, and the
next run derives those assets again and writes the same rows (writes are idempotent), so nothing is lost or
doubled.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsl.assets import ASSET_ID, ASSET_TIMESTAMP

STATE_SCHEMA = pa.schema([(ASSET_ID, pa.string()), ("path", pa.string()), (ASSET_TIMESTAMP, pa.int64()),
                          ("size", pa.int64()), ("mtime_ns", pa.int64()), ("sha256", pa.string())])
FAILURE_SCHEMA = pa.schema([(ASSET_ID, pa.string()), ("path", pa.string()), (ASSET_TIMESTAMP, pa.int64()),
                            ("size", pa.int64()), ("mtime_ns", pa.int64()), ("reason", pa.string()),
                            ("failed_at", pa.timestamp("ms", "UTC"))])


def state_folder(data_dir: Path, source: str) -> Path:
    return data_dir / "offline" / f".assets-{source}"


@dataclass
class AssetRecord:
    """The derived versions and the failures of one source, read whole (one row per asset: small)."""

    folder: Path
    derived: pa.Table
    failures: pa.Table

    @classmethod
    def load(cls, data_dir: Path, source: str) -> "AssetRecord":
        folder = state_folder(data_dir, source)
        return cls(folder, _read(folder / "state.parquet", STATE_SCHEMA),
                   _read(folder / "failures.parquet", FAILURE_SCHEMA))

    def update(self, derived: pa.Table, failed: pa.Table) -> None:
        """Replace the rows of the assets in `derived` (now derived) and `failed` (failed this time)."""
        touched = pa.chunked_array([*derived.column(ASSET_ID).chunks, *failed.column(ASSET_ID).chunks],
                                   pa.string())
        self.derived = pa.concat_tables([_without(self.derived, touched),
                                         derived.select(STATE_SCHEMA.names).cast(STATE_SCHEMA)])
        self.failures = pa.concat_tables([_without(self.failures, touched), failed.cast(FAILURE_SCHEMA)])

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for name, table in (("state.parquet", self.derived), ("failures.parquet", self.failures)):
            staged = self.folder / f".{name}.{uuid.uuid4().hex[:8]}"
            pq.write_table(table, staged)
            os.replace(staged, self.folder / name)


def _read(path: Path, schema: pa.Schema) -> pa.Table:
    return pq.read_table(path).cast(schema) if path.exists() else schema.empty_table()


def _without(table: pa.Table, ids: pa.ChunkedArray) -> pa.Table:
    return table.filter(pc.invert(pc.is_in(table.column(ASSET_ID), value_set=ids.combine_chunks())))
