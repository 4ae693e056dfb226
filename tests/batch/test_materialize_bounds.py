"""A materialize range given to the microsecond selects, from an offline table of any timestamp unit, exactly the
rows whose stored time lies in [start, end]; casting such a bound to a coarser column used to raise ArrowInvalid."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from batch.materialize import timestamp_bounds

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
BASE = dt.datetime(2026, 3, 9, 17, 4, 12, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_bounds_finer_than_the_column_select_exactly_the_rows_inside(unit):
    step = {"s": dt.timedelta(seconds=1), "ms": dt.timedelta(milliseconds=1), "us": dt.timedelta(microseconds=1),
            "ns": dt.timedelta(microseconds=1)}[unit]
    times = [BASE + k * step for k in range(-3, 4)]
    column = pa.array(times, pa.timestamp(unit, "UTC"))
    for start, end in [(BASE - step / 2 + dt.timedelta(microseconds=1), BASE + step / 2),
                       (BASE - dt.timedelta(microseconds=333), BASE + dt.timedelta(microseconds=1_001)),
                       (BASE, BASE), (BASE + dt.timedelta(microseconds=1), BASE + step)]:
        first, last = timestamp_bounds(start, end, column.type)
        chosen = pc.filter(column, pc.and_(pc.greater_equal(column, first), pc.less_equal(column, last)))
        assert chosen.to_pylist() == [t for t in times if start <= t <= end], (unit, start, end)


def test_naive_bounds_are_taken_as_utc():
    first, last = timestamp_bounds(BASE.replace(tzinfo=None), BASE.replace(tzinfo=None), pa.timestamp("ms", "UTC"))
    millis = (BASE - EPOCH) // dt.timedelta(milliseconds=1)
    assert (first.value, last.value) == (millis, millis)
