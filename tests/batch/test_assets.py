"""`featurectl assets process` on a real local Ray: features equal trimesh's own and the in-process loop's,
incremental runs, failures, a Ray worker SIGKILLed mid-run, materialization read back by Feast; `bench assets`
runs every side."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import trimesh

from cli_helpers import featurectl, register_repo, sibling

pytestmark = pytest.mark.integration
env = sibling("assets_env", "batch")
N_ASSETS = 24


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    import ray

    env.start_ray()
    yield
    ray.shutdown()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return env.asset_repo(tmp_path, f"assets_{tmp_path.name[-12:].lower().replace('-', '_')}", N_ASSETS)


def _by_id(table) -> dict:
    return {row["asset_id"]: row for row in table.to_pylist()}


def test_features_equal_trimesh_figures_on_the_same_files(repo: Path):
    from batch.assets.mesh_features import d2_descriptor
    from dsl import MESH_FEATURES, ShapeDescriptor

    summary = env.process(repo)
    assert sum(t.num_rows for t in summary.result.derived) == N_ASSETS and not summary.result.failed
    rows = _by_id(env.offline_rows(repo))
    listing = _by_id(pq.read_table(repo.parent / "data/assets/assets.parquet"))
    assert set(rows) == set(listing)
    watertight = 0
    for asset_id, row in rows.items():
        mesh = trimesh.load(repo.parent / "data/assets" / listing[asset_id]["path"], force="mesh")
        assert [row["extent_x"], row["extent_y"], row["extent_z"]] == pytest.approx(list(mesh.extents))
        assert (row["vertex_count"], row["face_count"]) == (len(mesh.vertices), len(mesh.faces))
        assert row["surface_area"] == pytest.approx(mesh.area)
        assert row["is_watertight"] is mesh.is_watertight and row["components"] == mesh.body_count
        assert row["volume"] == (pytest.approx(mesh.volume) if mesh.is_watertight else None)
        watertight += mesh.is_watertight
        embedding = np.asarray(row["shape_d2"], dtype=np.float32)
        assert embedding.shape == (64,) and np.linalg.norm(embedding) == pytest.approx(1.0, abs=1e-5)
        np.testing.assert_array_equal(embedding, d2_descriptor(mesh, ShapeDescriptor()))
    assert 0 < watertight < N_ASSETS  # the open bowls have no volume
    assert set(MESH_FEATURES) <= set(env.offline_rows(repo).column_names)


def _inventory_todo(repo: Path):
    from batch.assets.inventory import take_inventory
    from batch.assets.state import AssetRecord
    from common.config import load_config
    from dsl import load_repo

    source = load_repo(repo).view("asset_geometry").source
    data_dir = load_config(repo).data_dir
    return source, take_inventory(source, data_dir, AssetRecord.load(data_dir, source.name)).todo


def test_ray_blocks_give_the_rows_of_one_in_process_call(repo: Path):
    from batch.assets.derive import derive_batch
    from batch.assets.pipeline import derive_assets

    source, todo = _inventory_todo(repo)
    (repo.parent / "data/assets/asset_000004.obj").write_text("v 0 0 0\nf 1 1 1 broken\n")
    blocks = list(derive_assets(todo, source.embedding, 2))
    assert len(blocks) > 2 and "failed" in pa.concat_tables(blocks).column("status").to_pylist()
    assert pa.concat_tables(blocks).sort_by("asset_id").equals(derive_batch(todo, source.embedding).sort_by("asset_id"))


def test_block_sizes_cover_every_asset_once_and_shrink_towards_the_end():
    from batch.assets.pipeline import MAX_BLOCK_ASSETS, MIN_BLOCK_ASSETS, block_sizes

    for n, workers in ((1, 1), (3, 2), (24, 2), (1600, 1), (1600, 2), (5000, 16)):
        sizes = block_sizes(n, workers)
        assert sum(sizes) == n and all(0 < s <= MAX_BLOCK_ASSETS for s in sizes)
        assert sizes == sorted(sizes, reverse=True) and all(s >= MIN_BLOCK_ASSETS for s in sizes[:-1])
    assert block_sizes(1600, 2)[0] == MAX_BLOCK_ASSETS and block_sizes(1600, 2)[-1] < MAX_BLOCK_ASSETS // 4


def test_more_workers_than_the_cluster_has_fail_in_one_line_and_free_the_cluster(repo: Path, monkeypatch):
    from batch.assets import pipeline

    source, todo = _inventory_todo(repo)
    monkeypatch.setattr(pipeline, "GROUP_TIMEOUT_S", 1.0)
    with pytest.raises(pipeline.AssetPipelineError, match="did not free 3 CPUs"):
        list(pipeline.derive_assets(todo, source.embedding, 3))
    assert sum(b.num_rows for b in pipeline.derive_assets(todo, source.embedding, 2)) == N_ASSETS


def test_d2_ignores_pose_and_scale_and_tells_shapes_apart():
    from batch.assets.mesh_features import d2_descriptor
    from dsl import ShapeDescriptor

    descriptor = ShapeDescriptor(pairs=20_000)
    torus = trimesh.creation.torus(1.0, 0.3)
    moved = torus.copy().apply_scale(3.0).apply_transform(trimesh.transformations.random_rotation_matrix())
    box = trimesh.creation.box(extents=[1.0, 1.0, 1.0])
    same = np.linalg.norm(d2_descriptor(torus, descriptor) - d2_descriptor(moved, descriptor))
    other = np.linalg.norm(d2_descriptor(torus, descriptor) - d2_descriptor(box, descriptor))
    assert same < 0.1 < other


def test_incremental_run_touches_only_changed_files(repo: Path):
    from feature_repo.sample_meshes import asset_mesh

    env.process(repo)
    again = env.process(repo)
    assert (again.result.derived, again.result.unchanged, again.result.failed) == ([], [], [])
    assert (again.result.listed, again.result.same, again.result.still_failed) == (N_ASSETS, N_ASSETS, 0)
    folder = repo.parent / "data/assets"
    asset_mesh(100, seed=1).export(folder / "asset_000002.ply")  # new content (index 2 is a PLY file)
    touched = folder / "asset_000008.ply"
    os.utime(touched, ns=(time.time_ns(), time.time_ns()))  # same content, new mtime
    third = env.process(repo)
    assert [r["asset_id"] for t in third.result.derived for r in t.to_pylist()] == ["asset_000002"]
    assert [r["asset_id"] for t in third.result.unchanged for r in t.to_pylist()] == ["asset_000008"]
    assert third.result.same == N_ASSETS - 2  # every listed asset counted once: derived, hashed, or left alone
    offline = env.offline_rows(repo)
    versions = offline.filter(pc.equal(offline.column("asset_id"), "asset_000002")).sort_by("event_timestamp")
    assert versions.num_rows == 2 and offline.num_rows == N_ASSETS + 1
    assert versions.column("vertex_count")[1].as_py() == len(trimesh.load(folder / "asset_000002.ply").vertices)
    assert env.process(repo).result.derived == []
    shutil.rmtree(repo.parent / "data/offline/asset_geometry")  # the table gone, the record left: derive them all
    again = env.process(repo)
    assert sum(t.num_rows for t in again.result.derived) == N_ASSETS and len(env.offline_rows(repo)) == N_ASSETS


def test_a_corrupt_file_is_reported_and_the_rest_succeed(repo: Path):
    folder = repo.parent / "data/assets"
    (folder / "asset_000003.glb").write_bytes(b"glTF not really")
    (folder / "asset_000005.ply").unlink()
    summary = env.process(repo)
    failed = _by_id(summary.result.table("failed", summary.failures.schema))
    assert set(failed) == {"asset_000003", "asset_000005"}
    assert "not a readable glb mesh" in failed["asset_000003"]["reason"]
    assert failed["asset_000005"]["reason"] == "the file does not exist"
    assert len(env.offline_rows(repo)) == N_ASSETS - 2
    listed = featurectl("--repo", str(repo), "assets", "failures")
    assert listed.returncode == 0, listed.stderr
    assert "asset_meshes: 2 failed" in listed.stdout and "asset_000003" in listed.stdout
    again = env.process(repo).result  # the corrupt file is left alone, the missing one fails again
    assert (again.listed, again.same, again.still_failed, again.derived, again.unchanged) == (
        N_ASSETS, N_ASSETS - 2, 1, [], [])
    assert sum(t.num_rows for t in again.failed) == 1
    shutil.copyfile(folder / "asset_000000.glb", folder / "asset_000003.glb")  # fixed: derived, no longer failed
    fixed = env.process(repo)
    assert [r["asset_id"] for t in fixed.result.derived for r in t.to_pylist()] == ["asset_000003"]
    assert set(_by_id(fixed.failures)) == {"asset_000005"}


def _kill_first_busy_worker(killed: list, stop: threading.Event) -> None:
    """SIGKILL the first Ray worker seen running a map task (its process title names the task)."""
    import psutil

    while not stop.is_set():
        for process in psutil.process_iter(["pid", "cmdline"]):
            if any("ray::derive_batch" in part for part in process.info["cmdline"] or ()):
                os.kill(process.info["pid"], signal.SIGKILL)
                killed.append(process.info["pid"])
                return
        time.sleep(0.005)


def test_a_worker_killed_mid_run_still_ends_with_every_asset_once(tmp_path: Path):
    repo = env.asset_repo(tmp_path, "assets_sigkill", N_ASSETS, pairs=200_000)  # slower tasks: a wider target
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_busy_worker, args=(killed, stop), daemon=True)
    killer.start()
    try:
        summary = env.process(repo)
    finally:
        stop.set()
        killer.join()
    assert killed, "no Ray worker was seen running a task"
    ids = env.offline_rows(repo).column("asset_id").to_pylist()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == N_ASSETS
    assert sum(t.num_rows for t in summary.result.derived) == N_ASSETS


def test_commands_on_a_running_cluster_materialize_assets_and_generated_ones_for_feast(repo: Path, local_services):
    import ray

    store = register_repo(repo)
    address = ray.get_runtime_context().gcs_address
    done = featurectl("--repo", str(repo), "assets", "process", "--address", address, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"asset_meshes: {N_ASSETS} listed: {N_ASSETS} derived, 0 unchanged (0 of them read and hashed), 0 failed, "
            "0 failed before and not tried again") in done.stdout
    assert f"asset_geometry: materialized {N_ASSETS} assets" in done.stdout
    offline = _by_id(env.offline_rows(repo))
    features = ["asset_geometry:surface_area", "asset_geometry:components", "asset_geometry:shape_d2"]
    online = store.get_online_features(features=features,
                                       entity_rows=[{"asset_id": a} for a in sorted(offline)]).to_dict()
    assert online["surface_area"] == pytest.approx([offline[a]["surface_area"] for a in sorted(offline)])
    assert online["components"] == [offline[a]["components"] for a in sorted(offline)]
    for asset_id, vector in zip(sorted(offline), online["shape_d2"]):
        np.testing.assert_array_equal(np.asarray(vector, np.float32), np.asarray(offline[asset_id]["shape_d2"]))

    from batch.assets.generation import generated_id

    prompts = repo.parent / "prompts.parquet"
    pq.write_table(pa.table({"prompt": ["a small red vase"]}), prompts)
    done = featurectl("--repo", str(repo), "assets", "generate", str(prompts), "--config", "tiny", "--address",
                      address, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "generated 1 of 1 meshes" in done.stdout and ", 0 failed, 0 failed before" in done.stdout
    assert f"{N_ASSETS + 1} listed: 1 derived, {N_ASSETS} unchanged (0 of them read and hashed)" in done.stdout
    new_id = generated_id("a small red vase", None, 0)
    online = store.get_online_features(features=features, entity_rows=[{"asset_id": new_id}]).to_dict()
    assert len(online["shape_d2"][0]) == 64 and online["surface_area"][0] > 0


def test_generation_on_the_cpu_writes_meshes_and_their_features(repo: Path):
    from batch.assets.generation import add_to_source, generate, generated_folder, generated_id
    from common.config import load_config
    from dsl import load_repo
    from inference.service import ServiceConfig

    cfg = load_config(repo)
    source = load_repo(repo).view("asset_geometry").source
    prompts = pa.table({"prompt": ["a wooden chair", "a tall lamp"], "condition_asset_id": ["asset_000001", None],
                        "seed": pa.array([0, 3], pa.int64())})
    config = ServiceConfig.from_name("tiny", device="cpu")
    results = pa.concat_tables(generate(prompts, generated_folder(source, cfg.data_dir), config, actors=1))
    assert results.column("status").to_pylist() == ["ok", "ok"]
    ids = [generated_id("a wooden chair", "asset_000001", 0), generated_id("a tall lamp", None, 3)]
    assert sorted(results.column("asset_id").to_pylist()) == sorted(ids)
    add_to_source(source, cfg.data_dir, results)
    summary = env.process(repo)
    assert sum(t.num_rows for t in summary.result.derived) == N_ASSETS + 2 and not summary.result.failed
    rows = _by_id(env.offline_rows(repo))
    for row in results.to_pylist():
        mesh = trimesh.load(row["path"], force="mesh")
        derived = rows[row["asset_id"]]
        assert (derived["vertex_count"], derived["face_count"]) == (len(mesh.vertices), len(mesh.faces))
        assert derived["surface_area"] == pytest.approx(mesh.area) and len(derived["shape_d2"]) == 64
    listing = pq.read_table(repo.parent / "data/assets/assets.parquet")
    assert listing.num_rows == N_ASSETS + 2 and listing.column("category").to_pylist()[-2:] == ["generated"] * 2


def test_assets_benchmark_line_counts_every_side():
    done = featurectl("bench", "assets", "--assets", "24", "--rounds", "1", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "assets" and set(line["ours"]) == {"assets_per_s", "ray1_assets_per_s",
                                                                 "ray_data2_assets_per_s"}
    rounds = line["params"]["rounds"]
    assert set(rounds) == {"loop", "ray1", "ray2", "ray_data2"} and line["params"]["ray_data2_over_loop"] > 0
    assert all(len(rates) == 1 and rates[0] > 0 for rates in rounds.values())
