"""Marching cubes in torch: the surface of an occupancy grid at a level, computed where the grid lives (the GPU).

For each cube the signs of its 8 corners pick the triangles; each grid edge whose ends change sign carries one
vertex, shared by the cubes around it, at the linear interpolation of the level. The default method is Lewiner's
(Marching Cubes 33, `inference.marching_cubes_lewiner`): its face and interior tests resolve the ambiguous cubes,
some with a vertex inside the cube, and the result has the triangles of `skimage.measure.marching_cubes(...)`
(its default method) on the same grid, in another order. `method="lorensen"` is the classic table, scikit-image's
own, with the triangles of its `method="lorensen"`. Everything stays on the grid's device: a few passes over the
grid, the tests over the ambiguous cubes only, no Python per cube; the caller copies the final buffers to the host
once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from inference.errors import MeshError
from inference.marching_cubes_lewiner import LewinerTables, classic_tables, lewiner_rows, lewiner_tables

# edge e: (axis, offset of its first corner); edges 4a .. 4a+3 run along axis a
EDGES = ((0, (0, 0, 0)), (0, (0, 1, 0)), (0, (0, 0, 1)), (0, (0, 1, 1)), (1, (0, 0, 0)), (1, (1, 0, 0)),
         (1, (0, 0, 1)), (1, (1, 0, 1)), (2, (0, 0, 0)), (2, (1, 0, 0)), (2, (0, 1, 0)), (2, (1, 1, 0)))


def _tables(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(classic triangle edges [256, 5, 3], triangle count [256], edge axis [13], edge offset [13, 3]) on `device`;
    edge 12, the vertex inside a cube (Lewiner's tilings only), has axis 3 and offset 0."""
    edges, count = classic_tables(EDGES, device)
    axis = torch.tensor([a for a, _ in EDGES] + [3])
    offset = torch.tensor([o for _, o in EDGES] + [(0, 0, 0)])
    return edges, count, axis.to(device), offset.to(device)


