"""What each aggregation means, in one place: its tile partials, how tiles combine, and its final value.

Windows are computed the scalable way: each tile (a tumbling interval, e.g. 1 minute) holds partial aggregates
per entity; a window value is the combination of the tiles it covers. Every runtime (Flink SQL for tiles, the
batch window builder, the streaming writer, the test oracle) reads these definitions, so they cannot drift.

Empty windows: `count`, `sum` and `approx_distinct` are 0; `mean`, `min`, `max` and `last` are NULL.

Window semantics (the contract between batch, streaming, serving and the test oracles): tiles are
epoch-aligned, `[s, s + tile)`. The value of a window of length W *at boundary b* (a multiple of the tile)
covers the events with `b - W <= event_time < b`, i.e. the tiles starting in `[b - W, b - tile]`. Offline rows,
training sets and materialized values are taken at boundaries (a training row at time t uses
`b = floor(t / tile) * tile`, so nothing from the future leaks in). Online, the streaming job also counts the
current, still open tile; once that tile closes, the served value equals the boundary value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from dsl import sketch
from dsl.types import ValueType


@dataclass(frozen=True)
class Partial:
    """One tile column of an aggregation: `suffix` names it, `sql_agg` aggregates it, `merge` combines tiles."""

    suffix: str
    sql_agg: str  # the Flink aggregate; `{x}` is the (filtered) input expression
    merge: str    # sum | min | max | last | hll


_SUM = Partial("sum", "SUM({x})", "sum")
_COUNT = Partial("count", "COUNT({x})", "sum")


@dataclass(frozen=True)
class Op:
    name: str
    partials: tuple[Partial, ...]
    needs_column: bool
    numeric_only: bool


OPS: dict[str, Op] = {
    "count": Op("count", (_COUNT,), needs_column=False, numeric_only=False),
    "sum": Op("sum", (_SUM,), needs_column=True, numeric_only=True),
    "mean": Op("mean", (_SUM, _COUNT), needs_column=True, numeric_only=True),
    "min": Op("min", (Partial("min", "MIN({x})", "min"),), needs_column=True, numeric_only=False),
    "max": Op("max", (Partial("max", "MAX({x})", "max"),), needs_column=True, numeric_only=False),
    "last": Op("last", (Partial("last", "LAST_BY({x}, {ts})", "last"),), needs_column=True, numeric_only=False),
    "approx_distinct": Op("approx_distinct", (Partial("hll", "HLL_SKETCH({x})", "hll"),), needs_column=True,
                          numeric_only=False),
}


def output_type(op: str, column_type: Optional[ValueType]) -> ValueType:
    """The feature's type as served: counts are Int64, means Float64, sums widen, the rest keep the column's."""
    if op in ("count", "approx_distinct"):
        return ValueType.INT64
    if op == "mean":
        return ValueType.FLOAT64
    if column_type is None:
        raise ValueError(f"`{op}` needs a column type")
    if op == "sum":
        return ValueType.INT64 if column_type.is_integer else ValueType.FLOAT64
    return column_type


def input_sql(op: str, column_sql: Optional[str], column_type: Optional[ValueType]) -> str:
    """The value fed to the tile aggregate, before any filter: widened for sums, stringified for sketches."""
    if column_sql is None:
        return "1"
    if op in ("sum", "mean"):
        return f"CAST({column_sql} AS {'BIGINT' if column_type and column_type.is_integer else 'DOUBLE'})"
    if op == "approx_distinct" and column_type is not ValueType.STRING:
        return f"CAST({column_sql} AS STRING)"
    return column_sql


def _merge_sum(values: list[Any]) -> Any:
    return sum(values) if values else None


_MERGERS: dict[str, Callable[[list[Any]], Any]] = {
    "sum": _merge_sum,
    "min": lambda values: min(values) if values else None,
    "max": lambda values: max(values) if values else None,
    "last": lambda values: values[-1] if values else None,
    "hll": lambda values: sketch.merge_sketches(values) if values else None,
}


def window_tile_starts(boundary_ms: int, window_ms: int, tile_ms: int) -> tuple[int, int]:
    """First and last tile start (inclusive) of the window of `window_ms` ending at `boundary_ms`."""
    return boundary_ms - window_ms, boundary_ms - tile_ms


def merge_tiles(partial: Partial, tile_values: Iterable[Any]) -> Any:
    """Combine one partial over tiles given in time order (NULL tiles skipped)."""
    return _MERGERS[partial.merge]([v for v in tile_values if v is not None])


def finalize(op: str, merged: dict[str, Any]) -> Any:
    """The served value from the merged partials of one window (keys are partial suffixes)."""
    if op == "count":
        return merged["count"] or 0
    if op == "sum":
        return merged["sum"] or 0
    if op == "mean":
        count = merged["count"] or 0
        return merged["sum"] / count if count else None
    if op == "approx_distinct":
        return sketch.estimate(merged["hll"]) if merged["hll"] else 0
    return merged[OPS[op].partials[0].suffix]
