"""Coarse-to-fine occupancy equals the dense grid where marching cubes reads it, at a fraction of the points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.errors import MeshError
from inference.mesh import ShapeDecoder, marching_cubes
from inference.occupancy import (cell_points, coarse_to_fine, coarse_to_fine_batch, shape_field, shape_fields,
                                 sign_change_cells)


def bumpy(points: torch.Tensor) -> torch.Tensor:
    """A sphere with ripples and a small blob near its side: features down to a few grid cells."""
    blob = torch.tensor([0.7, 0.0, 0.0])
    return (0.6 - points.norm(dim=-1) + 0.08 * torch.sin(9 * points[:, 0]) * torch.cos(7 * points[:, 1])
            + 0.3 * torch.exp(-((points - blob) ** 2).sum(-1) / 0.01))


def test_sign_change_cells_and_their_corners():
    values = -torch.ones(3, 3, 3)
    values[2, 2, 2] = 1.0                                      # one positive corner: only the last cell changes sign
    cells = sign_change_cells(values)
    assert cells.shape == (2, 2, 2) and cells.sum() == 1 and cells[1, 1, 1]
    corners = cell_points(cells)
    assert corners.shape == (3, 3, 3) and corners.sum() == 8 and corners[1:, 1:, 1:].all()


@pytest.mark.parametrize("resolution, levels", [(6, 3), (6, 1)])
def test_same_surface_as_the_dense_grid_with_fewer_points(resolution, levels):
    dense = coarse_to_fine(bumpy, resolution, 1.05, "cpu", levels=0)
    fine = coarse_to_fine(bumpy, resolution, 1.05, "cpu", levels=levels)
    assert dense.evaluated == dense.values.numel() and fine.fraction < 0.5
    assert torch.equal(dense.values > 0, fine.values > 0)
    corners = cell_points(sign_change_cells(dense.values))
    torch.testing.assert_close(fine.values[corners], dense.values[corners], rtol=0, atol=1e-6)
    assert torch.equal(fine.surface, corners)
    v_dense, f_dense = marching_cubes(dense.values.numpy(), 1.05)
    v_fine, f_fine = marching_cubes(fine.values.numpy(), 1.05, mask=fine.surface.numpy())
    assert np.array_equal(f_dense, f_fine) and np.allclose(v_dense, v_fine, atol=1e-5)


def test_dense_path_matches_the_shape_decoders_grid():
    dec = ShapeDecoder("tiny", None, init_std=0.3, seed=1)
    ids = torch.randint(0, dec.cfg.num_codes, (dec.cfg.num_latents,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = coarse_to_fine(shape_field(dec, ids), 4, dec.cfg.bounds, "cpu", levels=0).values
    torch.testing.assert_close(ours, dec.occupancy_grid(ids, resolution=4), rtol=1e-5, atol=1e-5)


def test_a_batch_of_objects_gets_the_grids_each_would_get_alone():
    shifts = torch.tensor([[0.0, 0.0, 0.0], [0.3, -0.2, 0.1], [-0.4, 0.1, 0.0]])     # surfaces of different sizes

    def fields(points: torch.Tensor) -> torch.Tensor:                                # [3, P, 3] -> [3, P]
        return torch.stack([bumpy(p - s) * (1.0 - 0.3 * i) for i, (p, s) in enumerate(zip(points, shifts))])

    batch = coarse_to_fine_batch(fields, 3, 6, 1.05, "cpu", levels=3, chunk=3000)
    for i, grid in enumerate(batch):
        alone = coarse_to_fine(lambda p: bumpy(p - shifts[i]) * (1.0 - 0.3 * i), 6, 1.05, "cpu", levels=3)
        assert grid.evaluated == alone.evaluated
        torch.testing.assert_close(grid.values, alone.values, rtol=0, atol=1e-6)
        assert torch.equal(grid.surface, alone.surface)
    assert len({grid.evaluated for grid in batch}) == 3                      # the packing padded unequal counts


def test_batched_shape_fields_evaluate_each_objects_own_field():
    dec = ShapeDecoder("tiny", None, init_std=0.3, seed=1)
    ids = torch.randint(0, dec.cfg.num_codes, (2, dec.cfg.num_latents), generator=torch.Generator().manual_seed(0))
    points = torch.rand(2, 50, 3) * 2 - 1
    with torch.no_grad():
        both = shape_fields(dec, ids)(points)
        alone = [shape_field(dec, ids[i])(points[i]) for i in range(2)]
    torch.testing.assert_close(both, torch.stack(alone), rtol=1e-5, atol=1e-5)


def test_levels_beyond_the_resolution_are_refused():
    with pytest.raises(MeshError, match="`levels` must be within 0..4"):
        coarse_to_fine(bumpy, 4, 1.05, "cpu", levels=5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none; the service compiles "
                    "the occupancy decoder on CUDA only)")
def test_the_compiled_occupancy_decoder_computes_the_eager_field():
    dec = ShapeDecoder("v0.1", None, "cuda", torch.bfloat16, init_std=0.02)
    ids = torch.randint(0, dec.cfg.num_codes, (dec.cfg.num_latents,), generator=torch.Generator().manual_seed(0))
    points = torch.rand(100_003, 3, device="cuda") * 2.1 - 1.05                   # an odd count: dynamic shapes
    with torch.no_grad():
        eager = shape_field(dec, ids)(points)
        compiled = shape_field(dec, ids, compiled=True)(points)
        again = shape_field(dec, ids, compiled=True)(points[:777])
    assert (compiled - eager).norm() / eager.norm() < 2e-2
    torch.testing.assert_close(again, compiled[:777], rtol=2e-2, atol=2e-2)
