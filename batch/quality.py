"""Data-quality checks of a backfill's output, and the profile of its rows for drift monitoring.

After a backfill wrote a view's rows of [start, end), they are read back (the written range only) and every
expectation of the view (`dsl.expectations`) runs over them, column at a time with Arrow and numpy:
- `InRange(f, min, max)`: fails when any value lies outside [min, max];
- `NotNullRate(f, at_least)`: fails when the share of rows with a value is below `at_least`;
- `AllowedValues(f, values)`: fails when any value is not one of `values`;
- `MaxChange(f, relative)`: fails when the mean over the rows moved by more than `relative` of the mean the
  previous backfill of the view recorded (that of the same range, else the latest); a previous mean of 0 allows
  no change. Nothing to compare with (a first backfill, no value now or then) passes.
Null and NaN are no value: only `NotNullRate` counts them. A range with no rows passes every check.

The profile of each feature (`common.feature_profile`) weighs each row by the time it holds: from its boundary
to the entity's next row, or to the range's end, at most the view's ttl. It is the distribution of the feature
at a uniformly random instant of the range (what a training set of rows spread over the range sees), where
counting rows would let the entities that change most often (popular assets, whose windows move every tile)
outweigh the rest. Vector features get a null rate but no profile: a histogram of whole embeddings says nothing.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch.offline_table import read_range
from batch.windows import OFFLINE_TIMESTAMP_TYPE
from common.feature_profile import FeatureProfile, categorical_profile, numeric_profile
from common.quality_log import CheckResult, QualityRecord
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_location
from dsl.expectations import AllowedValues, Expectation, InRange, MaxChange, NotNullRate
from dsl.feature_view import FeatureView
from dsl.types import ValueType, Vector

SAMPLE_ROWS = 5


def written_rows(view: FeatureView, data_dir, start_ms: int, end_ms: int) -> pa.Table:
    """The view's offline rows of [start_ms, end_ms), sorted by entity then time (none: an empty table)."""
    keys = list(view.entity.join_keys)
    columns = [*keys, EVENT_TIMESTAMP, *view.output_schema()]
    try:
        table = read_range(offline_table_location(data_dir, view), columns, start_ms, end_ms)
    except FileNotFoundError:
        fields = [(k, t.arrow_type()) for k, t in view.entity.join_keys.items()]
        fields += [(EVENT_TIMESTAMP, OFFLINE_TIMESTAMP_TYPE)]
        return pa.schema(fields + [(n, t.arrow_type()) for n, t in view.output_schema().items()]).empty_table()
    return table.sort_by([(k, "ascending") for k in keys] + [(EVENT_TIMESTAMP, "ascending")])


def _present(column: pa.ChunkedArray) -> np.ndarray:
    """Which rows have a value: not null and, for floats, not NaN."""
    valid = pc.is_valid(column)
    if pa.types.is_floating(column.type):
        valid = pc.and_(valid, pc.invert(pc.fill_null(pc.is_nan(column), True)))
    return valid.to_numpy(zero_copy_only=False).astype(bool)


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    """The column as float64, nulls 0; an integer beyond 2**53 rounds (means and profiles need no exact value,
    and Arrow's safe cast refuses it)."""
    return pc.fill_null(column.cast(pa.float64(), safe=False), 0.0).to_numpy(zero_copy_only=False)


def _samples(table: pa.Table, view: FeatureView, feature: str, rows: np.ndarray) -> tuple[dict[str, Any], ...]:
    """The first failing rows: join keys, event time (ISO 8601), value."""
    picked = table.take(pa.array(np.flatnonzero(rows)[:SAMPLE_ROWS]))
    out = []
    for row in picked.select([*view.entity.join_keys, EVENT_TIMESTAMP, feature]).to_pylist():
        row[EVENT_TIMESTAMP] = row[EVENT_TIMESTAMP].isoformat().replace("+00:00", "Z")
        value = row[feature]
        if isinstance(value, float) and not math.isfinite(value):
            row[feature] = str(value)
        out.append(row)
    return tuple(out)


