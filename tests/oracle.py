"""A plain-Python oracle over raw events, built from the same `dsl.aggregates` definitions as the engines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

from dsl import sketch
from dsl.compile_flink import CompiledView, SourceSettings, compile_view
from dsl.expr import passes
from dsl.feature_view import FeatureView
from dsl.features import Aggregation, Attribute


def compiled_for(view: FeatureView, data_dir: Path) -> CompiledView:
    return compile_view(view, SourceSettings("127.0.0.1:1", data_dir))


def _partial(kind: str, values: list[Any], times: list[int]) -> Any:
    if not values:
        return _empty(kind)
    if kind == "count":
        return len(values)
    if kind == "sum":
        return sum(values)
    if kind == "min":
        return min(values)
    if kind == "max":
        return max(values)
    if kind == "last":
        latest = max(times)
        return max(v for v, t in zip(values, times) if t == latest)
    hll = sketch.HyperLogLog()
    hll.add_many(str(v) for v in values)
    return hll.to_bytes()


def _empty(kind: str) -> Any:
    """A tile partial over no input rows, as Flink returns it: 0 counts, the empty sketch, else NULL."""
    if kind == "count":
        return 0
    return sketch.HyperLogLog().to_bytes() if kind == "hll" else None


def _sources_of(view: FeatureView) -> dict[str, tuple[Any, Any]]:
    """Tile base name -> (filter, input column or None); the two bookkeeping partials count every event and take
    the greatest event time."""
    out = {"__events": (None, None), "__clock": (None, view.source.timestamp_field)}
    for feature in view.features:
        if isinstance(feature, Attribute):
            out[feature.feature_names[0]] = (None, feature.column)
        elif isinstance(feature, Aggregation):
            out[feature.base_name] = (feature.filter, feature.column)
    return out


def tiles(view: FeatureView, rows: Iterable[Mapping[str, Any]], data_dir: Path = Path(".")) -> dict:
    """(join key values..., tile_start_ms) -> {tile column: partial value}, from raw event dicts."""
    tile_ms = int(view.tile.total_seconds() * 1000)
    ts_field = view.source.timestamp_field
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        key = tuple(row[k] for k in view.entity.join_keys)
        groups[(*key, row[ts_field] - row[ts_field] % tile_ms)].append(row)
    sources = _sources_of(view)
    columns = compiled_for(view, data_dir).tile_columns
    out = {}
    for group, members in groups.items():
        values = {}
        for column in columns:
            row_filter, input_column = sources[column.base]
            chosen = [r for r in members if passes(row_filter, r)
                      and (input_column is None or r.get(input_column) is not None)]
            inputs = [1 if input_column is None else r[input_column] for r in chosen]
            values[column.name] = _partial(column.partial.suffix, inputs, [r[ts_field] for r in chosen])
        out[group] = values
    return out
