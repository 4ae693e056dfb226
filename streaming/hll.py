"""A growing union of serialized HyperLogLog sketches whose estimate costs 52 additions, not a pass over 16384
registers: the window writer merges each tile update into the windows it belongs to and re-estimates at once.

It reads the wire format that `dsl.sketch` documents (and builds only from its constants); registers only ever
rise, so the rank histogram is kept up to date as they do. The estimate is formed exactly as
`dsl.sketch.HyperLogLog.estimate` forms it, so a union here estimates to the same integer as
`sketch.estimate(sketch.merge_sketches(...))` over the same sketches.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dsl import sketch

_ENTRY = np.dtype([("index", "<u2"), ("rank", "u1")])
_SPARSE, _DENSE = 0, 1
# A union with more registers than this keeps them in a numpy array (16 KiB) instead of a dict.
DENSE_FROM = 2048
_SMALL = 5 + 3 * 64  # sparse sketches up to 64 registers are compared in Python, larger ones with numpy


def _check(data: bytes) -> None:
    if len(data) < 3 or data[0] != sketch.VERSION or data[1] != sketch.P or data[2] not in (_SPARSE, _DENSE):
        raise ValueError(f"not a featurectl HLL sketch: header {list(data[:3])}; tiles must come from HLL_SKETCH")


def _entries(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Indexes and ranks of the non-zero registers of one serialized sketch."""
    _check(data)
    if data[2] == _DENSE:
        ranks = np.frombuffer(data, dtype=np.uint8, offset=3, count=sketch.M)
        index = np.flatnonzero(ranks)
        return index, ranks[index]
    count = int.from_bytes(data[3:5], "little")
    entries = np.frombuffer(data, dtype=_ENTRY, offset=5, count=count)
    return entries["index"].astype(np.intp), entries["rank"]


def _records(data: bytes) -> list[bytes]:
    """The 3-byte entries of a sparse sketch."""
    return [data[i:i + 3] for i in range(5, len(data), 3)]


def delta_entries(new: bytes, old: bytes | None) -> tuple[list[int], list[int]]:
    """The registers (indexes, ranks) of sketch `new` that are higher than in `old`, an earlier version of the
    same tile's sketch: a tile update repeats every register of the tile, while few changed since the last one."""
    _check(new)
    if new[2] == _SPARSE and len(new) <= _SMALL and (not old or old[2] == _SPARSE):
        fresh = set(_records(new)).difference(_records(old)) if old else _records(new)  # a raised register is
        return [int.from_bytes(r[:2], "little") for r in fresh], [r[2] for r in fresh]  # a record not in `old`
    index, ranks = _entries(new)
    if old:
        old_index, old_ranks = _entries(old)  # both sorted by index
        if len(old_index):
            at = np.minimum(np.searchsorted(old_index, index), len(old_index) - 1)
            higher = ranks > np.where(old_index[at] == index, old_ranks[at], 0)
            index, ranks = index[higher], ranks[higher]
    return index.tolist(), ranks.tolist()


class HllUnion:
    """Registers (a dict while few, then a numpy array) and their rank histogram."""

    __slots__ = ("registers", "histogram")

    def __init__(self) -> None:
        self.registers: dict[int, int] | np.ndarray = {}
        self.histogram = [sketch.M] + [0] * sketch.MAX_RANK

    def add(self, data: bytes | None) -> None:
        """Union with one serialized sketch (None and b"" are empty)."""
        if data:
            index, ranks = _entries(data)
            self.add_entries(index.tolist(), ranks.tolist())

    def add_entries(self, index: list[int], ranks: list[int]) -> None:
        """Raise registers `index` to at least `ranks`."""
        if not index:
            return
        registers = self.registers
        if isinstance(registers, dict) and len(registers) + len(index) > DENSE_FROM:
            registers = self._to_dense()
        if isinstance(registers, np.ndarray):
            np.maximum.at(registers, np.asarray(index, dtype=np.intp), np.asarray(ranks, dtype=np.uint8))
            self.histogram = np.bincount(registers, minlength=sketch.MAX_RANK + 1).tolist()
            return
        histogram = self.histogram
        for i, rank in zip(index, ranks):
            old = registers.get(i, 0)
            if rank > old:
                registers[i] = rank
                histogram[old] -= 1
                histogram[rank] += 1

    def _to_dense(self) -> np.ndarray:
        dense = np.zeros(sketch.M, dtype=np.uint8)
        if self.registers:
            dense[np.fromiter(self.registers.keys(), dtype=np.intp)] = np.fromiter(self.registers.values(),
                                                                                   dtype=np.uint8)
        self.registers = dense
        return dense

    @property
    def zeros(self) -> int:
        return self.histogram[0]



def estimates(unions: Sequence[HllUnion]) -> list[int]:
    """The distinct-count estimates of many unions in one vectorized step. Each sum of 2**-register runs over the
    rank histogram from the highest rank down, as `dsl.sketch` sums it, so the floats (and estimates) are its own."""
    if not unions:
        return []
    histograms = np.array([u.histogram for u in unions], dtype=np.float64)
    sums = np.zeros(len(unions))
    for rank in range(sketch.MAX_RANK, -1, -1):
        sums += np.ldexp(histograms[:, rank], -rank)
    zeros = histograms[:, 0].astype(np.intp)
    return sketch.estimate_many(sums, zeros).tolist()
