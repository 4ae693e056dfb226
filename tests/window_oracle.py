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


def _all_changes(view: FeatureView, events: list[Mapping[str, Any]]) -> set[int]:
    """Every boundary where a tile of the entity enters or leaves a window, over its whole history."""
    tile, ts = tile_ms(view), view.source.timestamp_field
    lengths = {0} | {int(w.length.total_seconds() * 1000) for a in view.aggregations for w in a.parsed_windows}
    if view.attributes:
        lengths.add(int(view.ttl.total_seconds() * 1000))
    return {e[ts] // tile * tile + tile + w for e in events for w in lengths}


def last_change_ms(view: FeatureView, events: list[Mapping[str, Any]], clock_ms: int) -> int:
    """The `_ts` a stream writes the entity with while the view's clock is at `clock_ms`: the latest boundary at
    which one of its tiles entered or left a window by then (the latest change boundary, as a backfill's rows)."""
    served = clock_ms // tile_ms(view) * tile_ms(view) + tile_ms(view)
    return max(b for b in _all_changes(view, events) if b <= served)


def change_boundaries(view: FeatureView, events: list[Mapping[str, Any]], start_ms: int, end_ms: int) -> set[int]:
    """The boundaries of the entity's rows in a backfill of [start, end): where a tile enters or leaves a window in
    the range; and the entity's last such boundary at or before the range's first boundary, if that is not older
    than the ttl at `start`."""
    tile = tile_ms(view)
    changes = _all_changes(view, events)
    out = {b for b in changes if start_ms <= b < end_ms}
    first = -(-start_ms // tile) * tile
    before = [b for b in changes if b <= first]
    if before and max(before) >= start_ms - int(view.ttl.total_seconds() * 1000):
        out.add(max(before))
    return out


def as_of(view: FeatureView, events: list[Mapping[str, Any]], t_ms: int, start_ms: int) -> Optional[dict[str, Any]]:
    """The training-set values at time t of an entity whose offline table was backfilled from `start_ms` on
    (t at or after the range's first boundary and below its end): None when the lookup finds no row, or one older
    than the ttl (`t - row > ttl`). The row found is the entity's last change at or before b = floor(t / tile) *
    tile, wherever the range begins (`start_ms` does not matter)."""
    tile = tile_ms(view)
    boundary = t_ms // tile * tile
    changes = [b for b in _all_changes(view, events) if b <= boundary]
    if not changes or max(changes) < t_ms - int(view.ttl.total_seconds() * 1000):
        return None
    return values_at(view, events, boundary)
