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
from inference.marching_cubes import METHODS, marching_cubes_torch
from inference.marching_cubes_lewiner import CORNERS
from inference.mesh import device_surface, marching_cubes

trimesh = pytest.importorskip("trimesh")


def smooth_field(shape: tuple[int, int, int], sigma: float, seed: int) -> np.ndarray:
    """Smoothed noise: many separate surfaces, saddles and ambiguous cubes, none on a grid point."""
    return gaussian_filter(np.random.default_rng(seed).standard_normal(shape), sigma).astype(np.float32)


def occupancy_like(g: int, seed: int) -> np.ndarray:
    """Logits of a closed blob with a noisy rim, saturated like an occupancy decoder's: the border is outside, the
    rim has many ambiguous cubes (random weights give such grids)."""
    ax = np.linspace(-1.05, 1.05, g)
    x, y, z = np.meshgrid(ax, ax, ax, indexing="ij")
    noise = np.random.default_rng(seed).standard_normal((g, g, g))
    logits = np.clip(12 * (0.6 - np.sqrt(x * x + y * y + z * z)) + 2.5 * noise, -8, 8).astype(np.float32)
    logits[[0, -1]], logits[:, [0, -1]], logits[:, :, [0, -1]] = -8, -8, -8
    return logits


def canonical(faces: np.ndarray) -> np.ndarray:
    """Triangles rotated to start at their smallest vertex id (the winding kept), rows sorted."""
    rolled = np.take_along_axis(faces, (np.argmin(faces, 1)[:, None] + np.arange(3)) % 3, 1)
    return rolled[np.lexsort(rolled.T[::-1])]


def same_triangles(ours_v, ours_f, ref_v, ref_f) -> tuple[float, bool]:
    """(largest distance from one of our vertices to the nearest reference vertex, same oriented triangles)."""
    dist, match = cKDTree(ref_v).query(ours_v)
    same = len(set(match)) == len(match) and np.array_equal(canonical(match[ours_f]), canonical(ref_f))
    return float(dist.max()), same


@pytest.mark.parametrize("shape, sigma, seed", [((9, 10, 11), 1.0, 0), ((33, 33, 33), 2.0, 1),
                                                ((40, 31, 25), 1.2, 2)])
def test_same_surface_as_scikit_images_classic_method(shape, sigma, seed):
    field = smooth_field(shape, sigma, seed)
    verts, faces = marching_cubes_torch(torch.from_numpy(field), method="lorensen")
    ref_v, ref_f, _, _ = measure.marching_cubes(field, 0.0, method="lorensen")
    dist, same = same_triangles(verts.numpy(), faces.numpy(), ref_v, np.ascontiguousarray(ref_f[:, ::-1]))
    assert dist < 1e-4 and same


@pytest.mark.parametrize("name, field", [
    ("noise 21x18x23", torch.randn(21, 18, 23, generator=torch.Generator().manual_seed(7)).numpy()),
    ("noise 27x25x22", torch.randn(27, 25, 22, generator=torch.Generator().manual_seed(8)).numpy()),
    ("smooth 37x41x30", smooth_field((37, 41, 30), 1.3, 9)),
    ("occupancy-like 41^3", occupancy_like(41, 10)),
])
def test_the_same_triangles_as_scikit_images_default_lewiner_method(name, field):
    verts, faces = marching_cubes_torch(torch.from_numpy(field))
    ref_v, ref_f, _, _ = measure.marching_cubes(field, 0.0)
    classic = measure.marching_cubes(field, 0.0, method="lorensen")[1]
    dist, same = same_triangles(verts.numpy(), faces.numpy(), ref_v, np.ascontiguousarray(ref_f[:, ::-1]))
    assert len(faces) == len(ref_f) != len(classic), name                   # the ambiguous cubes were resolved
    assert len(verts) == len(ref_v) and dist < 1e-4 and same, name


def test_every_sign_pattern_with_random_magnitudes_as_scikit_image():
    # 2x2x2 blocks, each a cube of one of the 254 crossing sign patterns (Lewiner's corner order) with magnitudes
    # over 7 orders: every ambiguous case and configuration, its face and interior tests both ways
    rng = np.random.default_rng(12)
    index = rng.permutation(np.repeat(np.arange(1, 255), 4))
    n = int(np.ceil(len(index) ** (1 / 3)))
    index = np.concatenate([index, rng.integers(1, 255, n ** 3 - len(index))])
    first = np.stack(np.unravel_index(np.arange(n ** 3), (n, n, n)), 1) * 2
    grid = np.empty((2 * n, 2 * n, 2 * n), np.float32)
    for k, (x, y, z) in enumerate(CORNERS):
        grid[first[:, 0] + z, first[:, 1] + y, first[:, 2] + x] = (
            np.where(index >> k & 1, 1.0, -1.0) * np.exp(2 * rng.standard_normal(len(index))))
    verts, faces = marching_cubes_torch(torch.from_numpy(grid))
    ref_v, ref_f, _, _ = measure.marching_cubes(grid, 0.0)
    dist, same = same_triangles(verts.numpy(), faces.numpy(), ref_v, np.ascontiguousarray(ref_f[:, ::-1]))
    assert len(faces) == len(ref_f) and len(verts) == len(ref_v) and dist < 1e-4 and same


def test_a_noisy_closed_surface_is_watertight_and_faces_outwards():
    field = occupancy_like(37, 11)
    ref = trimesh.Trimesh(*measure.marching_cubes(field, 0.0)[:2], process=False)
    meshes = {m: trimesh.Trimesh(*(t.numpy() for t in marching_cubes_torch(torch.from_numpy(field), method=m)),
                                 process=False) for m in METHODS}
    assert ref.is_watertight and all(m.is_watertight and m.is_winding_consistent for m in meshes.values())
    edges = np.sort(meshes["lewiner"].edges, axis=1)
    assert (np.unique(edges, axis=0, return_counts=True)[1] == 2).all()      # every edge between two faces
    # scikit-image's faces wind inwards (`gradient_direction="descent"`); ours, like the host path's, outwards
    assert meshes["lewiner"].volume > 0 > ref.volume and meshes["lorensen"].volume > 0
    assert abs(meshes["lewiner"].volume + ref.volume) < 1e-5 * -ref.volume


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
    with pytest.raises(MeshError, match="unknown marching cubes method 'mc33': use one of lewiner, lorensen"):
        marching_cubes_torch(torch.randn(5, 5, 5), method="mc33")


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
