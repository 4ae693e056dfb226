"""Distinct counts of sliding windows from tile sketches, equal to estimating the merged sketch, without merging.

A window's merged sketch holds, per register, the greatest rank that any of its tiles holds there, and the
estimator only reads its rank histogram. With N_k = the number of registers whose rank in the window is k or
more, histogram[k] = N_k - N_(k+1) and zeros = M - N_1. For one k, a register reaches k at boundary b when one of
its entries (a tile's non-zero register) with rank >= k lies in the window: an entry of tile t covers the
boundaries t + 1 .. t + W (in tiles); the covers of one (entity, register) merge into runs, and N_k at b is the
number of runs open at b: a cumulative sum of +1 where runs open and -1 where they close, placed by looking up
(once per tile and window) the first boundary at or after each tile's entering and leaving. Ranks are geometric,
so all k together cost about two passes over the entries; the estimate comes from `dsl.sketch.estimate_many`,
summed in the estimator's order, so it is the integer that HLL_ESTIMATE(HLL_MERGE(...)) returns.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from dsl import sketch


def sketch_entries(sketches: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, register, rank) of every non-zero register of every sketch, in row order; NULL and b"" hold none."""
    sketches = sketches.cast(pa.binary())
    offsets = np.frombuffer(sketches.buffers()[1], dtype=np.int32, count=len(sketches) + 1,
                            offset=sketches.offset * 4).astype(np.int64)
    data = np.frombuffer(sketches.buffers()[2], dtype=np.uint8) if sketches.buffers()[2] else np.zeros(0, np.uint8)
    present = np.ones(len(sketches), dtype=bool)
    if sketches.null_count:
        present = sketches.is_valid().to_numpy(zero_copy_only=False)
    return sketch.many_entries(offsets, data, present)


class TileSketches:
    """The sketches of tiles sorted by entity, then time, ready to estimate windows at any boundaries."""

    def __init__(self, sketches: pa.Array, codes: np.ndarray, tiles: np.ndarray):
        """`codes` and `tiles`: each sketch's entity code and tile index (both ascending, as the rows are)."""
        positions, registers, ranks = sketch_entries(sketches)
        groups = codes[positions] * sketch.M + registers  # one (entity, register)
        order = np.argsort(groups, kind="stable")  # entries come in tile order, which stability keeps
        self.positions, self.groups = positions[order], groups[order]
        self.tiles, self.ranks = tiles[positions][order], ranks[order]

    def estimates(self, boundary_keys: np.ndarray, tile_keys: np.ndarray, windows: list[int]) -> dict[int, np.ndarray]:
        """Per window length (in tiles), the estimate at each boundary. Keys are `code * span + index`, sorted:
        `tile_keys` those of the sketches' tiles, `boundary_keys` those of the boundaries wanted."""
        entered = np.searchsorted(boundary_keys, tile_keys + 1)  # the first boundary each tile is in
        left = {w: np.searchsorted(boundary_keys, tile_keys + w + 1) for w in windows}  # ... it has left
        totals = {w: np.zeros(len(boundary_keys)) for w in windows}
        higher = {w: np.zeros(len(boundary_keys), dtype=np.int64) for w in windows}  # N_(k+1)
        for k in range(int(self.ranks.max(initial=0)), 0, -1):
            chosen = self.ranks >= k
            positions, groups, tiles = self.positions[chosen], self.groups[chosen], self.tiles[chosen]
            same_group = groups[1:] == groups[:-1]
            for w in windows:
                new_run = np.ones(len(positions), dtype=bool)
                new_run[1:] = ~same_group | (tiles[1:] - tiles[:-1] > w)
                run_end = np.append(new_run[1:], True)
                at_least = _open_runs(entered[positions[new_run]], left[w][positions[run_end]], len(boundary_keys))
                totals[w] += (at_least - higher[w]) * 2.0 ** -k  # histogram[k] * 2**-k, highest rank first
                higher[w] = at_least
        return {w: sketch.estimate_many(totals[w] + (sketch.M - higher[w]), sketch.M - higher[w]) for w in windows}


def _open_runs(opened: np.ndarray, closed: np.ndarray, n: int) -> np.ndarray:
    """How many runs are open at each of `n` boundaries, from the boundary each run opens and closes at.

    Runs: an entry of tile t covers boundaries t + 1 .. t + w, and the covers of one (entity, register) that
    touch or overlap form one run."""
    return np.cumsum(np.bincount(opened, minlength=n + 1) - np.bincount(closed, minlength=n + 1))[:-1]
