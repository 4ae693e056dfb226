"""The Python HyperLogLog: format, merge and accuracy (byte identity with Java is in tests/batch/test_udf_flink.py)."""

from __future__ import annotations

import mmh3
import numpy as np
import pytest

from dsl import sketch
from dsl.sketch import M, HyperLogLog, RELATIVE_STANDARD_ERROR

EMPTY = bytes([1, 14, 0, 0, 0])


def sketch_of(values) -> HyperLogLog:
    hll = HyperLogLog()
    hll.add_many(values)
    return hll


def test_hash_is_the_first_unsigned_half_of_murmur3_x64_128():
    for value in ["", "a", "user-42", "é日本語🙂"]:
        full = mmh3.hash128(value.encode(), seed=0, x64arch=True, signed=False)
        assert sketch.hll_hash(value) == full & (2**64 - 1)
    assert sketch.hll_hash("hello") == 14688674573012802306  # what dev.featurectl.udf.Murmur3 returns


def test_add_and_add_many_agree():
    one_by_one = HyperLogLog()
    for i in range(3000):
        one_by_one.add(f"v{i}")
    assert one_by_one.to_bytes() == sketch_of(f"v{i}" for i in range(3000)).to_bytes()


def test_add_many_skips_none_like_sql_null():
    assert sketch_of(["a", None, "b"]).to_bytes() == sketch_of(["a", "b"]).to_bytes()


@pytest.mark.parametrize("n, encoding", [(0, 0), (50, 0), (3000, 0), (50_000, 1)])
def test_bytes_round_trip(n, encoding):
    data = sketch_of(str(i) for i in range(n)).to_bytes()
    assert data[:3] == bytes([1, 14, encoding])
    assert HyperLogLog.from_bytes(data).to_bytes() == data


def test_sparse_layout_is_sorted_little_endian_entries():
    hll = sketch_of(["x", "y", "z"])
    data = hll.to_bytes()
    count = int.from_bytes(data[3:5], "little")
    entries = [(int.from_bytes(data[i:i + 2], "little"), data[i + 2]) for i in range(5, len(data), 3)]
    assert count == len(entries) == np.count_nonzero(hll.registers)
    assert [index for index, _ in entries] == sorted(index for index, _ in entries)
    assert all(hll.registers[index] == rank for index, rank in entries)


def test_sparse_switches_to_dense_when_count_times_3_reaches_m():
    hll, seen, i = HyperLogLog(), {}, 0
    while 5462 not in seen:
        hll.add(str(i))
        i += 1
        count = int(np.count_nonzero(hll.registers))
        if count in (5461, 5462) and count not in seen:
            seen[count] = hll.to_bytes()
    assert seen[5461][2] == 0 and len(seen[5461]) == 5 + 3 * 5461  # 5461 * 3 = 16383 < 16384
    assert seen[5462][2] == 1 and len(seen[5462]) == 3 + M


@pytest.mark.parametrize("left, right", [(100, 200), (100, 40_000), (40_000, 60_000)])
def test_merge_equals_sketch_of_union(left, right):
    a_values = [f"a{i}" for i in range(left)] + ["shared"]
    b_values = [f"b{i}" for i in range(right)] + ["shared"]
    union = sketch_of(a_values + b_values).to_bytes()
    merged = sketch_of(a_values)
    merged.merge(sketch_of(b_values))
    assert merged.to_bytes() == union
    parts = [sketch_of(a_values).to_bytes(), None, b"", sketch_of(b_values).to_bytes()]
    assert sketch.merge_sketches(parts) == union


@pytest.mark.parametrize("n", [1_000, 100_000, 1_000_000])
def test_estimate_within_three_standard_errors(n):
    rng = np.random.default_rng(n)
    values = [f"user-{x}" for x in rng.permutation(n)] + ["user-0"] * 100  # duplicates count once
    got = sketch.estimate(sketch_of(values).to_bytes())
    assert abs(got - n) <= 3 * RELATIVE_STANDARD_ERROR * n, got


def test_empty_sketch_estimates_zero():
    assert HyperLogLog().to_bytes() == EMPTY
    assert HyperLogLog().estimate() == 0
    assert sketch.estimate(EMPTY) == sketch.estimate(b"") == sketch.estimate(None) == 0
    assert sketch.merge_sketches([]) == sketch.merge_sketches([None]) == EMPTY


@pytest.mark.parametrize("data, fragment", [
    (bytes([2, 14, 0, 0, 0]), "not a featurectl HLL sketch"),
    (bytes([1, 12, 1]), "not a featurectl HLL sketch"),
    (bytes([1, 14, 1, 0]), "corrupt dense HLL sketch"),
    (bytes([1, 14, 0, 2, 0, 1, 0, 1]), "corrupt sparse HLL sketch"),
    (bytes([1, 14, 0, 1, 0, 0xff, 0xff, 1]), "register index"),
    (bytes([1, 14, 0, 1, 0, 0, 0, 52]), "rank 52"),
])
def test_bad_bytes_raise_value_error(data, fragment):
    with pytest.raises(ValueError, match=fragment):
        HyperLogLog.from_bytes(data)


def test_small_counts_are_nearly_exact_as_the_readme_says():
    """README: up to 10 distinct values the estimate is exact but for a rare collision (one low); from 10 to 100
    exact 9 times in 10, else one to three low, never high; from 100 to 1,000 within about 10 (p99)."""
    rng = np.random.default_rng(14)
    for low, high, exact_share, p99, worst in ((1, 10, 0.99, 0, 1), (10, 100, 0.85, 2, 3), (100, 1_000, 0.1, 12, 25)):
        errors = []
        for n in rng.integers(low, high + 1, 600):
            values = [f"v{x}" for x in rng.integers(0, 2**62, int(n))]
            errors.append(sketch_of(values).estimate() - len(set(values)))
        errors = np.array(errors)
        assert (errors == 0).mean() >= exact_share, (low, high, errors)
        assert np.percentile(np.abs(errors), 99) <= p99 and np.abs(errors).max() <= worst, (low, high, errors)
        if high <= 100:
            assert errors.max() <= 0, "below 100 values, collisions only ever lose some"


@pytest.mark.parametrize("n", [0, 1, 40, 64, 65, 3_000, 20_000])
def test_entry_lists_read_what_entries_reads(n):
    data = sketch_of([f"v{i}" for i in range(n)]).to_bytes()
    index, ranks = sketch.entries(data)
    assert sketch.entry_lists(data) == (index.tolist(), ranks.tolist())


def test_entry_lists_refuse_bad_sketches_as_entries_does():
    with pytest.raises(ValueError, match="register index"):
        sketch.entry_lists(bytes([1, 14, 0, 1, 0, 0xff, 0xff, 1]))
    with pytest.raises(ValueError, match="rank 52"):
        sketch.entry_lists(bytes([1, 14, 0, 1, 0, 0, 0, 52]))
