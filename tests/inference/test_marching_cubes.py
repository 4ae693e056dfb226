"""Marching cubes in torch against scikit-image's on the same grids, the GLB writer, and the device mesh path of
the service (on the CPU here; on CUDA where there is one)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from scipy.ndimage import gaussian_filter
from scipy.spatial import cKDTree
from skimage import measure

from inference.errors import MeshError
from inference.glb import glb_bytes
from inference.marching_cubes import marching_cubes_torch
from inference.mesh import device_surface, marching_cubes

trimesh = pytest.importorskip("trimesh")


def smooth_field(shape: tuple[int, int, int], sigma: float, seed: int) -> np.ndarray:
    """Smoothed noise: many separate surfaces, saddles and ambiguous cubes, none on a grid point."""
    return gaussian_filter(np.random.default_rng(seed).standard_normal(shape), sigma).astype(np.float32)


def same_triangles(ours_v, ours_f, ref_v, ref_f) -> tuple[float, bool]:
    """(largest distance from one of our vertices to the nearest reference vertex, same oriented triangles)."""
    dist, match = cKDTree(ref_v).query(ours_v)
    canon = lambda faces: {tuple(np.roll(f, -int(np.argmin(f)))) for f in faces}  # noqa: E731  same winding
    return float(dist.max()), len(set(match)) == len(match) and canon(match[ours_f]) == canon(ref_f)


@pytest.mark.parametrize("shape, sigma, seed", [((9, 10, 11), 1.0, 0), ((33, 33, 33), 2.0, 1),
                                                ((40, 31, 25), 1.2, 2)])
def test_same_surface_as_scikit_images_classic_method(shape, sigma, seed):
    field = smooth_field(shape, sigma, seed)
    verts, faces = marching_cubes_torch(torch.from_numpy(field))
    ref_v, ref_f, _, _ = measure.marching_cubes(field, 0.0, method="lorensen")
    dist, same = same_triangles(verts.numpy(), faces.numpy(), ref_v, np.ascontiguousarray(ref_f[:, ::-1]))
    assert dist < 1e-4 and same


@pytest.mark.parametrize("seed", [3, 4])
def test_within_half_a_cell_and_half_a_percent_of_the_default_lewiner_surface(seed):
    field = smooth_field((48, 48, 48), 1.5, seed)
    verts, faces = marching_cubes_torch(torch.from_numpy(field))
    ref_v, ref_f, _, _ = measure.marching_cubes(field, 0.0)
    dist, _ = cKDTree(ref_v).query(verts.numpy())
    assert dist.max() < 0.5
    assert abs(len(faces) - len(ref_f)) <= 0.005 * len(ref_f)


def test_a_closed_surface_is_watertight_and_faces_outwards_like_the_host_path():
    g, bounds = 41, 1.05
    ax = np.linspace(-bounds, bounds, g, dtype=np.float32)
    x, y, z = np.meshgrid(ax, ax, ax, indexing="ij")
    field = 0.6 - np.sqrt(x * x + y * y + (1.5 * z) ** 2) + 0.05 * np.sin(9 * x) * np.cos(7 * y)
    verts, faces = device_surface(torch.from_numpy(field), bounds)
    mesh = trimesh.Trimesh(verts.numpy(), faces.numpy(), process=False)
    host = trimesh.Trimesh(*marching_cubes(field, bounds), process=False)
    assert mesh.is_watertight and mesh.volume > 0 and host.volume > 0
    assert abs(mesh.volume - host.volume) < 1e-3 * host.volume
    assert np.allclose(mesh.bounds, host.bounds, atol=1e-5)


def test_no_crossing_or_a_flat_grid_is_a_mesh_error():
    with pytest.raises(MeshError, match="does not cross level 0"):
        marching_cubes_torch(torch.ones(5, 5, 5))
    with pytest.raises(MeshError, match="3-d grid of at least 2 points"):
        marching_cubes_torch(torch.ones(5, 5))


def test_glb_reads_back_with_the_same_vertices_and_faces():
    field = smooth_field((20, 20, 20), 1.5, 5)
    verts, faces = (t.numpy() for t in marching_cubes_torch(torch.from_numpy(field)))
    data = glb_bytes(verts, faces)
    assert data[:4] == b"glTF" and len(data) % 4 == 0 and int.from_bytes(data[8:12], "little") == len(data)
    loaded = trimesh.load(io.BytesIO(data), file_type="glb", force="mesh", process=False)
    assert np.array_equal(loaded.vertices.astype(np.float32), verts) and np.array_equal(loaded.faces, faces)
    with pytest.raises(MeshError, match="at least one vertex and one face"):
        glb_bytes(verts, faces[:0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; bench runs it)")
def test_on_cuda_the_same_surface_as_on_the_cpu():
    field = torch.from_numpy(smooth_field((65, 65, 65), 2.0, 6))
    cpu_v, cpu_f = marching_cubes_torch(field)
    gpu_v, gpu_f = marching_cubes_torch(field.cuda())
    assert torch.equal(gpu_f.cpu(), cpu_f)
    torch.testing.assert_close(gpu_v.cpu(), cpu_v, rtol=0, atol=1e-5)


def test_the_service_meshes_on_the_device_when_told_to():
    from inference.service import GenerationService, ServiceConfig
    from inference.service.pipeline import GenerationRequest

    cfg = ServiceConfig.from_name("tiny", mesh_on_device=True)
    service = GenerationService(cfg)
    try:
        assert service._mesh_pool is None
        result = service.generate(GenerationRequest("a red car", seed=1))
    finally:
        service.close()
    loaded = trimesh.load(io.BytesIO(result.glb), file_type="glb", force="mesh", process=False)
    assert len(loaded.faces) == result.faces > 0 and len(loaded.vertices) == result.vertices
    for stage in ("shape_decode", "marching_cubes", "to_host", "meshing", "export", "total"):
        assert result.stages[stage] >= 0, stage
