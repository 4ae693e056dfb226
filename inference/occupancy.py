"""Occupancy on the (2^r + 1)^3 grid, coarse to fine: the network runs only where the surface can be.

Dense decoding evaluates all 17M points at r = 8, though the surface passes near a few percent of them (about
1.15 s on an H200 for the v0.1 tokenizer). Here the grid is first evaluated at stride 2^k (33^3 points at r = 8,
k = 3); each level then halves the stride and evaluates only the points of the cells whose corners change sign,
dilated by `dilate` cells. Every other point is a trilinear interpolation of same-sign corners, which keeps their
sign, so marching cubes finds no surface there. The result equals the dense grid wherever a surface is found;
what it can miss is a feature that no coarse corner sees (thinner than the coarse spacing, 2.1 / 32 = 0.066 at
r = 8, k = 3, and farther than `dilate` coarse cells from any other surface): the usual trade of hierarchical
volume decoding. `levels=0` is the dense grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from inference.errors import MeshError

Field = Callable[[Tensor], Tensor]       # points [P, 3] float32 -> occupancy logits [P] float32
Fields = Callable[[Tensor], Tensor]      # points [B, P, 3] float32 -> logits [B, P] float32, one field per object


@dataclass
class OccupancyGrid:
    """Logits on the whole grid, the points around cubes the surface crosses, and how many points were run."""

    values: Tensor        # [G, G, G] float32, on the device
    surface: Tensor       # [G, G, G] bool: first corners of the cubes with a sign change (marching cubes' mask)
    evaluated: int        # points the network evaluated

    @property
    def fraction(self) -> float:
        return self.evaluated / self.values.numel()


def _coords(ijk: Tensor, stride: int, resolution: int, bounds: float) -> Tensor:
    """Grid indices at `stride` [..., 3] -> world points [..., 3] float32 (same spacing as `mesh.grid_points`)."""
    g = 2 ** resolution + 1
    return (ijk * stride).float() * (2 * bounds / (g - 1)) - bounds


def _evaluate(fields: Fields, points: Tensor, chunk: int) -> Tensor:
    """points [B, P, 3] -> logits [B, P], `chunk` points per object and call."""
    out = torch.empty(points.shape[:2], dtype=torch.float32, device=points.device)
    for start in range(0, points.shape[1], chunk):
        out[:, start:start + chunk] = fields(points[:, start:start + chunk])
    return out


def _evaluate_marked(fields: Fields, need: Tensor, stride: int, resolution: int, bounds: float,
                     chunk: int) -> tuple[Tensor, list[int]]:
    """Logits at the points `need` [B, n, n, n] marks, in `values[need]` order, and the count of each object.
    The objects' points are packed into [B, most, 3] (padded with the grid's corner) so that one network call
    serves every object."""
    idx = need.nonzero()                                                  # [M, 4], row-major like `need`
    counts = need.flatten(1).sum(1)
    per_object = counts.tolist()
    coords = _coords(idx[:, 1:], stride, resolution, bounds)
    if len(per_object) == 1:
        return _evaluate(fields, coords[None], chunk)[0], per_object
    firsts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(idx.shape[0], device=need.device) - firsts[idx[:, 0]]
    packed = torch.full((len(per_object), max(per_object), 3), -bounds, dtype=torch.float32, device=need.device)
    packed[idx[:, 0], slot] = coords
    return _evaluate(fields, packed, chunk)[idx[:, 0], slot], per_object


def _pool(cells: Tensor, kernel: int, padding: int) -> Tensor:
    """Max-pool of a bool volume [..., n, n, n] (as float, what max_pool3d takes) -> bool."""
    pooled = F.max_pool3d(cells.unsqueeze(-4).float(), kernel, stride=1, padding=padding)
    return pooled.squeeze(-4) > 0


def sign_change_cells(values: Tensor) -> Tensor:
    """[..., n, n, n] values -> [..., n-1, n-1, n-1] bool: cells whose 8 corners are not all on one side of 0."""
    inside = values > 0
    return _pool(inside, 2, 0) & _pool(~inside, 2, 0)


def cell_points(cells: Tensor) -> Tensor:
    """[..., m, m, m] cells -> [..., m+1, m+1, m+1] bool: the corners of the marked cells."""
    return _pool(F.pad(cells.float(), (1, 1, 1, 1, 1, 1)) > 0, 2, 0)


def _subdivide(cells: Tensor) -> Tensor:
    """Each cell -> its 8 halves: [..., m, m, m] -> [..., 2m, 2m, 2m]."""
    return cells.repeat_interleave(2, -3).repeat_interleave(2, -2).repeat_interleave(2, -1)


def coarse_to_fine(field: Field, resolution: int, bounds: float, device: torch.device | str, levels: int = 3,
                   dilate: int = 1, chunk: int | None = None) -> OccupancyGrid:
    """The occupancy grid of `field`, refined level by level around the surface (see the module note)."""
    fields = lambda points: field(points[0])[None]                        # noqa: E731
    return coarse_to_fine_batch(fields, 1, resolution, bounds, device, levels, dilate, chunk)[0]


def coarse_to_fine_batch(fields: Fields, objects: int, resolution: int, bounds: float, device: torch.device | str,
                         levels: int = 3, dilate: int = 1, chunk: int | None = None) -> list[OccupancyGrid]:
    """`coarse_to_fine` of `objects` fields at once: each level is one pass of network calls for all of them
    (a batch's objects then cost one launch sequence instead of one each). `chunk` counts points per call."""
    if not 0 <= levels <= resolution:
        raise MeshError(f"`levels` must be within 0..{resolution} (the resolution), got {levels}")
    device = torch.device(device)
    chunk = max(1, (chunk or (1 << 19 if device.type == "cuda" else 1 << 14)) // objects)
    stride, n = 2 ** levels, 2 ** (resolution - levels) + 1
    axis = torch.arange(n, device=device)
    ijk = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(1, -1, 3)
    points = _coords(ijk, stride, resolution, bounds).expand(objects, -1, -1)
    values = _evaluate(fields, points, chunk).view(objects, n, n, n)
    exact = torch.ones(objects, n, n, n, dtype=torch.bool, device=device)
    evaluated = [n ** 3] * objects
    while stride > 1:
        cells = sign_change_cells(values)
        if dilate:
            cells = _pool(cells, 2 * dilate + 1, dilate)
        values = F.interpolate(values[:, None], size=2 * n - 1, mode="trilinear", align_corners=True)[:, 0]
        known = torch.zeros_like(values, dtype=torch.bool)
        known[:, ::2, ::2, ::2] = exact
        need = cell_points(_subdivide(cells)) & ~known
        stride, n = stride // 2, 2 * n - 1
        marked, counts = _evaluate_marked(fields, need, stride, resolution, bounds, chunk)
        values[need] = marked
        exact = known | need
        evaluated = [e + c for e, c in zip(evaluated, counts)]
    surface = cell_points(sign_change_cells(values))
    return [OccupancyGrid(values[b], surface[b], evaluated[b]) for b in range(objects)]


def shape_fields(shapes, ids: Tensor, compiled: bool = False) -> Fields:
    """The occupancy fields of B objects' token ids [B, N] under a `ShapeDecoder`: latents and the
    cross-attention keys/values are computed once here, for all B in one pass; the returned function evaluates
    query points [B, P, 3]. `compiled`: through `ShapeDecoder.compiled_occupancy` (torch.compile: the embedding,
    norms and activations fused)."""
    model = shapes.model
    latents = model.decode_indices(ids.to(shapes.device))                             # [B, N, W]
    kv = model.occupancy_decoder.attn_out.keys_values(latents)
    decoder = shapes.compiled_occupancy() if compiled else model.occupancy_decoder

    def fields(points: Tensor) -> Tensor:
        return decoder(points.to(shapes.dtype), kv).float()

    return fields


def shape_field(shapes, ids: Tensor, compiled: bool = False) -> Field:
    """`shape_fields` of one object's token ids [N]: a field of query points [P, 3]."""
    fields = shape_fields(shapes, ids.reshape(1, -1), compiled)
    return lambda points: fields(points[None])[0]
