"""Arrow IPC over HTTP: the binary face of `POST /get-online-features`, for service-to-service callers.

Request (`Content-Type: application/vnd.apache.arrow.stream`): one Arrow IPC stream whose columns are the entity
rows (one column per join key, and the request fields of on-demand views beside them) and whose schema metadata
names what to read, as Feast's JSON body does: `features` (a JSON list of `view:feature` strings) or
`feature_service` (a name), and optionally `full_feature_names` (`true`/`false`). Reading it is one pass of
Arrow's C++ reader over the bytes, no JSON at all; the metadata is a few bytes.

Answer (`Accept: application/vnd.apache.arrow.stream`): one Arrow IPC stream, one record batch: the join key
columns, then per feature, in request order, its values (the feature's Arrow type), `{name}:status` (Feast's
status strings, dictionary-encoded) and `{name}:event_timestamp` (`timestamp[ns, UTC]`, or `[us, UTC]` for a view
with an event time outside the years 1678-2262; the epoch where the JSON answer says `1970-01-01T00:00:00Z`).
`:` never occurs in a feature name, so these names never collide. Errors stay JSON (`application/json`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from serving.errors import RequestError
from serving.result import NOT_FOUND, NULL_VALUE, OUTSIDE_MAX_AGE, PRESENT, OnlineFeatures, ViewRows, \
    parse_timestamps

STATUS_SUFFIX, TIMESTAMP_SUFFIX = ":status", ":event_timestamp"
_STATUSES = pa.array([PRESENT, NULL_VALUE, NOT_FOUND, OUTSIDE_MAX_AGE])
_CODE = {PRESENT: 0, NULL_VALUE: 1, NOT_FOUND: 2, OUTSIDE_MAX_AGE: 3}
_UTC_NS, _UTC_US = pa.timestamp("ns", tz="UTC"), pa.timestamp("us", tz="UTC")
_NS_SPAN_S = 9_000_000_000  # past this many seconds from the epoch, nanoseconds overflow int64
_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)


class MalformedArrow(RequestError):
    """The body is not an Arrow IPC stream of the shape above."""

    code = "malformed_arrow"


def parse_arrow_request(body: bytes, max_rows: int) -> tuple[Any, dict, bool]:
    """(features or service name, entity columns, full_feature_names) from an Arrow IPC request body of at most
    `max_rows` rows."""
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise MalformedArrow(f"the body is not an Arrow IPC stream ({exc}); send one record batch stream with a "
                             "column per join key, as pyarrow.ipc.new_stream writes it") from None
    meta = table.schema.metadata or {}
    service, features = meta.get(b"feature_service"), meta.get(b"features")
    if (service is None) == (features is None):
        raise MalformedArrow("the stream's schema metadata must name either `features` (a JSON list of "
                             "`view:feature` strings) or `feature_service`, not both nor neither")
    if service is not None:
        if not service:
            raise MalformedArrow("`feature_service` must be a non-empty string, the name of a feature service")
        wanted: Any = service.decode("utf-8", "replace")
    else:
        try:
            wanted = orjson.loads(features)
        except orjson.JSONDecodeError:
            wanted = None
        if not isinstance(wanted, list) or not wanted or not all(isinstance(f, str) for f in wanted):
            raise MalformedArrow("metadata `features` must be a JSON list of `view:feature` strings, "
                                 'e.g. ["asset_activity:views_1h"]')
    full = meta.get(b"full_feature_names", b"false").lower()
    if full not in (b"true", b"false"):
        raise MalformedArrow("metadata `full_feature_names` must be `true` or `false`")
    if not table.num_columns:
        raise MalformedArrow("the stream has no columns: give one column per join key, e.g. `asset_id`")
    if table.num_rows > max_rows:
        raise MalformedArrow(f"the stream has {table.num_rows} rows; at most {max_rows} per request")
    return wanted, table.to_pydict(), full == b"true"


def arrow_request(features: Any, entities: dict, full_feature_names: bool = False) -> bytes:
    """The request body `parse_arrow_request` reads: `entities` (join key -> values) as columns, `features` (a list
    of references, or a feature service name) in the schema metadata."""
    table = pa.table(entities) if not isinstance(entities, pa.Table) else entities
    meta = {b"feature_service": features.encode()} if isinstance(features, str) else \
        {b"features": orjson.dumps(list(features))}
    meta[b"full_feature_names"] = b"true" if full_feature_names else b"false"
    return _stream(table.replace_schema_metadata(meta))


def arrow_answer(response: OnlineFeatures, join_keys: dict) -> bytes:
    """The answer's IPC stream; `join_keys` maps each entity column to its ValueType (its Arrow type).

    Per request the cost is per Arrow array (about 3 us each to build), so arrays are shared where the answer
    allows: the features of one type are built as one array and sliced (a slice is a view), and the features of
    one view share its event time column and, when none of them holds a null, its status column."""
    columns = _values(response)
    names: list[str] = []
    arrays: list[pa.Array] = []
    stamps: dict[int, pa.Array] = {}  # per view's rows
    shared: dict[int, pa.Array] = {}  # per view's rows: the statuses of a feature with no null
    for key, values in response.entities.items():
        names.append(key)
        arrays.append(pa.array(values, type=join_keys[key].arrow_type() if key in join_keys else None))
    for name in response.names:
        values, rows = response.values[name], response.rows_of[name]
        names += (name, name + STATUS_SUFFIX, name + TIMESTAMP_SUFFIX)
        if None in values:
            statuses = _statuses(rows.statuses(values))
        else:
            statuses = shared.get(id(rows))
            if statuses is None:
                statuses = shared[id(rows)] = _statuses(rows.statuses(values))
        if id(rows) not in stamps:
            stamps[id(rows)] = _timestamps(rows)
        arrays += (columns[name], statuses, stamps[id(rows)])
    return _stream(pa.RecordBatch.from_arrays(arrays, names=names))


def _values(response: OnlineFeatures) -> dict[str, pa.Array]:
    """Each feature's values as an Arrow array: one array per type, sliced per feature."""
    by_kind: dict[Any, list[str]] = {}
    for name in response.names:
        by_kind.setdefault(response.kinds.get(name), []).append(name)
    out: dict[str, pa.Array] = {}
    for kind, names in by_kind.items():
        arrow_type = kind.arrow_type() if kind else None
        if len(names) == 1 or arrow_type is None:
            out.update((name, pa.array(response.values[name], type=arrow_type)) for name in names)
            continue
        columns = [response.values[name] for name in names]
        flat = pa.array([v for column in columns for v in column], type=arrow_type)
        at = 0
        for name, column in zip(names, columns):
            out[name] = flat.slice(at, len(column))
            at += len(column)
    return out


def _statuses(statuses: list[str]) -> pa.DictionaryArray:
    codes = np.fromiter(map(_CODE.__getitem__, statuses), dtype=np.int8, count=len(statuses))
    return pa.DictionaryArray.from_arrays(codes, _STATUSES)


def _timestamps(rows: ViewRows) -> pa.Array:
    """Each row's event time (0, the epoch, for a missing row), as Feast's JSON answer reports it."""
    seconds, nanos = rows.epoch or parse_timestamps(rows.ts_raw)
    if seconds and max(max(seconds), -min(seconds)) >= _NS_SPAN_S:  # outside the years 1678-2262: microseconds
        return pa.array([s * 1_000_000 + n // 1_000 for s, n in zip(seconds, nanos)], type=_UTC_US)
    return pa.array([s * 1_000_000_000 + n for s, n in zip(seconds, nanos)], type=_UTC_NS)


def _stream(data: Any) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=_OPTIONS) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()
