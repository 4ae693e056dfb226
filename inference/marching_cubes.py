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
from inference.marching_cubes_lewiner import LewinerTables, lewiner_rows, lewiner_tables

# triangles per cube case (bit i of the case: corner i = (i & 1, i >> 1 & 1, i >> 2 & 1) is above the level),
# three edges each, one hex digit an edge (`EDGES` below); "-": no triangle. Read off scikit-image's classic table
# (one cube per case through `marching_cubes(method="lorensen")`), faces in the order `inference.mesh` writes them.
TRIANGLES = """
- 804 950 948549 41a 81a018 09541a 1951a9a89 5b1 48015b b0910b 4b148b89b 5a4ba5 5805b8ba8 0a409a9ba 89a9ba 862
604206 862095 962956546 628a41 61a621201 286095a41 95129121a2a6 86215b 06204615b 0b109b286 29b2b424614b
a5ba45862 6ba60b62005b 628a49a9b940 62969aa9b 279 279804 250752 248274754 279a41 81a801927 52750241a
27525a2a8a51 9275b1 80492715b b27b12102 4b18b487b827 5a45ba792 27980b8bab05 7027a07ba40a 27b2b88ba 879678
079047467 850865675 674475 879867a41 a67a70a01907 a41860650675 1a6165567 7867985b1 15b049479467 8108718677b1
b14b47746 4ba45b678798 ba0b05a60907670 6706087b040aba0 67ba6b 6a3 8046a3 6a3095 4954896a3 436134 836803013
436413509 613691689519 36ab15 6a3480b15 b09b10a36 6a34818b189b 35b365645 35b653605680 0640b609bb36 36838bb89
2a38a2 a04a30320 2a328a095 a32a25a54529 428412132 203301 950281213184 951912213 a28a32b15 b15a34304320
9109b18a2a32 32434a29414b9b4 845853832b35 5b3530032 9b4940b34842324 329b39 6a3279 4806a3927 25027536a
36a278748754 341364279 927806036013 270075364341 758782518683138 27936a5b1 b156a3804927 6a327121017b
8148b182b7b26a3 27936b65b645 6b365b685058279 64b6b340b7b202b 36838b2787b8 7a379a98a a374a7479490 08a0a707537a
a37a74475 798781713184 790703301 138184378085758 137517 5b17939a398a 4904794a737a15b 10717b08737a8a7
b14b47a34374 983937843b35453 5b3530793903 8407b3 37b 3b7 80473b 73b950 948954b73 a413b7 1801a83b7 41a5093b7
73b95a9a8a51 173571 173157048 709730310 789718731148 a73a47457 0a807a0573a7 a7347a497409 73a7a99a8 28673b
60462073b 62873b095 3b7625654529 862a4173b 73b62a21a201 862950a4173b 2a621a29151973b 715731628 357315206046
862093031397 319397149296469 28673474543a 20a2a605a3a757a 43a473407970862 73a7a962a29a 392b93 93b923804
53b503023 854835823b53 3923b91a4 80aa0192393b a413b03020b5 a85a51825b53235 915921231 804925215231 230310
482421123 a23a52a45592 2352593a5058a85 a40a03302 23a82a 3863b8b98 04606b0b9b63 3b5635650608 3b5356654
41a86b8b9b63 b96b63906a61016 608650635b53a41 1a61653b6b56 631619698591 469490639591319 863830031 463143
45343a593638983 63a059 a40a03860630 63a 6b7ab6 6b76ab480 b6ab76950 6a77ab489495 b41b74764 80181787671b
09541747671b 76171b681519891 16a156576 8046a56575a1 a76a07a10970 891814971a16761 647457 805856657 097074476
897687 2b728b8ab 72070a7ab4a0 0952878b78ab 5425294a272bab2 41b84b8b7872 b72b21120 8728b784b1b4095 b72b21952512
2572a528aa15 57a5a172a4a020a 8a7872a17970107 297a14 284247745 205725 097074287847 297 6926a9ab9 4806a2a92ab9
6ab6b06020b5 ab2a26b52824542 2b924b2641b4 0160681b6269b96 02b0b526b1b464b 8261b5 9152192a126a 259215261a16804
6a1612210 4824216a2a12 926965564 926965806056 640260 826 8a99ab 04a0a99ab 50858bb8a 54ab5a 41b4b88b9 b901b0
50858b4181b8 51b 15919aa98 15919a0494a9 8a1081 4a1 984594 905 840 -
""".split()
# edge e: (axis, offset of its first corner); edges 4a .. 4a+3 run along axis a
EDGES = ((0, (0, 0, 0)), (0, (0, 1, 0)), (0, (0, 0, 1)), (0, (0, 1, 1)), (1, (0, 0, 0)), (1, (1, 0, 0)),
         (1, (0, 0, 1)), (1, (1, 0, 1)), (2, (0, 0, 0)), (2, (1, 0, 0)), (2, (0, 1, 0)), (2, (1, 1, 0)))
MAX_TRIANGLES = 5


def _tables(device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(triangle edges [256, 5, 3], triangle count [256], edge axis [13], edge offset [13, 3]) on `device`; edge 12,
    the vertex inside a cube (Lewiner's tilings only), has axis 3 and offset 0."""
    edges = torch.zeros(256, MAX_TRIANGLES, 3, dtype=torch.long)
    count = torch.zeros(256, dtype=torch.long)
    for case, row in enumerate(TRIANGLES):
        digits = [int(c, 16) for c in row.strip("-")]
        count[case] = len(digits) // 3
        if digits:
            edges[case, :count[case]] = torch.tensor(digits).view(-1, 3)
    axis = torch.tensor([a for a, _ in EDGES] + [3])
    offset = torch.tensor([o for _, o in EDGES] + [(0, 0, 0)])
    return edges.to(device), count.to(device), axis.to(device), offset.to(device)


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
    # every vertex id in one table: the three axes' edge grids flattened, then the cubes' inner vertices
    table = torch.cat([i.flatten() for i in ids] + [inner_ids])
    starts = torch.tensor([0] + [i.numel() for i in ids], device=device).cumsum(0)                # [4]
    strides = torch.tensor([[i.shape[1] * i.shape[2], i.shape[2], 1] for i in ids] + [[0, 0, 0]],
                           device=device)                                                         # [4, 3]
    axis = edge_axis[local]
    corner = cubes[owner].unsqueeze(1) + edge_offset[local]                   # [F, 3, 3] first corner of each edge
    at = starts[axis] + (corner * strides[axis]).sum(-1) + (axis == 3) * owner.unsqueeze(1)
    return torch.cat(verts), table[at]


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
        edge_ids[cross] = torch.arange(base, base + points.shape[0], device=device)
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
