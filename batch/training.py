"""Point-in-time training sets: for each (entity, timestamp) row, the feature values as of that timestamp.

A request at time t reads each view's offline table at boundary b = floor(t / tile) * tile: the latest row of
its entity with event_timestamp <= b (the table only changes at boundaries, so that is the value as of t, and
nothing later leaks in), or NULL when that row is older than the view's ttl (event_timestamp < t - ttl, Feast's
rule; Feast's own `get_historical_features` over the same table returns the same values). No row: NULL.

The as-of join is vectorized: entity keys become integer codes shared by both sides, rows and requests become
int64 keys `code * span + tile index`, and one binary search finds every request's row.

An on-demand view's features are computed from its stored inputs, joined as above, and its request fields,
columns of the entity rows, by the same `OnDemandUdf` the online SDK runs (`dsl.transform`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from batch.offline_table import read_range
from common.errors import FeaturectlError
from common.storage import Storage
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_location
from dsl.duration import milliseconds
from dsl.feature_view import FeatureView
from dsl.on_demand import OnDemandView
from dsl.repo import Repository
from dsl.types import ValueType


# Epoch milliseconds of the calendar's ends (0001-01-01 and 9999-12-31T23:59:59.999, UTC): a request time past
# them is in another unit or garbage, and no instant can be made of it.
CALENDAR_MS = (-62_135_596_800_000, 253_402_300_799_999)


class TrainingSetError(FeaturectlError, ValueError):
    """A training set cannot be built as asked; the message says why and what to do."""


Wanted = list[tuple[FeatureView | OnDemandView, list[str]]]


def resolve_features(repo: Repository, features: str | Sequence[str]) -> Wanted:
    """A feature service name, or "view:feature" references -> the features wanted per view (on-demand views
    included), in order."""
    if isinstance(features, str):
        refs = [(ref.view, name) for ref in repo.resolve_service(repo.service(features)) for name in ref.features]
    else:
        refs = []
        for entry in features:
            view_name, sep, name = entry.partition(":")
            if not sep or not view_name or not name:
                raise TrainingSetError(f"feature reference `{entry}` is not `view:feature`, e.g. "
                                       "`asset_activity:views_1h`; or pass a feature service name")
            refs.append((view_name, name))
    wanted: dict[str, list[str]] = {}
    for view_name, name in refs:
        known = _view(repo, view_name).feature_names
        if name not in known:
            raise TrainingSetError(f"feature view `{view_name}` has no feature `{name}`; it has: {', '.join(known)}")
        names = wanted.setdefault(view_name, [])
        if name not in names:
            names.append(name)
    return [(_view(repo, v), names) for v, names in wanted.items()]


def _view(repo: Repository, name: str) -> FeatureView | OnDemandView:
    return repo.on_demand_view(name) if any(o.name == name for o in repo.on_demand) else repo.view(name)


def stored_reads(wanted: Wanted) -> list[tuple[FeatureView, list[str]]]:
    """The stored features a training set reads: those asked for, and the inputs of the on-demand views asked
    for, each once per view."""
    reads: dict[str, tuple[FeatureView, list[str]]] = {}
    for view, names in wanted:
        refs = [(view, names)] if isinstance(view, FeatureView) else [(r.of, r.features) for r in view.stored_inputs]
        for stored, features in refs:
            known = reads.setdefault(stored.name, (stored, []))[1]
            known.extend(f for f in features if f not in known)
    return list(reads.values())


def entity_columns(wanted: Wanted) -> dict[str, ValueType]:
    """The columns entity rows hold for `wanted`, with their declared types: the join keys of the stored views
    read, and the request fields of the on-demand views."""
    out: dict[str, ValueType] = {}
    for view, _ in stored_reads(wanted):
        out.update(view.entity.join_keys)
    for view, _ in wanted:
        if isinstance(view, OnDemandView):
            out.update(view.request_schema)
    return out


def get_historical_features(entity_df: pd.DataFrame, features: str | Sequence[str], repo: Repository,
                            data_dir: Path | Storage, *, full_feature_names: bool = False,
                            timestamp_column: str = EVENT_TIMESTAMP) -> pd.DataFrame:
    """`entity_df` (join keys + `timestamp_column`) with the features as of each row's time, rows in order.

    `features` is a feature service name or a list of "view:feature". Integer and boolean features use pandas'
    nullable dtypes, so a missing value stays NULL rather than turning the column into floats.
    """
    entities = pa.Table.from_pandas(entity_df, preserve_index=False)
    table = training_table(entities, features, repo, data_dir, full_feature_names=full_feature_names,
                           timestamp_column=timestamp_column)
    nullable = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype()}
    return table.to_pandas(types_mapper=nullable.get)


def training_table(entities: pa.Table, features: str | Sequence[str], repo: Repository, data_dir: Path | Storage, *,
                   full_feature_names: bool = False, timestamp_column: str = EVENT_TIMESTAMP) -> pa.Table:
    """The Arrow form of `get_historical_features`: `entities` with one column appended per feature."""
    wanted = resolve_features(repo, features)
    times = request_times_ms(entities, timestamp_column)
    names = _output_names(wanted, full_feature_names)
    values: dict[tuple[str, str], pa.ChunkedArray | pa.Array] = {}
    for view, feature_names in stored_reads(wanted):
        values.update(((view.name, name), column)
                      for name, column in as_of(view, feature_names, entities, times, data_dir).items())
    out = entities
    for view, feature_names in wanted:
        columns = values if isinstance(view, FeatureView) else on_demand_columns(view, entities, values)
        for name in feature_names:
            out = out.append_column(names[(view.name, name)], columns[(view.name, name)])
    return out


def on_demand_columns(odfv: OnDemandView, entities: pa.Table, stored: dict) -> dict[tuple[str, str], pa.Array]:
    """The view's features for every entity row: its stored inputs as of each row (`stored`, keyed by
    (view, feature)), its request fields from the entity rows' columns of those names."""
    columns = {name: stored[(ref.view, name)] for ref in odfv.stored_inputs for name in ref.features}
    for name, kind in odfv.request_schema.items():
        columns[name] = _request_column(odfv, entities, name, kind)
    out = odfv.udf.run(columns, entities.num_rows)
    return {(odfv.name, name): pa.array(out[name], type=kind.arrow_type()) for name, kind in odfv.schema.items()}


