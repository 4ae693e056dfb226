"""HyperLogLog sketches for approximate distinct counts, byte-identical to the Flink UDFs in `udf/`.

Tiles computed by Flink (`HLL_SKETCH`) are combined into window values here or in SQL (`HLL_MERGE`), so both
sides must agree bit for bit. Format version 1; `dev.featurectl.udf.Hll` implements the same, keep them in step:

- hash: MurmurHash3 x64_128, seed 0, over the value's UTF-8 bytes; the first 64-bit half (h1), unsigned.
- p = 14, m = 2**14 = 16384 registers; relative standard error 1.04 / sqrt(m) = 0.81 %.
- register index = the top p bits of the hash; rank = leading zeros of the other 64 - p bits (shifted to the
  top) + 1, capped at 64 - p + 1 = 51. A register keeps the greatest rank it saw; 0 means never hit.
- estimate: raw = alpha_m * m**2 / sum(2**-register), alpha_m = 0.7213 / (1 + 1.079 / m); when raw <= 2.5 m and
  `zeros` registers are 0 (zeros > 0), linear counting m * ln(m / zeros) instead; no large-range correction with
  64-bit hashes. The sum runs over a histogram of registers from rank 51 down to 0 and the result is rounded
  half up, so Java and Python return the same integer.
- bytes: [0] version 1, [1] p, [2] encoding (0 sparse, 1 dense), then
  sparse: u16 count (little-endian) and `count` entries (u16 index LE, u8 rank) of the non-zero registers,
  sorted by index; used exactly while count * 3 < m, where it is the smaller form.
  dense: m bytes, the rank of each register in index order.
  The encoding follows from the registers alone, so equal sketches are equal bytes; b"" reads as empty.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import mmh3
import numpy as np

P = 14
M = 1 << P
MAX_RANK = 64 - P + 1
VERSION = 1
RELATIVE_STANDARD_ERROR = 1.04 / math.sqrt(M)

_SPARSE = 0
_DENSE = 1
_HEADER = 3  # version, p, encoding
_SPARSE_HEADER = _HEADER + 2  # ... and the u16 entry count
_ALPHA = 0.7213 / (1 + 1.079 / M)
_LOW_BITS = (1 << (64 - P)) - 1
_ENTRY = np.dtype([("index", "<u2"), ("rank", "u1")])  # packed: 3 bytes, as in the wire format
_SMALL = _SPARSE_HEADER + 3 * 64  # sparse sketches up to 64 registers are compared in Python, larger with numpy


def hll_hash(value: str) -> int:
    """The sketch's 64-bit hash of `value`; a lone surrogate encodes as '?', as in Flink's StringData."""
    return mmh3.hash64(value.encode("utf-8", "replace"), seed=0, signed=False)[0]


class HyperLogLog:
    """A mutable sketch: 16384 uint8 registers, serialized canonically by `to_bytes`."""

    __slots__ = ("registers",)

    def __init__(self) -> None:
        self.registers = np.zeros(M, dtype=np.uint8)

    def add(self, value: str) -> None:
        hashed = hll_hash(value)
        index = hashed >> (64 - P)
        rank = MAX_RANK - (hashed & _LOW_BITS).bit_length()
        self.registers[index] = max(int(self.registers[index]), rank)

    def add_many(self, values: Iterable[Optional[str]]) -> None:
        """Adds every value; None is skipped, as SQL NULL is by HLL_SKETCH."""
        hashes = np.fromiter((hll_hash(v) for v in values if v is not None), dtype=np.uint64)
        index = (hashes >> np.uint64(64 - P)).astype(np.intp)
        # The low 64 - p bits fit a float64 exactly, and frexp's exponent is their bit length (0 for 0).
        _, bit_length = np.frexp((hashes & np.uint64(_LOW_BITS)).astype(np.float64))
        np.maximum.at(self.registers, index, (MAX_RANK - bit_length).astype(np.uint8))

    def merge(self, other: HyperLogLog) -> None:
        """Makes this sketch the union of itself and `other`."""
        np.maximum(self.registers, other.registers, out=self.registers)

    def estimate(self) -> int:
        histogram = np.bincount(self.registers, minlength=MAX_RANK + 1)
        total = 0.0
        for rank in range(MAX_RANK, -1, -1):  # the order Hll.java sums in: same floats, same result
            total += math.ldexp(float(histogram[rank]), -rank)
        return int(estimate_many(np.array([total]), np.array([histogram[0]]))[0])

    def to_bytes(self) -> bytes:
        nonzero = np.flatnonzero(self.registers)
        if len(nonzero) * 3 < M:
            entries = np.empty(len(nonzero), dtype=_ENTRY)
            entries["index"] = nonzero
            entries["rank"] = self.registers[nonzero]
            return bytes((VERSION, P, _SPARSE)) + len(nonzero).to_bytes(2, "little") + entries.tobytes()
        return bytes((VERSION, P, _DENSE)) + self.registers.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> HyperLogLog:
        sketch = cls()
        _merge_bytes(sketch.registers, data)
        return sketch


def merge_sketches(sketches: Iterable[Optional[bytes]]) -> bytes:
    """The union of serialized sketches (e.g. tiles into a window); None is skipped, as by HLL_MERGE."""
    union = HyperLogLog()
    for data in sketches:
        if data is not None:
            _merge_bytes(union.registers, data)
    return union.to_bytes()


def estimate(sketch: Optional[bytes]) -> int:
    """The distinct count of a serialized sketch; None or b"" is 0, as in HLL_ESTIMATE."""
    return HyperLogLog.from_bytes(sketch).estimate() if sketch else 0


# M * ln(M / zeros) for zeros = 0..M by math.log, as the scalar estimator takes it (numpy's log may be an ulp off).
_LINEAR_COUNTS = np.array([M * math.log(M / zeros) if zeros else math.inf for zeros in range(M + 1)])


def estimate_many(register_sums: np.ndarray, zeros: np.ndarray) -> np.ndarray:
    """The estimates of many sketches at once (int64), from each one's sum of 2**-register and zero count.

    The sums must be formed as `HyperLogLog.estimate` forms them (over the rank histogram, highest rank first):
    then every float operation is the scalar one, so the integers are the same. Batch windows use this to
    estimate merged sketches without building them.
    """
    raw = (_ALPHA * M * M) / register_sums
    linear = (raw <= 2.5 * M) & (zeros > 0)
    value = np.where(linear, _LINEAR_COUNTS[zeros], raw)
    return np.floor(value + 0.5).astype(np.int64)


def _check_header(data: bytes) -> None:
    if len(data) < _HEADER or data[0] != VERSION or data[1] != P or data[2] not in (_SPARSE, _DENSE):
        head = list(data[:_HEADER])
        msg = (f"not a featurectl HLL sketch: header {head}, expected [{VERSION}, {P}, 0 or 1]; "
               "build sketches with HLL_SKETCH or dsl.sketch")
        raise ValueError(msg)


def _parse(data: bytes) -> tuple[np.ndarray | slice, np.ndarray]:
    """The registers a serialized sketch sets: (indexes, ranks), or (all, every rank) when dense; validated."""
    _check_header(data)
    if data[2] == _DENSE:
        if len(data) != _HEADER + M:
            raise ValueError(f"corrupt dense HLL sketch: {len(data)} bytes, expected {_HEADER + M}")
        index, ranks = slice(None), np.frombuffer(data, dtype=np.uint8, offset=_HEADER)
    else:
        count = int.from_bytes(data[_HEADER:_SPARSE_HEADER], "little")
        if len(data) < _SPARSE_HEADER or len(data) != _SPARSE_HEADER + 3 * count:
            raise ValueError(f"corrupt sparse HLL sketch: {len(data)} bytes for {count} entries")
        entries = np.frombuffer(data, dtype=_ENTRY, offset=_SPARSE_HEADER)
        index, ranks = entries["index"].astype(np.intp), entries["rank"]
        if count and index.max() >= M:
            raise ValueError(f"corrupt sparse HLL sketch: register index {index.max()} >= {M}")
    if len(ranks) and ranks.max() > MAX_RANK:
        raise ValueError(f"corrupt HLL sketch: rank {ranks.max()} > {MAX_RANK}")
    return index, ranks


def _merge_bytes(registers: np.ndarray, data: bytes) -> None:
    """Raises `registers` to the ranks of a serialized sketch, validating it on the way."""
    if data:
        index, ranks = _parse(data)
        registers[index] = np.maximum(registers[index], ranks)  # sparse indexes are unique within a sketch


def entries(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Indexes (ascending) and ranks of the non-zero registers of one serialized sketch; b"" has none."""
    if not data:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.uint8)
    index, ranks = _parse(data)
    if isinstance(index, slice):
        index = np.flatnonzero(ranks)
        return index, ranks[index]
    return index, ranks


