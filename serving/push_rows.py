"""Rows of a push, as columns, checked strictly against the columns they fill before anything is written.

A value counts only when it is already of its column's type, the rule the stream's parser applies to Kafka JSON
(README, Writing features): a str for String; an int (never a bool) in range for Int32, Int64 and Timestamp (epoch
milliseconds); an int or a finite float for Float32/Float64; a bool for Bool; a list of exactly `dim` such numbers
(in float32 range) for Vector(dim); None for no value. Nothing is cast.
Python and pandas instants (datetime, pandas Timestamp) become epoch milliseconds and pandas' missing values
(NaN, NaT, NA) None first: those are spellings of a value, not another type. The first bad value is refused with
its row and column, and then no row of the push is written.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence, Union

from common.errors import shown
from common.instants import format_epoch_ms
from dsl.compile_stream_source import MAX_AHEAD_MS
from dsl.types import FLOAT32_MAX, INT_RANGES, FeatureType, ValueType, Vector
from serving.errors import RequestError

if TYPE_CHECKING:
    import pandas as pd

PushRows = Union[Mapping[str, Sequence[Any]], Sequence[Mapping[str, Any]], "pd.DataFrame"]

MAX_ROWS = 10_000
SECONDS_BELOW_MS = 100_000_000_000  # 1973-03-03 in ms, 5138 in seconds (the history's input check warns likewise)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MILLISECOND = dt.timedelta(milliseconds=1)
_WANTED = {ValueType.STRING: "a string", ValueType.INT32: "an integer", ValueType.INT64: "an integer",
           ValueType.TIMESTAMP: "an integer (epoch milliseconds)", ValueType.FLOAT32: "a number",
           ValueType.FLOAT64: "a number", ValueType.BOOL: "true or false"}


class PushRowError(RequestError):
    """Pushed rows of the wrong shape, or a value not of its column's type; names the row and column."""

    code = "bad_rows"