_REQUEST_ARROW = {ValueType.STRING: (pa.types.is_string, pa.types.is_large_string),
                  ValueType.INT64: (pa.types.is_integer,), ValueType.BOOL: (pa.types.is_boolean,),
                  ValueType.FLOAT64: (pa.types.is_integer, pa.types.is_floating)}


def _request_column(odfv: OnDemandView, entities: pa.Table, name: str, kind: ValueType) -> pa.ChunkedArray:
    """A request field's column, checked as the online SDK checks a request's: present, of its type, no NULLs."""
    where = f"on-demand view `{odfv.name}` reads request field `{name}` ({kind.value})"
    if name not in entities.column_names:
        raise TrainingSetError(f"{where}: the entity rows have no such column; add one value per row, as online "
                               "requests carry it")
    column = entities.column(name)
    if not any(test(column.type) for test in _REQUEST_ARROW[kind]):
        raise TrainingSetError(f"{where}: the entity rows' column is {column.type}; convert it")
    if column.null_count:
        raise TrainingSetError(f"{where}: {column.null_count} entity rows have none; every row needs one, as online")
    return column


def request_times_ms(entities: pa.Table, column: str) -> np.ndarray:
    """Epoch milliseconds of each request: a timestamp column (naive = UTC) or integers already in ms."""
    if column not in entities.column_names:
        raise TrainingSetError(f"the entity rows have no `{column}` column: add the time of each row "
                               f"(a timestamp, or epoch milliseconds); columns: {', '.join(entities.column_names)}")
    values = entities.column(column)
    if values.null_count:
        raise TrainingSetError(f"`{column}` has {values.null_count} empty values: every row needs a time")
    if pa.types.is_timestamp(values.type):
        times = pc.cast(values, pa.timestamp("ms", values.type.tz), safe=False).cast(pa.int64()).to_numpy()
    elif pa.types.is_integer(values.type):
        times = values.cast(pa.int64()).to_numpy()
    else:
        raise TrainingSetError(f"`{column}` is {values.type}: give timestamps or epoch milliseconds (integers)")
    outside = times[(times < CALENDAR_MS[0]) | (times > CALENDAR_MS[1])]
    if len(outside):
        raise TrainingSetError(f"`{column}` has {len(outside):,} values outside the calendar (years 1 to 9999), e.g. "
                               f"{outside[0]} ms since the epoch: give epoch milliseconds (seconds x 1000, "
                               "microseconds / 1000)")
    return times


def _output_names(wanted: Wanted, full: bool) -> dict[tuple[str, str], str]:
    names = {(view.name, f): f"{view.name}__{f}" if full else f for view, features in wanted for f in features}
    if not full:
        seen: dict[str, str] = {}
        for (view, feature), name in names.items():
            if name in seen:
                raise TrainingSetError(f"feature `{feature}` is asked of views `{seen[name]}` and `{view}`: pass "
                                       "full_feature_names (--full-feature-names) to name columns `view__feature`")
            seen[name] = view
    return names


