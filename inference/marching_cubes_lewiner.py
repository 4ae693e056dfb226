"""Lewiner et al.'s Marching Cubes 33 on the device: which triangles each cube gets, as a row of one table.

Lewiner, Lopes, Vieira, Tavares, "Efficient implementation of Marching Cubes' cases with topological guarantees"
(Journal of Graphics Tools 8(2), 2003), as scikit-image runs it (`skimage.measure.marching_cubes`, its default
method). Cubes of the cases without ambiguity take their tiling from the case alone. Cases 3, 4, 6, 7, 10, 12 and
13 have a face or the interior where the corner signs do not say how the surface passes; the asymptotic decider
on each ambiguous face (the sign of A*C - B*D on its corners) and the interior test (the signs on a section of the
trilinear interpolant through the cube: at the height of its interior saddle, or through the level's point on a
reference edge) pick the sub-case. Some sub-cases add a vertex inside the
cube: the mean of the 8 corners weighted by 1 / |value - level|, as scikit-image places it.

The tilings and tests are scikit-image's tables, read once from the installed package
(`skimage.measure._marching_cubes_lewiner_luts`, decoded as the package decodes them); only the rows of the
ambiguous cubes are computed here, by torch ops over all of them at once.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

EPS = float(np.spacing(1.0))               # scikit-image's FLT_EPSILON (a double's)
CENTER = 12                                # the edge number of the vertex inside the cube
# Lewiner's corner k as (x, y, z), x the grid's last axis; our corner bits are (axis 0, 1, 2) = (z, y, x)
CORNERS = ((0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1))
GRID_OFFSETS = tuple((z, y, x) for x, y, z in CORNERS)  # the same corners as offsets along our grid's axes
# corners A, B, C, D of faces 1..6 (A and C opposite)
FACES = ((0, 4, 5, 1), (1, 5, 6, 2), (2, 6, 7, 3), (3, 7, 4, 0), (0, 3, 2, 1), (4, 7, 6, 5))
# interior test from a reference edge e (0..11): the level's point on e = (p, q) at t, and the three edges parallel
# to it (B, C, D), each as (from, to) interpolated at the same t, going round the cube from e
PARALLEL = ((0, 1, 3, 2, 7, 6, 4, 5), (1, 2, 0, 3, 4, 7, 5, 6), (2, 3, 1, 0, 5, 4, 6, 7), (3, 0, 2, 1, 6, 5, 7, 4),
            (4, 5, 7, 6, 3, 2, 0, 1), (5, 6, 4, 7, 0, 3, 1, 2), (6, 7, 5, 4, 1, 0, 2, 3), (7, 4, 6, 5, 2, 1, 3, 0),
            (0, 4, 3, 7, 2, 6, 1, 5), (1, 5, 0, 4, 3, 7, 2, 6), (2, 6, 1, 5, 0, 4, 3, 7), (3, 7, 2, 6, 1, 5, 0, 4))
AMBIGUOUS = (3, 4, 6, 7, 10, 12, 13)          # the cases with tests
# the tilings that need no test, by case
PLAIN = {1: "TILING1", 2: "TILING2", 5: "TILING5", 8: "TILING8", 9: "TILING9", 11: "TILING11", 14: "TILING14"}


def _lut(name: str) -> np.ndarray:
    from skimage.measure import _marching_cubes_lewiner_luts as luts

    shape, text = getattr(luts, name)
    return np.frombuffer(base64.decodebytes(text.encode("utf-8")), dtype=np.int8).reshape(shape)


def _edge_map(edges: tuple) -> list[int]:
    """Lewiner's edge numbers (0..11) -> ours (`inference.marching_cubes.EDGES`); 12 (the centre) stays."""
    from skimage.measure._marching_cubes_lewiner import EDGETORELATIVEPOSX, EDGETORELATIVEPOSY, EDGETORELATIVEPOSZ

    ours = {(a, tuple(o)): e for e, (a, o) in enumerate(edges)}
    out = []
    for x, y, z in zip(EDGETORELATIVEPOSX, EDGETORELATIVEPOSY, EDGETORELATIVEPOSZ):
        axis = 0 if z[0] != z[1] else 1 if y[0] != y[1] else 2
        out.append(ours[(axis, (min(z), min(y), min(x)))])
    return out + [CENTER]