def _in_range(check: InRange, table: pa.Table, view: FeatureView) -> CheckResult:
    column = table.column(check.feature)
    present = _present(column)
    low, high = check.min, check.max
    if pa.types.is_integer(column.type):  # exact: an integer past 2**53 is not rounded onto a bound
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        low, high = (None if low is None else math.ceil(low)), (None if high is None else math.floor(high))
    else:
        values = _numbers(column)
    below = values < low if low is not None else np.zeros(len(values), bool)
    above = values > high if high is not None else np.zeros(len(values), bool)
    bad = present & (below | above)
    failing, n = int(bad.sum()), int(present.sum())
    seen = f"; observed min {_number(values[present].min())}, max {_number(values[present].max())}" if n else ""
    bounds = f"[{'-inf' if check.min is None else check.min}, {'inf' if check.max is None else check.max}]"
    return CheckResult(check.feature, check.label, failing == 0, f"{failing:,} of {n:,} values outside {bounds}"
                       f"{seen}", failing, table.num_rows, failing, _samples(table, view, check.feature, bad))


def _number(value: Any) -> str:
    """An observed value as the message shows it: an integer whole, a float to 6 significant digits."""
    return str(int(value)) if isinstance(value, (int, np.integer)) else f"{value:g}"


def _not_null_rate(check: NotNullRate, table: pa.Table, view: FeatureView) -> CheckResult:
    present = _present(table.column(check.feature))
    n = table.num_rows
    if not n:
        return CheckResult(check.feature, check.label, True, "no rows", None, 0)
    rate = float(present.sum()) / n
    missing = n - int(present.sum())
    return CheckResult(check.feature, check.label, rate >= check.at_least,
                       f"{rate:.2%} of {n:,} rows have a value ({missing:,} null), at least {check.at_least:.2%} "
                       "expected", rate, n, missing if rate < check.at_least else 0,
                       _samples(table, view, check.feature, ~present) if rate < check.at_least else ())


def _allowed_values(check: AllowedValues, table: pa.Table, view: FeatureView) -> CheckResult:
    column = table.column(check.feature)
    present = _present(column)
    allowed = pc.is_in(column, value_set=pa.array(list(check.values), column.type))
    bad = present & ~pc.fill_null(allowed, True).to_numpy(zero_copy_only=False).astype(bool)
    failing = int(bad.sum())
    others = pc.unique(column.filter(pa.array(bad))).to_pylist()[:SAMPLE_ROWS] if failing else []
    listed = f": {', '.join(map(repr, others))}" if others else ""
    return CheckResult(check.feature, check.label, failing == 0,
                       f"{failing:,} of {int(present.sum()):,} values not allowed{listed}", failing, table.num_rows,
                       failing, _samples(table, view, check.feature, bad))


def _max_change(check: MaxChange, means: dict[str, float], baseline: Optional[QualityRecord]) -> CheckResult:
    now = means.get(check.feature)
    then = baseline.means.get(check.feature) if baseline is not None else None
    if now is None or then is None:
        why = "no value in the range" if now is None else "no earlier backfill of the view with a value to compare"
        return CheckResult(check.feature, check.label, True, why, None, 0)
    change = abs(now - then) / abs(then) if then else (0.0 if now == then else math.inf)
    span = f"[{baseline.start:%Y-%m-%dT%H:%M}Z, {baseline.end:%Y-%m-%dT%H:%M}Z)"
    return CheckResult(check.feature, check.label, change <= check.relative,
                       f"mean {now:g} against {then:g} in the backfill of {span}: {change:.1%} change, at most "
                       f"{check.relative:.1%} allowed", change, 0)


def _check(expectation: Expectation, table: pa.Table, view: FeatureView, means: dict[str, float],
           baseline: Optional[QualityRecord]) -> CheckResult:
    if isinstance(expectation, InRange):
        return _in_range(expectation, table, view)
    if isinstance(expectation, NotNullRate):
        return _not_null_rate(expectation, table, view)
    if isinstance(expectation, AllowedValues):
        return _allowed_values(expectation, table, view)
    if isinstance(expectation, MaxChange):
        return _max_change(expectation, means, baseline)
    raise TypeError(f"no check for {type(expectation).__name__}")


