"""A growing union of serialized HyperLogLog sketches whose estimate costs 52 additions, not a pass over 16384
registers: the window writer merges each tile update into the windows it belongs to and re-estimates at once.

Sketches are read by `dsl.sketch` (the one parser of the wire format); registers only ever rise, so the rank
histogram is kept up to date as they do. The estimate is formed exactly as
`dsl.sketch.HyperLogLog.estimate` forms it, so a union here estimates to the same integer as
`sketch.estimate(sketch.merge_sketches(...))` over the same sketches.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from dsl import sketch

# A union with more registers than this keeps them in a numpy array (16 KiB) instead of a dict.
DENSE_FROM = 2048


class HllUnion:
    """Registers (a dict while few, then a numpy array) and their rank histogram."""

    __slots__ = ("registers", "histogram")

    def __init__(self) -> None:
        self.registers: dict[int, int] | np.ndarray = {}
        self.histogram = [sketch.M] + [0] * sketch.MAX_RANK

    def add(self, data: bytes | None) -> None:
        """Union with one serialized sketch (None and b"" are empty)."""
        if data:
            self.add_entries(*sketch.entry_lists(data))

    def add_many(self, sketches: Iterable[bytes]) -> None:
        """Union with several serialized sketches at once (one pass over all their registers)."""
        index: list[int] = []
        ranks: list[int] = []
        for data in sketches:
            if data:
                more_index, more_ranks = sketch.entry_lists(data)
                index += more_index
                ranks += more_ranks
        self.add_entries(index, ranks)

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
