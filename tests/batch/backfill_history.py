"""A small, fixed history for the backfill and training-set tests: 28 hours of interactions, a catalog and derived
meshes that change inside the backfilled range, as Parquet where the example repo's sources read them, and its
backfill.

The backfill and its batch TableEnvironment are made once per test session and shared by both suites (PyFlink
takes seconds to start, a backfill job more); pytest would make a session fixture once per module that
imports it, so they are cached here instead.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from batch.assets.mesh_features import mesh_features
from batch.backfill import BackfillSummary, BackfillTarget, backfill
from common.flink import create_table_env
from cli_helpers import ROOT
from dsl import AssetSource, Repository
from dsl.compile_flink import source_path
from feature_repo.sample_data import SampleSpec, catalog_table, interactions_table
from feature_repo.sample_meshes import asset_id, asset_mesh

HOUR_MS = 3_600_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, first event
EVENTS_END_MS = START_MS + 28 * HOUR_MS  # 2026-01-02T04:00:00Z, after the last event
CATALOG_CHANGE_MS = START_MS + 22 * HOUR_MS + 30 * 60_000  # some assets change category and style
SPEC = SampleSpec(n_assets=30, n_users=200, seed=5)
T0_MS = START_MS + 20 * HOUR_MS  # the backfilled range: windows ending soon after T0 need tiles from before it
T1_MS = EVENTS_END_MS + 26 * HOUR_MS  # past the last event's 24 h window, so the emptied rows are in range


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def write_history(repo: Repository, data_dir: Path, n_events: int = 6_000) -> dict[str, list[dict]]:
    """Interactions (two files) and the catalog (initial rows + a later change of 10 assets); returns the raw
    rows per source name, for the oracles."""
    events = interactions_table(SPEC, START_MS, EVENTS_END_MS, n_events)
    catalog = catalog_table(SPEC, START_MS)
    changed = catalog.slice(0, 10)
    rng = np.random.default_rng(11)
    changed = changed.set_column(changed.schema.get_field_index("category"), "category",
                                 pa.array(rng.choice(["vehicle", "plant"], 10)))
    changed = changed.set_column(changed.schema.get_field_index("style"), "style",
                                 pa.array(rng.choice(["voxel", "cartoon"], 10)))
    changed = changed.set_column(changed.schema.get_field_index("updated_at"), "updated_at",
                                 pa.array(np.full(10, CATALOG_CHANGE_MS)))
    sources = {v.source.name: v.source for v in repo.views}
    meshes = [mesh_rows(sources["asset_meshes"], range(SPEC.n_assets), START_MS + HOUR_MS),
              mesh_rows(sources["asset_meshes"], range(3), CATALOG_CHANGE_MS, mesh_offset=12)]
    files = {"asset_interactions": [events.slice(0, n_events // 2), events.slice(n_events // 2)],
             "asset_catalog": [catalog, changed], "asset_meshes": meshes}
    for name, tables in files.items():
        folder = source_path(sources[name], data_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for i, table in enumerate(tables):
            pq.write_table(table, folder / f"part-{i}.parquet")
    return {"asset_interactions": events.to_pylist(), "asset_catalog": pa.concat_tables([catalog, changed]).to_pylist(),
            "asset_meshes": pa.concat_tables(meshes).to_pylist()}


def mesh_rows(source: AssetSource, assets: range, updated_at: int, mesh_offset: int = 0) -> pa.Table:
    """The rows `featurectl assets process` derives for sample assets `assets` (with the meshes of assets
    `mesh_offset` further on: another shape, a new version), all updated at `updated_at`."""
    rows = []
    for index in assets:
        features = mesh_features(asset_mesh(index + mesh_offset, seed=7), source.embedding)
        rows.append({"asset_id": asset_id(index), "category": "sample", "updated_at": updated_at, **features.values,
                     source.embedding.name: features.embedding.tolist()})
    return pa.Table.from_pylist(rows, pa.schema([pa.field(n, k.arrow_type()) for n, k in source.schema.items()]))


def example_repo_copy(folder: Path, data_dir: Path, registry_url: str) -> Path:
    """The example repo's definitions in `folder`, with its data folder and registry pointed elsewhere."""
    folder.mkdir(parents=True)
    shutil.copy(ROOT / "feature_repo" / "features.py", folder / "features.py")
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["registry"]["path"] = registry_url
    settings["platform"]["data_dir"] = str(data_dir)
    (folder / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return folder


@dataclass(frozen=True)
class Backfilled:
    target: BackfillTarget
    events: dict[str, list[dict]]  # raw rows per source name
    summary: BackfillSummary


_SESSION: dict[str, object] = {}


def batch_env():
    """The session's batch TableEnvironment."""
    if "env" not in _SESSION:
        _SESSION["env"] = create_table_env(streaming=False)
    return _SESSION["env"]


def backfilled_history(tmp_path_factory, repo: Repository) -> Backfilled:
    """The history above, backfilled over [T0, T1) for every view of the example repo, once per session."""
    if "backfilled" not in _SESSION:
        tmp = tmp_path_factory.mktemp("backfilled")
        events = write_history(repo, tmp / "data")
        target = BackfillTarget(tmp / "data", f"sqlite:///{tmp / 'registry.db'}", "assets")
        summary = backfill(repo.views, utc(T0_MS), utc(T1_MS), target, env=batch_env())
        _SESSION["backfilled"] = Backfilled(target, events, summary)
    return _SESSION["backfilled"]
