"""One batch of assets -> one row each: the file read and hashed, the mesh decoded and measured, or the reason it
could not be. A pure function of its input (it runs in Ray tasks, which may run it again after a failure)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from batch.assets.mesh_features import MeshDecodeError, decode_mesh, mesh_features
from dsl.assets import ASSET_CATEGORY, ASSET_ID, ASSET_TIMESTAMP, MESH_FEATURES, ShapeDescriptor

OK, UNCHANGED, FAILED = "ok", "unchanged", "failed"
# What the inventory hands over per asset (`batch.assets.inventory`); `known_sha256` is the recorded content hash.
INPUT_SCHEMA = pa.schema([(ASSET_ID, pa.string()), ("path", pa.string()), (ASSET_CATEGORY, pa.string()),
                          (ASSET_TIMESTAMP, pa.int64()), ("size", pa.int64()), ("mtime_ns", pa.int64()),
                          ("known_sha256", pa.string())])


def output_schema(descriptor: ShapeDescriptor) -> pa.Schema:
    """The input's columns (less the known hash), the file's hash, the outcome, every mesh feature, the embedding."""
    fields = [f for f in INPUT_SCHEMA if f.name != "known_sha256"]
    fields += [pa.field("sha256", pa.string()), pa.field("status", pa.string()), pa.field("reason", pa.string())]
    fields += [pa.field(name, kind.arrow_type()) for name, kind in MESH_FEATURES.items()]
    fields.append(pa.field(descriptor.name, pa.list_(pa.float32(), descriptor.bins)))
    return pa.schema(fields)


def derive_batch(batch: pa.Table, descriptor: ShapeDescriptor) -> pa.Table:
    """Each asset of `batch` (INPUT_SCHEMA) derived; an unreadable file is a FAILED row with its reason, a file
    whose hash is the recorded one an UNCHANGED row without features."""
    schema = output_schema(descriptor)
    rows = [_derive(row, descriptor) for row in batch.to_pylist()]
    columns = {f.name: [row.get(f.name) for row in rows] for f in schema}
    return pa.table(columns, schema=schema)


def _derive(row: dict, descriptor: ShapeDescriptor) -> dict:
    out = {k: v for k, v in row.items() if k != "known_sha256"}
    path = Path(row["path"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        return {**out, "status": FAILED, "reason": f"cannot read the file: {exc.strerror or exc}"}
    out["sha256"] = hashlib.sha256(data).hexdigest()
    if out["sha256"] == row["known_sha256"]:
        return {**out, "status": UNCHANGED}
    try:
        features = mesh_features(decode_mesh(data, path.suffix.lstrip(".").lower(), path), descriptor)
    except MeshDecodeError as exc:
        return {**out, "status": FAILED, "reason": str(exc)}
    if not np.isfinite(features.embedding).all():
        return {**out, "status": FAILED, "reason": "the shape descriptor is not finite (a degenerate mesh)"}
    return {**out, **features.values, descriptor.name: features.embedding.tolist(), "status": OK}
