"""Training sets from logged features: label rows joined to the feature vectors `featurectl serve` logged.

Each label row (the service's join keys, `event_timestamp`, any label columns) gets the latest row logged for the
same entity (every join key equal) whose `__log_timestamp` is at or before the label's time; of rows logged in the
same microsecond, the one with the greatest `__request_id`. The label rows keep their columns and order, and gain
every logged column but the join keys and `__log_date`, in the log's order: each feature's value, `__status` and
`__timestamp` (and, before an on-demand view's features, the request data it read, as the request sent it), then
`__log_timestamp` and `__request_id`, NULL where no row was logged for the entity by then. A service of on-demand
views only logs no join keys (Feast's schema): it is refused.

Logs are read where the registry's feature service says (its Feast `FileLoggingDestination`), with the schema Feast
derives for the service, so files written before a feature was added read NULL for it. The join reads the join
keys, times and request ids of every logged row, then only the logged rows it picked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from batch.training import TrainingSetError, request_times_ms
from common.log_columns import LOG_DATE, LOG_TIMESTAMP, REQUEST_ID, log_columns
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.types import ValueType


def logged_training_table(labels: pa.Table, service: str, store: Any) -> pa.Table:
    """`labels` with the logged columns of `service` appended (see the module docstring); `store` is Feast's
    `FeatureStore` over the registry `featurectl apply` wrote."""
    path, schema, keys = _logged_service(store, service)
    missing = [k for k in keys if k not in labels.column_names]
    if missing:
        raise TrainingSetError(f"the labels lack join key(s) {', '.join(missing)} of feature service `{service}`; "
                               f"columns: {', '.join(labels.column_names)}")
    added = [name for name in schema.names if name not in keys and name != LOG_DATE]
    clash = [name for name in added if name in labels.column_names]
    if clash:
        raise TrainingSetError(f"label column(s) {', '.join(clash)} would be replaced by logged columns of the same "
                               "name; rename them")
    dataset = _log_dataset(path, schema, service)
    logged = dataset.to_table(columns=[*keys, LOG_TIMESTAMP, REQUEST_ID])
    rows = _latest_at_or_before(logged, labels, keys, _times_us(labels), service)
    found = rows >= 0
    picked = dataset.take(pa.array(rows[found]), columns=added)
    at = pa.array(np.cumsum(found) - 1, mask=~found)
    out = labels
    for name in added:
        out = out.append_column(schema.field(name), picked.column(name).take(at))
    return out


def label_key_types(service: str, store: Any) -> dict[str, ValueType]:
    """The join keys labels of `service` must carry, with their types (a CSV of labels is read as them)."""
    _, schema, keys = _logged_service(store, service)
    by_arrow = {kind.arrow_type(): kind for kind in (ValueType.STRING, ValueType.INT64, ValueType.INT32,
                                                     ValueType.FLOAT64, ValueType.FLOAT32, ValueType.BOOL)}
    return {key: by_arrow[schema.field(key).type] for key in keys if schema.field(key).type in by_arrow}


def _logged_service(store: Any, service: str) -> tuple[str, pa.Schema, list[str]]:
    """The folder of the service's logs, Feast's schema of them, and their join keys."""
    from feast.errors import FeatureServiceNotFoundException
    from feast.infra.offline_stores.file_source import FileLoggingDestination

    try:
        feast_service = store.get_feature_service(service, allow_cache=False)
    except FeatureServiceNotFoundException:
        raise TrainingSetError(f"feature service `{service}` is not in the registry: define it with "
                               "logging=FeatureLogging(...) and run `featurectl apply`") from None
    config = feast_service.logging_config
    if config is None or not isinstance(config.destination, FileLoggingDestination):
        raise TrainingSetError(f"feature service `{service}` has no file logging: add "
                               "logging=FeatureLogging(sample_rate=...) to it, `featurectl apply`, and serve it")
    columns = log_columns(feast_service, store.registry, store.project)
    if not columns.join_keys:
        raise TrainingSetError(f"feature service `{service}` logs no join keys to match labels on: it serves only "
                               "on-demand views, whose logs Feast's schema gives their request data instead; add a "
                               "feature of the view they read to the service, `featurectl apply`, and serve it")
    return config.destination.path, columns.schema, list(columns.join_keys)


def _log_dataset(path: str, schema: pa.Schema, service: str) -> ds.Dataset:
    partitioning = ds.partitioning(pa.schema([schema.field(LOG_DATE)]), flavor="hive")
    try:
        # `__log_date=...` folders start with `_`, which pyarrow skips by default: only hidden files are skipped here
        dataset = ds.dataset(path, schema=schema, format="parquet", partitioning=partitioning, ignore_prefixes=["."])
    except FileNotFoundError:
        dataset = None
    if dataset is None or not dataset.files:
        raise TrainingSetError(f"no feature logs of `{service}` under {path}: serve the service with "
                               "`featurectl serve` first (its logs are written every platform.feature_logging."
                               "flush_s and at shutdown)")
    return dataset


def _times_us(labels: pa.Table) -> np.ndarray:
    """Each label's time in epoch microseconds: a timestamp column (naive = UTC), or integers in milliseconds."""
    times_ms = request_times_ms(labels, EVENT_TIMESTAMP)  # checks: present, no nulls, within the calendar
    column = labels.column(EVENT_TIMESTAMP)
    if pa.types.is_timestamp(column.type):
        return pc.cast(column, pa.timestamp("us", column.type.tz), safe=False).cast(pa.int64()).to_numpy()
    return times_ms * 1000


def _latest_at_or_before(logged: pa.Table, labels: pa.Table, keys: list[str], times_us: np.ndarray,
                         service: str) -> np.ndarray:
    """For each label, the index of its logged row (-1: none), by pandas' as-of join on the log time; rows sorted
    by time then request id, so that of equal times the greatest request id comes last and wins."""
    asked = {}
    for key in keys:
        try:
            asked[key] = labels.column(key).cast(logged.column(key).type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TrainingSetError(f"join key `{key}` is {labels.column(key).type} in the labels but "
                                   f"{logged.column(key).type} in the logs of `{service}`; convert it") from exc
    left = _keyed_frame(asked, {"_t": times_us, "_label": np.arange(labels.num_rows)})
    right = _keyed_frame({k: logged.column(k) for k in keys},
                         {"_t": logged.column(LOG_TIMESTAMP).cast(pa.int64()).to_numpy(),
                          "_id": logged.column(REQUEST_ID).to_numpy(zero_copy_only=False),
                          "_row": np.arange(logged.num_rows)})
    right = right.sort_values(["_t", "_id"], kind="stable").drop(columns="_id")
    joined = pd.merge_asof(left.sort_values("_t", kind="stable"), right, on="_t", by=keys, direction="backward")
    rows = np.full(labels.num_rows, -1, dtype=np.int64)
    hit = joined["_row"].notna().to_numpy()
    rows[joined["_label"].to_numpy()[hit]] = joined["_row"].to_numpy()[hit].astype(np.int64)
    return rows


def _keyed_frame(keys: dict[str, pa.ChunkedArray], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """The rows whose join keys are all present (no other can match), keys as pandas columns beside `columns`."""
    valid = np.ones(len(next(iter(columns.values()))), dtype=bool)
    for values in keys.values():
        valid &= pc.is_valid(values).to_numpy(zero_copy_only=False)
    frame = {k: v.filter(pa.array(valid)).to_pandas() for k, v in keys.items()}
    return pd.DataFrame({**frame, **{name: values[valid] for name, values in columns.items()}})
