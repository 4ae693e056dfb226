"""A plain-Python oracle of window values over raw events: what a view's features are as of a boundary.

Straight from the definitions (dsl.aggregates' window semantics), one event at a time, with no tiles: the
engines' tiles, prefix sums, sparse tables and sketch arithmetic are checked against this.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from dsl import sketch
from dsl.expr import passes
from dsl.feature_view import FeatureView
from dsl.features import Attribute


def tile_ms(view: FeatureView) -> int:
    return int(view.tile.total_seconds() * 1000)


def longest_window_ms(view: FeatureView) -> int:
    """The longest window; an attribute's window is the ttl."""
    lengths = [w.length for a in view.aggregations for w in a.parsed_windows]
    if view.attributes:
        lengths.append(view.ttl)
    return int(max(lengths).total_seconds() * 1000)


def by_entity(view: FeatureView, events: Iterable[Mapping[str, Any]]) -> dict[tuple, list[Mapping[str, Any]]]:
    """Events per entity key tuple, in event-time order (rows with a NULL key dropped)."""
    out: dict[tuple, list[Mapping[str, Any]]] = {}
    for event in events:
        key = tuple(event[k] for k in view.entity.join_keys)
        if None not in key:
            out.setdefault(key, []).append(event)
    for rows in out.values():
        rows.sort(key=lambda e: e[view.source.timestamp_field])
    return out


def _aggregate(op: str, values: list[Any], times: list[int]) -> Any:
    if op == "count":
        return len(values)
    if op == "sum":
        return sum(values)
    if not values:
        return 0 if op == "approx_distinct" else None
    if op == "mean":
        return sum(values) / len(values)
    if op == "min":
        return min(values)
    if op == "max":
        return max(values)
    if op == "last":
        latest = max(times)
        return max(v for v, t in zip(values, times) if t == latest)
    hll = sketch.HyperLogLog()
    hll.add_many(str(v) for v in values)
    return hll.estimate()


def values_at(view: FeatureView, events: list[Mapping[str, Any]], boundary_ms: int) -> dict[str, Any]:
    """Every feature of the view for one entity's events, as of `boundary_ms`: events in [b - W, b)."""
    ts = view.source.timestamp_field
    out: dict[str, Any] = {}
    for feature in view.features:
        if isinstance(feature, Attribute):
            specs = [(feature.feature_names[0], "last", feature.column, None, view.ttl)]
        else:
            specs = [(feature.feature_name(w), feature.op, feature.column, feature.filter, w.length)
                     for w in feature.parsed_windows]
        for name, op, column, row_filter, length in specs:
            start = boundary_ms - int(length.total_seconds() * 1000)
            chosen = [e for e in events if start <= e[ts] < boundary_ms and passes(row_filter, e)
                      and (column is None or e[column] is not None)]
            out[name] = _aggregate(op, [1 if column is None else e[column] for e in chosen], [e[ts] for e in chosen])
    return out


def change_boundaries(view: FeatureView, events: list[Mapping[str, Any]], start_ms: int, end_ms: int) -> set[int]:
    """The boundaries in [start, end) where a tile of the entity enters or leaves a window, and the first boundary
    of the range when a window is non-empty there."""
    tile, ts = tile_ms(view), view.source.timestamp_field
    lengths = {0} | {int(w.length.total_seconds() * 1000) for a in view.aggregations for w in a.parsed_windows}
    if view.attributes:
        lengths.add(int(view.ttl.total_seconds() * 1000))
    tiles = {e[ts] // tile * tile for e in events}
    out = {s + tile + w for s in tiles for w in lengths}
    first = -(-start_ms // tile) * tile
    if any(first - longest_window_ms(view) <= s < first for s in tiles):
        out.add(first)
    return {b for b in out if start_ms <= b < end_ms}


def as_of(view: FeatureView, events: list[Mapping[str, Any]], t_ms: int, start_ms: int) -> Optional[dict[str, Any]]:
    """The training-set values at time t of an entity whose offline table was backfilled from `start_ms` on
    (t below the backfill's end): None when the lookup finds no row, or one older than the ttl.

    A non-empty window at b = floor(t / tile) * tile always has a row younger than the window (so than the ttl,
    for views whose ttl covers their windows); an empty one is NULL unless the row where it emptied is in the
    table and within the ttl.
    """
    tile, ts = tile_ms(view), view.source.timestamp_field
    boundary = t_ms // tile * tile
    past = [e for e in events if e[ts] < boundary]
    if not past:
        return None
    emptied = past[-1][ts] // tile * tile + tile + longest_window_ms(view)
    ttl = int(view.ttl.total_seconds() * 1000)
    if emptied <= boundary and (emptied < start_ms or emptied < t_ms - ttl):
        return None
    return values_at(view, events, boundary)