def _lewiner_index() -> Tensor:
    """Our case bits [256] -> Lewiner's index: bit k for his corner k = (x, y, z), whose bit is ours z + 2y + 4x."""
    ours = torch.tensor([z + 2 * y + 4 * x for x, y, z in CORNERS])
    return ((torch.arange(256)[:, None] >> ours & 1) << torch.arange(8)).sum(1)


def classic_tables(edges: tuple, device: torch.device) -> tuple[Tensor, Tensor]:
    """scikit-image's classic (Lorensen) table for our case bits and `edges`: (triangle edges [256, 5, 3], triangle
    count [256]) on `device`."""
    table = torch.from_numpy(_lut("CASESCLASSIC").astype(np.int64))[_lewiner_index(), :15].view(256, 5, 3)
    count = (table[:, :, 0] >= 0).sum(1)
    return torch.tensor(_edge_map(edges))[table.clamp(min=0)].to(device), count.to(device)


@dataclass(frozen=True)
class LewinerTables:
    """Every tiling as rows of one table (row 0: no triangle), and the tests, on one device."""

    triangles: Tensor                      # [R, 12, 3] our edge numbers, CENTER for the inner vertex
    count: Tensor                          # [R] triangles in the row
    centered: Tensor                       # [R] bool: the row uses the inner vertex
    case: Tensor                           # [256] Lewiner's case of our case bits
    config: Tensor                         # [256] its configuration
    plain_row: Tensor                      # [256] the row of an unambiguous case (0 for ambiguous ones)
    ambiguous: Tensor                      # [256] bool: the case has tests
    base: dict[str, int]                   # first row of each tiling
    width: dict[str, int]                  # rows per configuration (sub-cases of a 3-d tiling, else 1)
    tests: dict[str, Tensor]               # TEST3 .. TEST13, SUBCONFIG13, and the first edge of TILING13_5_1

    def row(self, name: str, config: Tensor, sub: Tensor | int = 0) -> Tensor:
        """Rows of tiling `name` for configurations `config` (and sub-cases `sub` of a 3-d tiling)."""
        return self.base[name] + config * self.width[name] + sub