def entry_lists(data: bytes) -> tuple[list[int], list[int]]:
    """`entries` as Python lists, read without numpy from the small sparse sketches most tiles hold (a few times
    faster there); validated all the same."""
    if data and len(data) <= _SMALL and data[0] == VERSION and data[1] == P and data[2] == _SPARSE:
        if len(data) == _SPARSE_HEADER + 3 * int.from_bytes(data[_HEADER:_SPARSE_HEADER], "little"):
            index = [data[i] | data[i + 1] << 8 for i in range(_SPARSE_HEADER, len(data), 3)]
            ranks = list(data[_SPARSE_HEADER + 2::3])
            if not index or (max(index) < M and max(ranks) <= MAX_RANK):
                return index, ranks
    index, ranks = entries(data)  # the numpy reader, which also says what is wrong with a bad sketch
    return index.tolist(), ranks.tolist()


def _records(data: bytes) -> list[bytes]:
    """The 3-byte entries of a sparse sketch."""
    return [data[i:i + 3] for i in range(_SPARSE_HEADER, len(data), 3)]


def raised_entries(new: bytes, old: Optional[bytes]) -> tuple[list[int], list[int]]:
    """The registers (indexes, ranks) of sketch `new` that are higher than in `old`, an earlier version of the
    same tile's sketch: a tile update repeats every register of the tile, while few changed since the last one."""
    _check_header(new)
    if new[2] == _SPARSE and len(new) <= _SMALL and (not old or old[2] == _SPARSE):
        fresh = set(_records(new)).difference(_records(old)) if old else _records(new)  # a raised register is
        return [int.from_bytes(r[:2], "little") for r in fresh], [r[2] for r in fresh]  # a record not in `old`
    index, ranks = entries(new)
    if old:
        old_index, old_ranks = entries(old)  # both sorted by index
        if len(old_index):
            at = np.minimum(np.searchsorted(old_index, index), len(old_index) - 1)
            higher = ranks > np.where(old_index[at] == index, old_ranks[at], 0)
            index, ranks = index[higher], ranks[higher]
    return index.tolist(), ranks.tolist()