def holding_weights(table: pa.Table, keys: list[str], end_ms: int, ttl_ms: int) -> np.ndarray:
    """Per row (sorted by entity then time): ms from its time to the entity's next row or `end_ms`, at most
    `ttl_ms`."""
    stamps = table.column(EVENT_TIMESTAMP).cast(pa.int64()).to_numpy()
    following = np.full(len(stamps), end_ms, dtype=np.int64)
    if len(stamps) > 1:
        same = np.ones(len(stamps) - 1, dtype=bool)
        for key in keys:
            column = table.column(key).combine_chunks()
            same &= pc.equal(column[:-1], column[1:]).to_numpy(zero_copy_only=False)
        following[:-1] = np.where(same, stamps[1:], end_ms)
    return np.minimum(following - stamps, ttl_ms).astype(np.float64)


def _profiles(table: pa.Table, view: FeatureView, weights: np.ndarray) -> dict[str, FeatureProfile]:
    out = {}
    for name, kind in view.output_schema().items():
        if isinstance(kind, Vector):
            continue
        column = table.column(name)
        keep = _present(column) & (weights > 0)
        if not keep.any():
            continue
        if kind.is_numeric or kind is ValueType.TIMESTAMP:
            out[name] = numeric_profile(_numbers(column)[keep], weights[keep])
        else:
            encoded = column.filter(pa.array(keep)).combine_chunks().dictionary_encode()
            out[name] = categorical_profile(encoded.dictionary.to_pylist(), encoded.indices.to_numpy(), weights[keep])
    return out


def _means(table: pa.Table, view: FeatureView) -> dict[str, float]:
    out = {}
    for name, kind in view.output_schema().items():
        if kind.is_numeric:
            column = table.column(name)
            present = _present(column)
            if present.any():
                out[name] = float(_numbers(column)[present].mean())
    return out


def _null_rates(table: pa.Table, view: FeatureView) -> dict[str, float]:
    """Per feature, the share of rows without a value (null, or NaN); none without rows."""
    if not table.num_rows:
        return {}
    return {name: 1.0 - float(_present(table.column(name)).sum()) / table.num_rows for name in view.output_schema()}


def assess(view: FeatureView, table: pa.Table, start: dt.datetime, end: dt.datetime, project: str,
           baseline: Optional[QualityRecord]) -> QualityRecord:
    """The checks and profiles of a backfill's rows `table` (`written_rows`) of [start, end); `baseline`: what
    `MaxChange` compares with (`QualityLog.baseline`)."""
    means = _means(table, view)
    checks = tuple(_check(e, table, view, means, baseline) for e in view.expectations)
    end_ms = int(end.timestamp() * 1000)
    weights = holding_weights(table, list(view.entity.join_keys), end_ms, int(view.ttl.total_seconds() * 1000))
    return QualityRecord(project, view.name, start, end, dt.datetime.now(dt.timezone.utc), table.num_rows, checks,
                         means, _null_rates(table, view), _profiles(table, view, weights))


def check_backfill(views: list[FeatureView], start: dt.datetime, end: dt.datetime, data_dir, registry_url: str,
                   project: str) -> dict[str, QualityRecord]:
    """Check and profile what a backfill of [start, end) wrote for each view, and record it; view -> record."""
    from common.quality_log import QualityLog

    start_ms, end_ms = int(start.timestamp() * 1000), int(end.timestamp() * 1000)
    quality_log = QualityLog(registry_url)
    out = {}
    try:
        for view in views:
            baseline = quality_log.baseline(project, view.name, start, end)
            record = assess(view, written_rows(view, data_dir, start_ms, end_ms), start, end, project, baseline)
            quality_log.record(record)
            out[view.name] = record
    finally:
        quality_log.close()
    return out