_TABLES: dict[torch.device, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
_LEWINER: dict[torch.device, LewinerTables] = {}
METHODS = ("lewiner", "lorensen")


def _shifted(t: Tensor, axis: int, lo: bool) -> Tensor:
    """`t` without its last (lo) or first (hi) slice along `axis`."""
    n = t.shape[axis]
    return t.narrow(axis, 0 if lo else 1, n - 1)


def marching_cubes_torch(values: Tensor, level: float = 0.0, method: str = "lewiner") -> tuple[Tensor, Tensor]:
    """Surface of `values` [X, Y, Z] at `level`: vertices [V, 3] float32 in grid index units and faces [F, 3]
    int64, both on `values`' device. `method`: "lewiner" (scikit-image's default, Marching Cubes 33: the same
    triangles) or "lorensen" (the classic table, scikit-image's `method="lorensen"`). Raises `MeshError` where no
    cube crosses the level."""
    if values.dim() != 3 or min(values.shape) < 2:
        raise MeshError(f"marching cubes needs a 3-d grid of at least 2 points a side, got {tuple(values.shape)}")
    if method not in METHODS:
        raise MeshError(f"unknown marching cubes method {method!r}: use one of {', '.join(METHODS)}")
    device = values.device
    if device not in _TABLES:
        _TABLES[device] = _tables(device)
    tri_edges, tri_count, edge_axis, edge_offset = _TABLES[device]
    values = values.float()
    above = values > level
    ids, verts = _edge_vertices(values, above, level)
    case = _cube_cases(above)
    cubes = ((case != 0) & (case != 255)).nonzero()                           # [M, 3] first corners
    if cubes.shape[0] == 0:
        raise MeshError(f"the grid does not cross level {level:g} (values in [{values.min().item():.3g}, "
                        f"{values.max().item():.3g}]): the tokens decode to an empty or full volume")
    rows = case[cubes[:, 0], cubes[:, 1], cubes[:, 2]]                        # [M] row of the triangle table
    inner_ids = torch.full_like(rows, -1)                                     # [M] vertex inside the cube
    if method == "lewiner":
        if device not in _LEWINER:
            _LEWINER[device] = lewiner_tables(EDGES, device)
        tri_edges, tri_count = _LEWINER[device].triangles, _LEWINER[device].count
        rows, inner_cubes, inner_verts = lewiner_rows(_LEWINER[device], rows, cubes, values, level)
        inner_ids[inner_cubes] = torch.arange(inner_cubes.shape[0], device=device) + sum(v.shape[0] for v in verts)
        verts.append(inner_verts)
    per_cube = tri_count[rows]
    owner = torch.repeat_interleave(torch.arange(cubes.shape[0], device=device), per_cube)      # [F]
    first = torch.cumsum(per_cube, 0) - per_cube
    nth = torch.arange(owner.shape[0], device=device) - first[owner]
    local = tri_edges[rows[owner], nth]                                       # [F, 3] cube edges, 12: inside
    return torch.cat(verts), _vertex_ids(ids, inner_ids, cubes, owner, local, edge_axis, edge_offset)


def _vertex_ids(ids: list[Tensor], inner_ids: Tensor, cubes: Tensor, owner: Tensor, local: Tensor,
                edge_axis: Tensor, edge_offset: Tensor) -> Tensor:
    """Vertex ids of the faces' corners [F, 3], from their cube edges (`local` [F, 3], 12 for the vertex inside the
    cube) and owning cubes (`owner` [F]). Every id lies in one table: the three axes' edge grids flattened, then the
    cubes' inner vertices; an edge's place there is its cube's place in that axis' part plus the edge's step."""
    device = cubes.device
    table = torch.cat([i.flatten() for i in ids] + [inner_ids])
    strides = torch.tensor([[i.shape[1] * i.shape[2], i.shape[2], 1] for i in ids] + [[0, 0, 0]], device=device)
    starts = torch.tensor([0] + [i.numel() for i in ids], device=device).cumsum(0)                # [4]
    cube_at = torch.cat([(cubes.unsqueeze(1) * strides[:3]).sum(-1),                               # no int matmul
                         torch.arange(cubes.shape[0], device=device).unsqueeze(1)], 1) + starts    # [M, 4]
    step = (edge_offset * strides[edge_axis]).sum(1)                                                # [13]
    return table[cube_at.view(-1)[owner.unsqueeze(1) * 4 + edge_axis[local]] + step[local]]


def _edge_vertices(values: Tensor, above: Tensor, level: float) -> tuple[list[Tensor], list[Tensor]]:
    """One vertex per grid edge whose ends differ: (vertex id per edge first corner, -1 where none, [3] grids;
    vertices per axis [n_a, 3]). Ids numbered axis by axis, row-major within an axis."""
    device = values.device
    ids, verts, base = [], [], 0
    for a in range(3):
        lo, hi = _shifted(above, a, True), _shifted(above, a, False)
        cross = lo != hi
        points = cross.nonzero()                                              # [n_a, 3] first corners
        v0 = values[points[:, 0], points[:, 1], points[:, 2]]
        step = torch.zeros(3, dtype=torch.long, device=device)
        step[a] = 1
        far = points + step
        v1 = values[far[:, 0], far[:, 1], far[:, 2]]
        pos = points.float()
        pos[:, a] += (level - v0) / (v1 - v0)
        verts.append(pos)
        edge_ids = torch.full(cross.shape, -1, dtype=torch.long, device=device)
        edge_ids[points[:, 0], points[:, 1], points[:, 2]] = torch.arange(base, base + points.shape[0], device=device)
        ids.append(edge_ids)
        base += points.shape[0]
    return ids, verts


def _cube_cases(above: Tensor) -> Tensor:
    """Case of each cube [X-1, Y-1, Z-1]: bit i set where corner i = (i & 1, i >> 1 & 1, i >> 2 & 1) is above."""
    x, y, z = (s - 1 for s in above.shape)
    case = torch.zeros(x, y, z, dtype=torch.long, device=above.device)
    for i in range(8):
        dx, dy, dz = i & 1, i >> 1 & 1, i >> 2 & 1
        case |= above[dx:dx + x, dy:dy + y, dz:dz + z].long() << i
    return case
