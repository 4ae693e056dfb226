"""What the asset test modules share: one local Ray per module, and a scratch copy of the example repo (whose asset
source `asset_meshes` and view `asset_geometry` they process), its meshes written by `featurectl datagen assets`'
generator."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from cli_helpers import ROOT, copy_example_repo

EXAMPLE_DESCRIPTOR = "embedding=ShapeDescriptor(bins=64)"


def start_ray(workers: int = 2) -> None:
    import ray

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=128 * 1024**2, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": path}})


def asset_repo(tmp: Path, project: str, n_assets: int, pairs: int = 4096) -> Path:
    """The example repo, its D2 descriptor drawing `pairs` pairs, `n_assets` meshes under its data folder's
    `assets/`."""
    from feature_repo.sample_meshes import write_assets

    repo = copy_example_repo(tmp, project, {"path": f"sqlite:///{tmp / project}.db"}, data_dir=tmp / "data")
    definitions = (repo / "features.py").read_text()
    assert EXAMPLE_DESCRIPTOR in definitions, "the example repo's asset source changed: update EXAMPLE_DESCRIPTOR"
    (repo / "features.py").write_text(definitions.replace(EXAMPLE_DESCRIPTOR,
                                                          f"embedding=ShapeDescriptor(bins=64, pairs={pairs})"))
    write_assets(n_assets, tmp / "data" / "assets", int(time.time() * 1000))
    return repo


def process(repo: Path, workers: int = 2):
    """`featurectl assets process --no-materialize` in-process, in the module's Ray."""
    from batch.assets.pipeline import process_assets
    from batch.backfill import BackfillTarget
    from common.config import load_config
    from dsl import load_repo

    cfg = load_config(repo)
    definitions = load_repo(repo)
    view = definitions.view("asset_geometry")
    target = BackfillTarget(cfg.data_dir, cfg.registry_url, cfg.project)
    return process_assets(view.source, [view], target, workers)


def offline_rows(repo: Path):
    import pyarrow.dataset as ds

    from common.config import load_config

    cfg = load_config(repo)
    return ds.dataset(cfg.data_dir / "offline" / "asset_geometry", format="parquet").to_table()