def epoch_ms(value: dt.datetime) -> int:
    """An instant as epoch milliseconds (a datetime without a zone is taken as UTC, as every command does)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - _EPOCH) // _MILLISECOND


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return epoch_ms(value)
    if getattr(value, "ndim", 0):  # a numpy array: a vector
        return value.tolist()
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar
        return value.item()
    return value


def _frame_columns(frame: "pd.DataFrame") -> dict[str, list]:
    out = {}
    for name in frame.columns:
        series = frame[name]
        out[str(name)] = [_plain(v) for v in series.astype(object).where(series.notna(), None).tolist()]
    return out


def columns_of(rows: PushRows) -> dict[str, list]:
    """Rows as columns: from a dict of columns, a list of dicts (a column a row leaves out is None there) or a
    pandas DataFrame."""
    if hasattr(rows, "columns") and hasattr(rows, "astype"):
        return _frame_columns(rows)  # type: ignore[arg-type]
    if isinstance(rows, Mapping):
        columns = {}
        for name, values in rows.items():
            if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):
                values = values.tolist()
            if not isinstance(values, (list, tuple)):
                raise PushRowError(f"column {shown(name)} must be a list of values, one per row; got "
                                   f"{type(values).__name__}")
            columns[str(name)] = [_plain(v) for v in values]
        return columns
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, Mapping) for r in rows):
        raise PushRowError("rows must be a dict of columns (name -> list of values), a list of {column: value} "
                           "dicts or a pandas DataFrame")
    names = list(dict.fromkeys(str(k) for row in rows for k in row))
    return {name: [_plain(row.get(name)) for row in rows] for name in names}


def _vector_problem(value: Any, kind: Vector) -> str:
    if type(value) not in (list, tuple):
        return f"{kind.value} takes a list of {kind.dim} numbers, not {type(value).__name__} {shown(value)}"
    if len(value) != kind.dim:
        return f"{kind.value} takes a list of {kind.dim} numbers, got {len(value)}: the dimension does not match"
    if _plain_float32s(value):
        return ""
    for i, number in enumerate(value):
        problem = _problem(number, ValueType.FLOAT32)
        if problem:
            return f"element {i}: {problem}"
    return ""


def _plain_float32s(value: Sequence[Any]) -> bool:
    """Whether every element is an int or float that is finite and within float32's range, checked in C (numpy):
    the common case, which the element-by-element check (and its message) is only needed to refute."""
    import numpy as np

    if not set(map(type, value)) <= {int, float}:
        return False
    try:
        magnitudes = np.abs(np.asarray(value, dtype=np.float64))
    except OverflowError:
        return False
    return bool((magnitudes <= FLOAT32_MAX).all())


def _problem(value: Any, kind: FeatureType) -> str:
    """Why `value` is no value of `kind`; empty when it is one."""
    if isinstance(kind, Vector):
        return _vector_problem(value, kind)
    if kind is ValueType.STRING:
        ok = type(value) is str
    elif kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        if type(value) is int and not low <= value <= high:
            return f"{value} is out of the {kind.value} range"
        ok = type(value) is int
    elif kind is ValueType.BOOL:
        ok = type(value) is bool
    else:
        if type(value) in (int, float) and not math.isfinite(value):
            return f"{value} is not a finite number"
        if kind is ValueType.FLOAT32 and type(value) in (int, float) and abs(value) > FLOAT32_MAX:
            return f"{value} is out of the float32 range"
        ok = type(value) in (int, float)
    if ok:
        return ""
    return f"{kind.value} takes {_WANTED[kind]}, not {type(value).__name__} {shown(value)} (nothing is cast)"


def check_columns(columns: Mapping[str, list], schema: Mapping[str, FeatureType], required: Mapping[str, str],
                  what: str, needed: Sequence[str] = ()) -> int:
    """The number of rows, once every value is of its column's type, every `required` column (name -> why)
    holds a value in every row and every `needed` column is given (nulls allowed); else a PushRowError naming
    the first row and column at fault."""
    unknown = [c for c in columns if c not in schema]
    if unknown:
        raise PushRowError(f"{what} has no column {', '.join(shown(c) for c in unknown[:5])}; its columns are "
                           f"{', '.join(f'`{c}`' for c in schema)}")
    absent = [c for c in required if c not in columns]
    if absent:
        raise PushRowError(f"{what} needs column `{absent[0]}` ({required[absent[0]]}); give it in every row")
    absent = [c for c in needed if c not in columns]
    if absent:
        raise PushRowError(f"{what} needs every one of its columns, null where there is no value; missing: "
                           f"{', '.join(f'`{c}`' for c in absent)}")
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise PushRowError(f"columns have different lengths ({sorted(lengths)}): give one value per row in each")
    rows = lengths.pop() if lengths else 0
    if not rows:
        raise PushRowError("nothing to push: the rows are empty")
    if rows > MAX_ROWS:
        raise PushRowError(f"{rows} rows in one push; at most {MAX_ROWS}: split it")
    for name, values in columns.items():
        kind, why = schema[name], required.get(name)
        for i, value in enumerate(values):
            if value is None:
                if why:
                    raise PushRowError(f"row {i}, column `{name}`: no value, but {what} needs one ({why})")
                continue
            problem = _problem(value, kind)
            if problem:
                raise PushRowError(f"row {i}, column `{name}`: {problem}")
    return rows


def check_event_times(name: str, values: Sequence[int], now_ms: int) -> None:
    """Event times the stream can place: epoch milliseconds (not seconds), at most an hour ahead of now (the
    stream makes a later one a dead letter `future`)."""
    for i, value in enumerate(values):
        if value < SECONDS_BELOW_MS:
            raise PushRowError(f"row {i}, column `{name}`: {value} is before 1973-03-03 in epoch milliseconds; it "
                               "looks like seconds: give milliseconds (seconds x 1000)")
        if value > now_ms + MAX_AHEAD_MS:
            raise PushRowError(f"row {i}, column `{name}`: {format_epoch_ms(value)} is more than an hour ahead of "
                               "now; the stream would refuse it as `future`: give the time the event happened")
