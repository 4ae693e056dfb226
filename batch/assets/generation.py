"""Batch generation of assets: (prompt, asset) pairs through the Cube 3D engine on a Ray Data actor pool, the
meshes written as GLB files and added to an asset source, so that `batch.assets.pipeline` derives their features
with the same code as any other asset's (and generated content is searchable like the rest).

Each actor loads the models once (`inference.service.pipeline.Pipeline`: one GPU per actor when CUDA is present,
one CPU actor otherwise) and runs a block of prompts as one engine batch; the conditioning asset's features come
from the repo's online store, as the generation service's do. A generated asset's id is a hash of its prompt,
conditioning asset and seed, and its file is written by an atomic rename: a retried block writes the same files,
and a run repeated adds nothing new.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batch.assets.inventory import AssetListError, assets_location
from dsl.assets import ASSET_CATEGORY, ASSET_ID, ASSET_TIMESTAMP, AssetSource

GENERATED = "generated"  # the category of generated assets, and the sub-folder of their files
ACTOR_RESTARTS = 2
RESULT_SCHEMA = pa.schema([(ASSET_ID, pa.string()), ("prompt", pa.string()), ("condition_asset_id", pa.string()),
                           ("seed", pa.int64()), ("path", pa.string()), ("status", pa.string()),
                           ("reason", pa.string())])


def generated_id(prompt: str, condition: Optional[str], seed: int) -> str:
    digest = hashlib.sha1(f"{prompt}\x1f{condition or ''}\x1f{seed}".encode()).hexdigest()
    return f"gen_{digest[:16]}"


def read_prompts(path: Path) -> pa.Table:
    """prompt, condition_asset_id (the `asset_id` column, optional) and seed (optional, default 0) per row."""
    if not path.is_file():
        raise AssetListError(f"no prompts file at {path}: write a Parquet file with a `prompt` column (and "
                             "optionally `asset_id` and `seed`)")
    table = pq.read_table(path)
    if "prompt" not in table.column_names:
        raise AssetListError(f"prompts file {path} has no `prompt` column (it has: {', '.join(table.column_names)})")
    n = table.num_rows
    prompts = table.column("prompt").cast(pa.string())
    if n == 0 or prompts.null_count or any(not p.strip() for p in prompts.to_pylist()):
        raise AssetListError(f"prompts file {path} has no rows, or an empty prompt: give every row a prompt")
    condition = (table.column(ASSET_ID).cast(pa.string()) if ASSET_ID in table.column_names
                 else pa.nulls(n, pa.string()))
    seeds = table.column("seed").cast(pa.int64()) if "seed" in table.column_names else pa.array([0] * n, pa.int64())
    return pa.table({"prompt": prompts, "condition_asset_id": condition, "seed": pc.fill_null(seeds, 0)})


class CubeGenerator:
    """A Ray Data actor: the Cube 3D models loaded once, a block of prompts generated as one batch."""

    def __init__(self, config, out: str, repo: Optional[str], registry: Optional[str]):
        from inference.service.conditioning import AssetFeatureFetcher, online_store
        from inference.service.pipeline import Pipeline

        make_client = online_store(repo, registry, config.feature_timeout_s) if repo else None
        self.pipeline = Pipeline(config, AssetFeatureFetcher(make_client, config.feature_service))
        self.out = Path(out)

    def __call__(self, batch: pa.Table) -> pa.Table:
        from inference.service.pipeline import GenerationRequest

        rows = batch.to_pylist()
        requests = [GenerationRequest(r["prompt"], r["condition_asset_id"], int(r["seed"])) for r in rows]
        jobs: list = []
        self.pipeline.run_batch(requests, jobs.append)
        return pa.Table.from_pylist([self._write(row, job) for row, job in zip(rows, jobs)], RESULT_SCHEMA)

    def _write(self, row: dict, job) -> dict:
        from inference.errors import MeshError
        from inference.mesh import Mesh, marching_cubes

        asset_id = generated_id(row["prompt"], row["condition_asset_id"], row["seed"])
        out = {**row, ASSET_ID: asset_id}
        try:
            vertices, faces = marching_cubes(job.grid.values, self.pipeline.shapes.cfg.bounds, mask=job.grid.surface)
        except (RuntimeError, MeshError) as exc:  # scikit-image: no surface at the iso value
            return {**out, "status": "failed", "reason": f"the tokens decode to no surface ({exc})"}
        finally:
            job.grid.close(unlink=True)
        path = self.out / f"{asset_id}.glb"
        staged = self.out / f".{asset_id}.{uuid.uuid4().hex[:8]}.glb"
        staged.write_bytes(Mesh(vertices, faces).to_trimesh().export(file_type="glb"))
        os.replace(staged, path)
        return {**out, "path": str(path), "status": "ok"}


def generate(prompts: pa.Table, out: Path, config, actors: int, repo: Optional[str] = None,
             registry: Optional[str] = None, on_rows: Optional[Callable[[int], None]] = None) -> Iterator[pa.Table]:
    """Result rows (RESULT_SCHEMA) of every prompt, generated by `actors` actors of the current Ray session."""
    import ray.data
    import torch

    _quiet_ray_data()
    out.mkdir(parents=True, exist_ok=True)
    size = max(config.batch_buckets)
    blocks = [prompts.slice(lo, size) for lo in range(0, prompts.num_rows, size)]
    gpus = 1 if torch.cuda.is_available() and config.torch_device.type == "cuda" else 0
    dataset = ray.data.from_arrow(blocks).map_batches(
        CubeGenerator, batch_format="pyarrow", batch_size=size, num_gpus=gpus, num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=actors if gpus else 1),
        fn_constructor_kwargs={"config": config, "out": str(out), "repo": repo, "registry": registry},
        max_restarts=ACTOR_RESTARTS, max_task_retries=ACTOR_RESTARTS)
    for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        if on_rows:
            on_rows(batch.num_rows)
        yield batch


def _quiet_ray_data() -> None:
    """Our progress bars instead of Ray Data's; no per-dataset start/finish lines or tuning advice."""
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)


@dataclass
class AddedAssets:
    listing: Path
    added: int


def generated_folder(source: AssetSource, data_dir: Path) -> Path:
    location = assets_location(source, data_dir)
    return (location.parent if source.assets_is_list else location) / GENERATED


def add_to_source(source: AssetSource, data_dir: Path, generated: pa.Table) -> Optional[AddedAssets]:
    """List the generated files in the source's Parquet list (a folder source finds them by itself), replacing
    rows of the same ids; the list is replaced by an atomic rename."""
    if not source.assets_is_list or not generated.num_rows:
        return None
    listing = assets_location(source, data_dir)
    current = pq.read_table(listing)
    now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    n = generated.num_rows
    rows = {ASSET_ID: generated.column(ASSET_ID), "path": generated.column("path"),
            ASSET_TIMESTAMP: pa.array([now_ms] * n, pa.int64()), ASSET_CATEGORY: pa.array([GENERATED] * n)}
    added = pa.table({name: rows[name] if name in rows else pa.nulls(n, current.schema.field(name).type)
                      for name in current.column_names}).cast(current.schema)
    kept = current.filter(pc.invert(pc.is_in(current.column(ASSET_ID), value_set=generated.column(ASSET_ID)
                                             .combine_chunks())))
    staged = listing.parent / f".{listing.name}.{uuid.uuid4().hex[:8]}"
    pq.write_table(pa.concat_tables([kept, added]), staged)
    os.replace(staged, listing)
    return AddedAssets(listing, n)