def many_entries(offsets: np.ndarray, data: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, ...]:
    """(row, register, rank) of every non-zero register of many sketches laid end to end in `data` (row i in
    `data[offsets[i]:offsets[i + 1]]`, read only where `present`; empty ones hold none), in row order."""
    starts, lengths = offsets[:-1], np.diff(offsets)
    rows = np.flatnonzero(present & (lengths > 0))
    head = starts[rows]
    if len(rows) and ((data[head] != VERSION).any() or (data[head + 1] != P).any()):
        raise ValueError(f"tile column holds sketches that are not featurectl HLL (version {VERSION}, p {P}): "
                         "re-run the backfill so that Flink rebuilds the tiles")
    encoding = data[head + 2]
    sparse, dense = rows[encoding == _SPARSE], rows[encoding == _DENSE]
    counts = (lengths[sparse] - _SPARSE_HEADER) // 3
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    at = np.repeat(starts[sparse] + _SPARSE_HEADER, counts) + 3 * within
    sparse_rows = np.repeat(sparse, counts)
    sparse_registers = data[at].astype(np.int64) | data[at + 1].astype(np.int64) << 8
    sparse_ranks = data[at + 2]
    dense_at = (starts[dense, None] + _HEADER + np.arange(M)).ravel()
    dense_rows = np.repeat(dense, M)
    dense_registers = np.tile(np.arange(M), len(dense))
    dense_ranks = data[dense_at]
    hit = dense_ranks > 0
    rows = np.concatenate([sparse_rows, dense_rows[hit]])
    order = np.argsort(rows, kind="stable") if len(dense) else slice(None)
    return (rows[order], np.concatenate([sparse_registers, dense_registers[hit]])[order],
            np.concatenate([sparse_ranks, dense_ranks[hit]]).astype(np.int64)[order])