def lewiner_tables(edges: tuple, device: torch.device) -> LewinerTables:
    """scikit-image's tables for our case bits and `edges` (`inference.marching_cubes.EDGES`), on `device`."""
    from skimage.measure import _marching_cubes_lewiner_luts as luts

    edge_map = torch.tensor(_edge_map(edges))
    rows, count, base, width = [torch.zeros(1, 12, 3, dtype=torch.long)], [0], {}, {}
    for name in sorted(n for n in dir(luts) if n.startswith("TILING")):
        table = torch.from_numpy(_lut(name).astype(np.int64))
        width[name] = table.shape[1] if table.dim() == 3 else 1
        flat = table.reshape(-1, table.shape[-1] // 3, 3)
        base[name] = len(count)
        rows.append(torch.nn.functional.pad(edge_map[flat], (0, 0, 0, 12 - flat.shape[1])))
        count += [flat.shape[1]] * flat.shape[0]
    triangles, count_t = torch.cat(rows), torch.tensor(count)
    centered = ((triangles == CENTER) & (torch.arange(12) < count_t[:, None])[..., None]).flatten(1).any(1)
    cases = torch.from_numpy(_lut("CASES").astype(np.int64))[_lewiner_index()]
    plain_row = torch.zeros(256, dtype=torch.long)
    for c, name in PLAIN.items():
        on = cases[:, 0] == c
        plain_row[on] = base[name] + cases[on, 1]
    tests = {n: torch.from_numpy(_lut(n).astype(np.int64)).to(device) for n in dir(luts) if n.startswith("TEST")}
    tests["SUBCONFIG13"] = torch.from_numpy(_lut("SUBCONFIG13").astype(np.int64)).to(device)
    tests["EDGE13_5"] = torch.from_numpy(_lut("TILING13_5_1")[:, :, 0].astype(np.int64)).to(device)
    ambiguous = torch.isin(cases[:, 0], torch.tensor(AMBIGUOUS))
    return LewinerTables(triangles.to(device), count_t.to(device), centered.to(device), cases[:, 0].to(device),
                         cases[:, 1].to(device), plain_row.to(device), ambiguous.to(device), base, width, tests)


def face_test(v: Tensor, face: Tensor) -> Tensor:
    """The asymptotic decider on face |face| (1..6) of each cube (corner values `v` [M, 8], level subtracted): the
    sign of the face's saddle against its corner A, read as the sign of `face` in the table asks. [M] bool."""
    corners = torch.tensor(FACES, device=v.device)[face.abs() - 1]                 # [M, 4]
    a, b, c, d = v.gather(1, corners).unbind(1)
    det = a * c - b * d
    return torch.where(det.abs() < EPS, face >= 0, face * a * det >= 0)


def interior_test(v: Tensor, sign: Tensor, edge: Tensor | None) -> Tensor:
    """Lewiner's interior test [M] bool. `edge` None (cases 4 and 10): the plane at the height t where the bilinear
    interpolant of the vertical faces is extremal; else the plane through the level's point on that edge."""
    pos, neg = sign > 0, sign < 0
    if edge is None:
        v0, v1, v2, v3, v4, v5, v6, v7 = v.unbind(1)
        a = (v4 - v0) * (v6 - v2) - (v7 - v3) * (v5 - v1)
        b = v2 * (v4 - v0) + v0 * (v6 - v2) - v1 * (v7 - v3) - v3 * (v5 - v1)
        t = -b / (2 * a + EPS)
        at, bt, ct, dt = (v[:, i] + (v[:, j] - v[:, i]) * t for i, j in ((0, 4), (3, 7), (2, 6), (1, 5)))
        outside = (t < 0) | (t > 1)
    else:
        p = torch.tensor(PARALLEL, device=v.device)[edge]                          # [M, 8]
        e0, e1 = v.gather(1, p[:, :2]).unbind(1)
        t = e0 / (e0 - e1 + EPS)
        at = torch.zeros_like(t)
        ends = v.gather(1, p[:, 2:])                                                  # [M, 6]
        bt, ct, dt = (ends[:, i] + (ends[:, i + 1] - ends[:, i]) * t for i in (0, 2, 4))
        outside = torch.zeros_like(pos)
    test = (at >= 0).long() + 2 * (bt >= 0).long() + 4 * (ct >= 0).long() + 8 * (dt >= 0).long()
    det = at * ct - bt * dt
    inside = torch.where((test == 7) | (test == 11) | (test >= 13), neg, pos)
    inside = torch.where(test == 5, pos & (det < EPS), inside)
    inside = torch.where(test == 10, pos & (det >= EPS), inside)
    return torch.where(outside, pos, inside)


# case 13: Lewiner's sub-case numbers (SUBCONFIG13 of the six face tests) in runs, each run one tiling
RUNS13 = ((0, "TILING13_1"), (1, "TILING13_2"), (7, "TILING13_3"), (19, "TILING13_4"), (23, "TILING13_5"),
          (27, "TILING13_3_"), (39, "TILING13_2_"), (45, "TILING13_1_"), (46, None))


def _two_faces(t: LewinerTables, c: int, config: Tensor, v: Tensor, inner: Tensor) -> Tensor:
    """Cases 10 and 12: two ambiguous faces, and the interior where both separate."""
    test = t.tests[f"TEST{c}"][config]
    f0, f1 = face_test(v, test[:, 0]), face_test(v, test[:, 1])
    rows = torch.where(inner, t.row(f"TILING{c}_1_1", config), t.row(f"TILING{c}_1_2", config))
    rows = torch.where(f1, t.row(f"TILING{c}_2_", config), rows)
    rows = torch.where(f0, t.row(f"TILING{c}_2", config), rows)
    return torch.where(f0 & f1, t.row(f"TILING{c}_1_1_", config), rows)


def _case7(t: LewinerTables, config: Tensor, v: Tensor) -> Tensor:
    test = t.tests["TEST7"][config]
    faces = torch.stack([face_test(v, test[:, i]) for i in range(3)], 1)          # [M, 3]
    separated = faces.sum(1)
    # one face: the sub-case is that face (0, 1, 2); two: the face that is not (2, 1, 0)
    sub = torch.where(separated == 1, faces.long().argmax(1), 2 - (~faces).long().argmax(1))
    rows = torch.where(separated == 1, t.row("TILING7_2", config, sub), t.row("TILING7_3", config, sub))
    rows = torch.where(separated == 0, t.row("TILING7_1", config), rows)
    inner = interior_test(v, test[:, 3], test[:, 4])
    return torch.where(separated == 3, torch.where(inner, t.row("TILING7_4_2", config),
                                                   t.row("TILING7_4_1", config)), rows)


def _case13(t: LewinerTables, config: Tensor, v: Tensor) -> Tensor:
    test = t.tests["TEST13"][config]
    bits = sum(face_test(v, test[:, i]).long() << i for i in range(6))
    sub = t.tests["SUBCONFIG13"][bits]
    rows = torch.zeros_like(sub)                                   # row 0, no triangle, where `sub` is -1 (impossible)
    for (start, name), (end, _) in zip(RUNS13, RUNS13[1:]):
        on = (sub >= start) & (sub < end)
        k = (sub - start).clamp(0, end - start - 1)
        if name == "TILING13_5":
            inner = interior_test(v, test[:, 6], t.tests["EDGE13_5"][config, k])
            rows = torch.where(on & inner, t.row("TILING13_5_1", config, k), rows)
            rows = torch.where(on & ~inner, t.row("TILING13_5_2", config, k), rows)
        else:
            rows = torch.where(on, t.row(name, config, k), rows)
    return rows


def ambiguous_rows(t: LewinerTables, case: int, config: Tensor, v: Tensor) -> Tensor:
    """Rows of `t` for cubes of one ambiguous `case` with their configurations [M] and corner values `v` [M, 8]
    (Lewiner's corner order, float64, level subtracted)."""
    tests = t.tests
    if case == 3:
        return torch.where(face_test(v, tests["TEST3"][config]), t.row("TILING3_2", config),
                           t.row("TILING3_1", config))
    if case == 4:
        return torch.where(interior_test(v, tests["TEST4"][config], None), t.row("TILING4_1", config),
                           t.row("TILING4_2", config))
    if case == 6:
        test = tests["TEST6"][config]
        rows = torch.where(interior_test(v, test[:, 1], test[:, 2]), t.row("TILING6_1_1", config),
                           t.row("TILING6_1_2", config))
        return torch.where(face_test(v, test[:, 0]), t.row("TILING6_2", config), rows)
    if case == 7:
        return _case7(t, config, v)
    if case == 10:
        return _two_faces(t, 10, config, v, interior_test(v, tests["TEST10"][config, 2], None))
    if case == 12:
        test = tests["TEST12"][config]
        return _two_faces(t, 12, config, v, interior_test(v, test[:, 2], test[:, 3]))
    return _case13(t, config, v)


def corner_values(values: Tensor, cubes: Tensor, level: float) -> Tensor:
    """Corner values [M, 8] of `cubes` [M, 3] (first corners) in Lewiner's corner order, float64, less `level`."""
    offsets = torch.tensor(GRID_OFFSETS, device=values.device)
    p = cubes[:, None, :] + offsets                                                  # [M, 8, 3]
    return values[p[..., 0], p[..., 1], p[..., 2]].double() - level


def center_vertices(v: Tensor, cubes: Tensor) -> Tensor:
    """The inner vertex of `cubes` [M, 3]: their corners' mean weighted by 1 / |value - level| (`v` [M, 8])."""
    offsets = torch.tensor(GRID_OFFSETS, device=v.device, dtype=torch.float64)
    w = 1.0 / (EPS + v.abs())
    return (cubes.double() + (w @ offsets) / w.sum(1, keepdim=True)).float()


def lewiner_rows(t: LewinerTables, case_bits: Tensor, cubes: Tensor, values: Tensor,
                 level: float) -> tuple[Tensor, Tensor, Tensor]:
    """(row of `t` for each cube [M], the cubes with an inner vertex [K], those vertices [K, 3] float32), from our
    case bits [M] of `cubes` [M, 3]. Only the cubes of ambiguous cases are tested, grouped by case (one host sync
    for the group sizes)."""
    rows = t.plain_row[case_bits]
    ambiguous = t.ambiguous[case_bits].nonzero()[:, 0]
    case = t.case[case_bits[ambiguous]]
    order = ambiguous[torch.argsort(case, stable=True)]                             # [A] ambiguous, by case
    sizes = torch.bincount(case, minlength=max(AMBIGUOUS) + 1)[list(AMBIGUOUS)].tolist()
    v = corner_values(values, cubes[order], level)
    config = t.config[case_bits[order]]
    tested = [ambiguous_rows(t, c, cfg, vals) for c, cfg, vals in zip(AMBIGUOUS, config.split(sizes), v.split(sizes))
              if cfg.numel()]
    rows[order] = torch.cat(tested) if tested else order
    inner = t.centered[rows[order]].nonzero()[:, 0]
    return rows, order[inner], center_vertices(v[inner], cubes[order[inner]])