def as_of(view: FeatureView, features: list[str], entities: pa.Table, times: np.ndarray,
          data_dir: Path | Storage) -> dict[str, pa.ChunkedArray | pa.Array]:
    """Each request's values of `features` from the view's offline table (see the module docstring)."""
    keys = list(view.entity.join_keys)
    missing = [k for k in keys if k not in entities.column_names]
    if missing:
        raise TrainingSetError(f"feature view `{view.name}` is keyed by {', '.join(keys)}; the entity rows lack "
                               f"{', '.join(missing)}")
    tile, ttl = milliseconds(view.tile), milliseconds(view.ttl)
    first, stop = int(times.min()) - ttl, int(times.max()) // tile * tile + 1
    path = offline_table_location(data_dir, view)
    try:
        rows = read_range(path, [*keys, EVENT_TIMESTAMP, *features], first, stop)
    except FileNotFoundError:
        raise TrainingSetError(f"feature view `{view.name}` has no offline table at {path}: run "
                               "`featurectl backfill --start ... --end ...` over the span of the entity rows") from None
    rows = _without_null_keys(rows, keys)
    if rows.num_rows == 0:
        return {name: pa.nulls(len(times), rows.schema.field(name).type) for name in features}
    row_codes, request_codes = _entity_codes(rows.select(keys), entities.select(keys), view.name)
    row_ms = rows.column(EVENT_TIMESTAMP).cast(pa.int64()).to_numpy()
    origin = first // tile - 1
    row_index = -(-row_ms // tile) - origin  # ceil: a row counts from the first boundary at or after it
    request_index = times // tile - origin
    span = int(max(row_index.max(), request_index.max())) + 1
    row_keys = row_codes * span + row_index
    order = np.argsort(row_keys, kind="stable")
    at = _search_right(row_keys[order], request_codes * span + request_index) - 1
    row = order[np.maximum(at, 0)]
    found = (request_codes >= 0) & (at >= 0) & (row_codes[row] == request_codes) & (row_ms[row] >= times - ttl)
    values = rows.select(features).combine_chunks().take(pa.array(row, mask=~found))
    return {name: values.column(name) for name in features}


def _without_null_keys(rows: pa.Table, keys: list[str]) -> pa.Table:
    """Rows no lookup can match are dropped (our backfill writes none; other writers might)."""
    if not any(rows.column(k).null_count for k in keys):
        return rows
    with_keys = pc.is_valid(rows.column(keys[0]))
    for key in keys[1:]:
        with_keys = pc.and_(with_keys, pc.is_valid(rows.column(key)))
    return rows.filter(with_keys)


def _search_right(sorted_keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """np.searchsorted(..., side="right"), with the queries visited in order: far fewer cache misses."""
    order = np.argsort(queries)
    out = np.empty(len(queries), dtype=np.int64)
    out[order] = np.searchsorted(sorted_keys, queries[order], side="right")
    return out


def _entity_codes(rows: pa.Table, requests: pa.Table, view: str) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of the entities of both sides (equal keys, equal codes); -1 for requests of an entity
    without rows, or with a NULL key. `rows` has no NULL keys."""
    row_codes = np.zeros(rows.num_rows, dtype=np.int64)
    request_codes = np.zeros(requests.num_rows, dtype=np.int64)
    for key in rows.column_names:
        known = pc.unique(rows.column(key).combine_chunks())
        try:
            asked = requests.column(key).cast(known.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TrainingSetError(f"feature view `{view}`: join key `{key}` is {known.type} in the offline table "
                                   f"but {requests.column(key).type} in the entity rows; convert it") from exc
        row_index = pc.index_in(rows.column(key), value_set=known).to_numpy(zero_copy_only=False)
        request_index = pc.index_in(asked, value_set=known, skip_nulls=True).fill_null(-1).to_numpy(
            zero_copy_only=False)
        row_codes = row_codes * len(known) + row_index
        request_codes = np.where((request_codes < 0) | (request_index < 0), -1,
                                 request_codes * len(known) + request_index)
        if len(rows.column_names) > 1:  # keep codes dense so several keys cannot overflow int64
            dense, row_codes = np.unique(row_codes, return_inverse=True)
            at = np.minimum(np.searchsorted(dense, request_codes), max(len(dense) - 1, 0))
            request_codes = np.where((request_codes >= 0) & (dense[at] == request_codes), at, -1)
    return row_codes, request_codes
