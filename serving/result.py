"""The answer to one request: columns in request order, and Feast's statuses and event timestamps on demand."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from dsl.types import FLOAT_TYPES, ValueType

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

EPOCH = "1970-01-01T00:00:00Z"
PRESENT, NULL_VALUE, NOT_FOUND, OUTSIDE_MAX_AGE = "PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"
_ZERO = Timestamp()
_VECTOR_ROWS = 8  # below this, formatting row by row is cheaper than a numpy call
_UNITS = ("s", "ms", "us", "ns")
_NS_SPAN_S = 9_000_000_000


def _fraction(nanos: int) -> str:
    if nanos == 0:
        return "Z"
    if nanos % 1_000_000 == 0:
        return f".{nanos // 1_000_000:03d}Z"
    if nanos % 1_000 == 0:
        return f".{nanos // 1_000:06d}Z"
    return f".{nanos:09d}Z"


def event_ms(raw: bytes) -> int:
    """Epoch milliseconds of a stored `_ts` (a serialized Timestamp, by protobuf's C parser): what a view's ttl is
    checked against, by every reader of the serving side."""
    stamp = Timestamp.FromString(raw)
    return stamp.seconds * 1000 + stamp.nanos // 1_000_000


def rfc3339(raw: Optional[bytes]) -> str:
    """A serialized protobuf Timestamp as Feast's feature server prints it (Z suffix, adaptive precision)."""
    if not raw:
        return EPOCH
    ts = Timestamp.FromString(raw)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts.seconds)) + _fraction(ts.nanos)


def rfc3339_many(seconds: Sequence[int], nanos: Sequence[int]) -> list[str]:
    """`rfc3339` of many rows at once: numpy formats each precision group in one call. `strftime` row by row
    was most of a 100-entity HTTP answer's CPU (decode and answer: 0.95 ms before, 0.42 ms after)."""
    secs, frac = np.asarray(seconds, dtype=np.int64), np.asarray(nanos, dtype=np.int64)
    if len(secs) and np.abs(secs).max() >= _NS_SPAN_S:  # outside datetime64[ns] (years 1678-2262)
        return [time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s)) + _fraction(n) for s, n in zip(seconds, nanos)]
    stamps = (secs * 1_000_000_000 + frac).astype("datetime64[ns]")
    # 0: whole seconds, 1: milliseconds, 2: microseconds, 3: nanoseconds (Feast's adaptive precision, per row)
    level = (frac != 0).astype(np.int8) + (frac % 1_000_000 != 0) + (frac % 1_000 != 0)
    if not len(level) or (level == level[0]).all():
        unit = _UNITS[level[0]] if len(level) else "s"
        return np.datetime_as_string(stamps, unit=unit, timezone="UTC").tolist()
    out = np.empty(len(secs), dtype=object)
    for value in np.unique(level):
        rows = level == value
        out[rows] = np.datetime_as_string(stamps[rows], unit=_UNITS[value], timezone="UTC")
    return out.tolist()


def parse_timestamps(ts_raw: Sequence[Optional[bytes]]) -> tuple[list[int], list[int]]:
    """Seconds and nanos of each serialized Timestamp (0, 0 for a missing one), by protobuf's C parser."""
    parse = Timestamp.FromString
    stamps = [parse(raw) if raw else _ZERO for raw in ts_raw]
    return [ts.seconds for ts in stamps], [ts.nanos for ts in stamps]


@dataclass
class ViewRows:
    """Per row of one view: its raw `_ts`, which rows were missing and which were older than the view's ttl;
    `epoch` holds the parsed (seconds, nanos) when the ttl check already parsed them."""

    ts_raw: Sequence
    missing: list[int]
    stale: list[int]
    epoch: Optional[tuple[list[int], list[int]]] = None
    _timestamps: Optional[list[str]] = field(default=None, repr=False)

    def timestamps(self) -> list[str]:
        if self._timestamps is None:
            if len(self.ts_raw) < _VECTOR_ROWS:
                self._timestamps = [rfc3339(raw) for raw in self.ts_raw]
            else:
                self._timestamps = rfc3339_many(*(self.epoch or parse_timestamps(self.ts_raw)))
        return self._timestamps

    def statuses(self, values: list) -> list[str]:
        if not self.missing and not self.stale and None not in values:
            return [PRESENT] * len(values)
        out = [PRESENT if v is not None else NULL_VALUE for v in values]
        for i in self.missing:
            out[i] = NOT_FOUND
        for i in self.stale:
            out[i] = OUTSIDE_MAX_AGE
        return out


def _json_floats(values: list) -> list:
    """NaN and infinities as the strings protobuf's JSON mapping (and Feast) use: they are not JSON numbers."""
    if all(math.isfinite(v) for v in values if v is not None):
        return values
    return [v if v is None or math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity"))
            for v in values]


class OnlineFeatures:
    """Entity columns first, then the requested features in request order (Feast's `OnlineResponse` shape).
    `rows_of` maps each output name to its view's rows, `views` each view read to the same rows."""

    def __init__(self, entities: dict[str, list], names: list[str], values: dict[str, list],
                 kinds: dict[str, Optional[ValueType]], rows_of: dict[str, ViewRows],
                 views: Optional[dict[str, ViewRows]] = None):
        self.entities = entities
        self.names = names
        self.values = values
        self.kinds = kinds
        self.rows_of = rows_of
        self.views = views or {}

    def to_dict(self) -> dict[str, list]:
        out = dict(self.entities)
        for name in self.names:
            out[name] = self.values[name]
        return out

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        arrays = {}
        for name, values in self.to_dict().items():
            kind = self.kinds.get(name)
            arrays[name] = pa.array(values, type=kind.arrow_type() if kind else None)
        return pa.table(arrays)

    def to_pandas(self) -> pd.DataFrame:
        return self.to_arrow().to_pandas()

    def to(self, output: str) -> Any:
        if output == "dict":
            return self.to_dict()
        if output == "arrow":
            return self.to_arrow()
        if output == "pandas":
            return self.to_pandas()
        raise ValueError(f"unknown `output` {output!r}: use 'dict', 'arrow' or 'pandas'")

    def to_feast_response(self) -> dict[str, Any]:
        """Feast feature server's JSON body: metadata.feature_names and one result per column."""
        results = []
        for values in self.entities.values():
            results.append({"values": values, "statuses": [PRESENT] * len(values),
                            "event_timestamps": [EPOCH] * len(values)})
        for name in self.names:
            values, rows = self.values[name], self.rows_of[name]
            results.append({"values": _json_floats(values) if self.kinds[name] in FLOAT_TYPES else values,
                            "statuses": rows.statuses(values), "event_timestamps": rows.timestamps()})
        return {"metadata": {"feature_names": [*self.entities, *self.names]}, "results": results}


def view_row(ts_raw: Optional[bytes], ttl_ms: Optional[int], now_ms: float) -> ViewRows:
    """A single row's `ViewRows`: missing, or older than `ttl_ms` at `now_ms` (`serving.request._view_rows` of many)."""
    if ts_raw is None:
        return ViewRows((None,), [0], [])
    if not ttl_ms:
        return ViewRows((ts_raw,), [], [])
    stale = [0] if event_ms(ts_raw) < now_ms - ttl_ms else []
    return ViewRows((ts_raw,), [], stale)
