"""What an asset source hands the pipeline, without Ray: meshes as `trimesh.load(path, force="mesh")` reads them
(a glTF's buffers beside it too), non-finite vertices refused rather than dropped with their faces, and lists or
folders whose rows cannot be assets (no id, an id twice, no path, no rows) answered per row, never with a
traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trimesh

from batch.assets.inventory import AssetListError, take_inventory
from batch.assets.mesh_features import MeshDecodeError, decode_mesh, mesh_features
from batch.assets.pipeline import _missing_failures
from batch.assets.state import AssetRecord
from dsl.assets import AssetSource, ShapeDescriptor

DESCRIPTOR = ShapeDescriptor(bins=16, pairs=512)


def _features(mesh) -> dict:
    return mesh_features(mesh, DESCRIPTOR).values


def test_a_scene_of_several_geometries_reads_as_trimesh_load_reads_it(tmp_path: Path):
    scene = trimesh.Scene()
    scene.add_geometry(trimesh.creation.box(extents=(1, 2, 3)),
                       transform=trimesh.transformations.translation_matrix((4, 0, 0)))
    scene.add_geometry(trimesh.creation.icosphere(subdivisions=2))
    scene.add_geometry(trimesh.creation.annulus(r_min=0.5, r_max=1, height=0.2))
    path = tmp_path / "parts.glb"
    path.write_bytes(scene.export(file_type="glb"))
    assert _features(decode_mesh(path.read_bytes(), "glb", path)) == _features(trimesh.load(path, force="mesh"))


def test_a_gltf_reads_its_buffers_beside_it_and_names_a_missing_one(tmp_path: Path):
    files = trimesh.creation.capsule(height=2, radius=0.5).export(file_type="gltf")
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    path = tmp_path / "model.gltf"
    assert _features(decode_mesh(path.read_bytes(), "gltf", path)) == _features(trimesh.load(path, force="mesh"))
    buffers = [name for name in files if name.endswith(".bin")]
    assert buffers, "trimesh wrote the buffers apart: the case this test is for"
    (tmp_path / buffers[0]).unlink()
    with pytest.raises(MeshDecodeError, match=buffers[0]):
        decode_mesh(path.read_bytes(), "gltf", path)


@pytest.mark.parametrize("file_type", ["obj", "ply"])
def test_a_non_finite_vertex_fails_the_file_rather_than_losing_its_faces(file_type: str):
    mesh = trimesh.creation.icosphere(subdivisions=1)
    vertices = mesh.vertices.copy()
    vertices[3] = (np.nan, 0.0, np.inf)
    data = trimesh.Trimesh(vertices, mesh.faces, process=False).export(file_type=file_type)
    data = data.encode() if isinstance(data, str) else data
    assert len(trimesh.load(trimesh.util.wrap_as_stream(data), file_type=file_type, force="mesh").faces) < len(
        mesh.faces), "trimesh's own load drops the faces: the case this test is for"
    with pytest.raises(MeshDecodeError, match="not finite"):
        decode_mesh(data, file_type)


def _list_source(tmp_path: Path, rows: dict) -> AssetSource:
    pq.write_table(pa.table(rows), tmp_path / "assets.parquet")
    return AssetSource("listed", assets="assets.parquet", embedding=DESCRIPTOR)


def _inventory(tmp_path: Path, source: AssetSource):
    return take_inventory(source, tmp_path, AssetRecord.load(tmp_path, source.name))


def test_list_rows_that_cannot_be_assets_are_named(tmp_path: Path):
    box = tmp_path / "box.stl"
    box.write_bytes(trimesh.creation.box().export(file_type="stl"))
    with pytest.raises(AssetListError, match=r"rows 2 have no asset_id"):
        _inventory(tmp_path, _list_source(tmp_path, {"asset_id": ["a", None], "path": ["box.stl"] * 2,
                                                     "updated_at": [1, 2]}))
    with pytest.raises(AssetListError, match=r"1 id\(s\) more than once, by row: `a` \(1, 3\); give each asset "
                                             r"one row"):
        _inventory(tmp_path, _list_source(tmp_path, {"asset_id": ["a", "b", "a"], "path": ["box.stl"] * 3,
                                                     "updated_at": [1, 2, 3]}))
    inventory = _inventory(tmp_path, _list_source(tmp_path, {"asset_id": ["a", "n"], "path": ["box.stl", None],
                                                             "updated_at": [1, 2]}))
    assert inventory.todo.column("asset_id").to_pylist() == ["a"] and inventory.listed == 2
    assert _missing_failures(inventory.missing).column("reason").to_pylist() == ["the asset list gives it no path"]
    empty = _inventory(tmp_path, _list_source(tmp_path, {"asset_id": pa.array([], pa.string()),
                                                         "path": pa.array([], pa.string()),
                                                         "updated_at": pa.array([], pa.int64())}))
    assert (empty.todo.num_rows, empty.missing.num_rows, empty.listed) == (0, 0, 0)


def test_a_folders_files_sharing_a_name_are_named(tmp_path: Path):
    folder = tmp_path / "meshes"
    folder.mkdir()
    for name in ("brick.ply", "brick.stl", "ball.v2.stl"):
        (folder / name).write_bytes(trimesh.creation.box().export(file_type=name.rsplit(".", 1)[1]))
    source = AssetSource("folder", assets="meshes", embedding=DESCRIPTOR)
    with pytest.raises(AssetListError, match=r"`brick` \(brick.ply, brick.stl\); a folder's ids are its file names "
                                             r"without the extension"):
        _inventory(tmp_path, source)
    (folder / "brick.stl").unlink()
    assert sorted(_inventory(tmp_path, source).todo.column("asset_id").to_pylist()) == ["ball.v2", "brick"]


def test_assets_similar_refuses_a_k_outside_its_range_as_given():
    from cli_helpers import featurectl

    for k in ("0", "1000", "-3"):
        done = featurectl("assets", "similar", "a1", "-k", k)
        assert done.returncode == 2 and f"Invalid value for -k: {k} is not an int from 1 to 999" in done.stderr
