"""Tiles -> offline rows without Flink: random events through the tile oracle, then every row compared with the
raw-event oracle, for every op (floats, strings, NULLs, sketches sparse and dense) and awkward timings."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import oracle as tile_oracle
import window_oracle
from batch.hll_windows import TileSketches
from batch.windows import offline_rows
from dsl import (Aggregation, Attribute, Entity, EventSource, FeatureView, Float64, Int64, String, Timestamp, col,
                 sketch)
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.compile_flink import TILE_START

MINUTE_MS = 60_000
T0_MS = 1_767_225_600_000 + 30 * MINUTE_MS

thing = Entity("thing", join_keys={"kind": String, "number": Int64})
events = EventSource("events", {"kind": String, "number": Int64, "label": String, "amount": Float64, "size": Int64,
                                "at": Timestamp}, timestamp_field="at", path="events")
every_op = FeatureView("every_op", thing, events, tile="1m", ttl="1h", features=[
    Aggregation("count", windows=["1m", "3m", "10m"]),
    Aggregation("count", windows=["3m"], filter=col("label") == "b", name="bees"),
    Aggregation("sum", "amount", windows=["3m", "10m"]),
    Aggregation("sum", "size", windows=["10m"]),
    Aggregation("mean", "size", windows=["3m"], filter=col("amount") > 0.0),
    Aggregation("min", "label", windows=["10m"]),
    Aggregation("max", "amount", windows=["3m"]),
    Aggregation("max", "size", windows=["10m"]),
    Aggregation("last", "label", windows=["3m"]),
    Aggregation("approx_distinct", "label", windows=["3m", "10m"]),
    Aggregation("approx_distinct", "size", windows=["10m"]),
])
latest = FeatureView("latest", thing, events, tile="1m", ttl="7m", features=[Attribute("label"), Attribute("size")])
short_ttl = FeatureView("short_ttl", thing, events, tile="1m", ttl="150s", features=[  # a ttl under its windows
    Aggregation("count", windows=["10m"]),
    Aggregation("sum", "amount", windows=["3m"]),
])

_ARROW = {"BIGINT": pa.int64(), "DOUBLE": pa.float64(), "STRING": pa.string(), "BYTES": pa.binary()}


def random_events(seed: int, n: int = 3_000) -> list[dict]:
    """Bursty events of a few entities around the range start: repeated labels, NULLs, negative amounts, gaps
    of one tile, a window, a window and a tile."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        burst = rng.choice([15, 19, 20, 21, 28, 29, 33, 34, 40, 47, 52, 60, 65])
        out.append({
            "kind": rng.choice(["a", "b"]), "number": rng.randint(1, 4),
            "label": rng.choice([None, "a", "b", "c", "x", "y", "zz", "é"] + [f"u{i}" for i in range(30)]),
            "amount": rng.choice([None, rng.uniform(-5, 5), 1e-3, 1e6]),
            "size": rng.choice([None, rng.randint(-3, 40)]),
            "at": 1_767_225_600_000 + burst * MINUTE_MS + rng.randint(0, 2 * MINUTE_MS),
        })
    for minute in rng.sample(range(10, 70), 12):  # a sparse entity: windows holding one value, the extremes
        out.append({"kind": "c", "number": 9, "label": rng.choice(["é", "a"]), "amount": rng.choice([-1e9, 1e9]),
                    "size": rng.choice([-3, 40]), "at": 1_767_225_600_000 + minute * MINUTE_MS})
    return out


def tile_table(view: FeatureView, rows: list[dict]) -> pa.Table:
    """The tile query's output for `rows`, made by the plain-Python tile oracle."""
    compiled = tile_oracle.compiled_for(view, Path("/nowhere"))
    tiles = tile_oracle.tiles(view, rows, Path("/nowhere"))
    keys = list(view.entity.join_keys)
    columns = {k: [group[i] for group in tiles] for i, k in enumerate(keys)}
    columns[TILE_START] = [group[-1] for group in tiles]
    for column in compiled.tile_columns:
        columns[column.name] = pa.array([values[column.name] for values in tiles.values()], _ARROW[column.sql_type])
    return pa.table(columns).take(pa.array(np.random.default_rng(0).permutation(len(tiles))))


def _close(want, got) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return abs(want - got) <= 1e-9 * max(1.0, abs(want))
    return want == got


@pytest.mark.parametrize("view", [every_op, latest, short_ttl], ids=lambda v: v.name)
@pytest.mark.parametrize("seed, chunk_tiles", [(1, 1_000_000), (2, 7)])
def test_rows_equal_the_raw_event_oracle(view, seed, chunk_tiles):
    rows = random_events(seed)
    compiled = tile_oracle.compiled_for(view, Path("/nowhere"))
    end = T0_MS + 40 * MINUTE_MS
    table = pa.concat_tables(t for t, _ in offline_rows(compiled, tile_table(view, rows), T0_MS, end,
                                                        chunk_tiles=chunk_tiles))
    per_entity = window_oracle.by_entity(view, rows)
    keys = list(view.entity.join_keys)
    got: dict[tuple, list[int]] = {}
    for row in table.to_pylist():
        key, boundary = tuple(row[k] for k in keys), int(row[EVENT_TIMESTAMP].timestamp() * 1000)
        got.setdefault(key, []).append(boundary)
        want = window_oracle.values_at(view, per_entity[key], boundary)
        bad = {name: (value, row[name]) for name, value in want.items() if not _close(value, row[name])}
        assert not bad, (key, boundary, bad)
    want_boundaries = {k: sorted(window_oracle.change_boundaries(view, r, T0_MS, end)) for k, r in per_entity.items()}
    assert got == {k: b for k, b in want_boundaries.items() if b}


def test_an_entity_whose_only_tile_is_the_oldest_in_the_longest_window_gets_a_first_row():
    rows = [{"kind": "a", "number": 1, "label": "x", "amount": 1.0, "size": 2, "at": T0_MS - 10 * MINUTE_MS},
            {"kind": "b", "number": 1, "label": "y", "amount": 1.0, "size": 2, "at": T0_MS - 11 * MINUTE_MS}]
    compiled = tile_oracle.compiled_for(every_op, Path("/nowhere"))
    table = pa.concat_tables(t for t, _ in offline_rows(compiled, tile_table(every_op, rows), T0_MS,
                                                        T0_MS + 5 * MINUTE_MS))
    assert table.select(["kind", "count_10m", "label_min_10m"]).to_pylist() == [
        {"kind": "a", "count_10m": 1, "label_min_10m": "x"},   # the row of its last change: still in the window
        {"kind": "a", "count_10m": 0, "label_min_10m": None},  # and the row where it leaves
        {"kind": "b", "count_10m": 0, "label_min_10m": None},  # its tile leaves the window at T0
    ]
    assert [int(t.timestamp() * 1000) for t in table.column(EVENT_TIMESTAMP).to_pylist()] == [
        T0_MS - 6 * MINUTE_MS, T0_MS + MINUTE_MS, T0_MS]  # a's last change before T0: its tile left the 3m windows


@pytest.mark.parametrize("view", [every_op, latest, short_ttl], ids=lambda v: v.name)
def test_a_lookup_ages_from_the_last_change_wherever_the_backfill_starts(tmp_path, view):
    """Training lookups in [T0, end) from a table backfilled from T0 and from one backfilled from 25 minutes
    earlier: the same values, those of the raw-event oracle; an entity whose last change before T0 is about to
    pass the ttl is NULL from then on in both (its row must not restart the ttl at the range's start)."""
    from batch.offline_table import RangeWriter
    from batch.training import as_of
    from batch.windows import offline_schema
    from dsl.compile_feast import offline_table_location

    rows = random_events(5)
    quiet = {"kind": "q", "number": 0, "label": "z", "amount": 2.0, "size": 1, "at": T0_MS - 6 * MINUTE_MS}
    rows.append(quiet)
    compiled = tile_oracle.compiled_for(view, Path("/nowhere"))
    end = T0_MS + 40 * MINUTE_MS
    for start in (T0_MS, T0_MS - 25 * MINUTE_MS):
        with RangeWriter(offline_table_location(tmp_path / str(start), view), offline_schema(compiled), start,
                         end) as writer:
            for table, _ in offline_rows(compiled, tile_table(view, rows), start, end):
                writer.write(table)
            writer.commit()
    per_entity = window_oracle.by_entity(view, rows)
    keys = sorted(per_entity) + [("none", 9)]
    times = np.array([T0_MS + m * MINUTE_MS // 4 + d for m in range(0, 160, 3) for d in (0, 1, -1)])[::-1]
    times = times[times >= T0_MS]
    entities = pa.table({"kind": [k for k, _ in keys for _ in times], "number": [n for _, n in keys for _ in times]})
    every = np.tile(times, len(keys))
    got = [as_of(view, view.feature_names, entities, every, tmp_path / str(start)) for start in (T0_MS,
                                                                                             T0_MS - 25 * MINUTE_MS)]
    assert {n: c.to_pylist() for n, c in got[0].items()} == {n: c.to_pylist() for n, c in got[1].items()}
    for i, (key, t) in enumerate(zip([k for k in keys for _ in times], every)):
        want = window_oracle.as_of(view, per_entity.get(key, []), int(t), T0_MS) or dict.fromkeys(view.feature_names)
        found = {name: got[0][name][i].as_py() for name in view.feature_names}
        assert all(_close(want[n], found[n]) for n in want), (key, int(t), want, found)
    if view is short_ttl:  # q's last change before T0 is its tile leaving the 3m window (T0 - 2m), its next one
        # the 10m window (T0 + 5m): NULL from T0 + 30 s (the ttl) to then, not served until T0 + 150 s
        quiet_at = [i for i, key in enumerate(k for k in keys for _ in times) if key == ("q", 0)
                    and T0_MS + 30_000 < every[i] < T0_MS + 5 * MINUTE_MS]
        assert quiet_at and all(got[0]["count_10m"][i].as_py() is None for i in quiet_at)


def test_window_estimates_equal_estimating_the_merged_sketches():
    """Sketches with many repeated values a few tiles apart (the runs of one register), sparse and dense ones."""
    rng = np.random.default_rng(3)
    n_tiles, window = 60, 4
    codes = np.repeat([0, 1], n_tiles // 2)
    tiles = np.concatenate([np.sort(rng.choice(40, n_tiles // 2, replace=False))] * 2)
    values = [[f"v{v}" for v in rng.integers(0, 300, rng.integers(0, 60))] for _ in range(n_tiles)]
    values[5] = [f"w{i}" for i in range(7_000)]  # a dense sketch
    sketches = []
    for vs in values:
        hll = sketch.HyperLogLog()
        hll.add_many(vs)
        sketches.append(hll.to_bytes())
    assert sketches[5][2] == 1
    span = 50
    boundaries = np.array([c * span + b for c in (0, 1) for b in range(1, span - window - 1)])
    got = TileSketches(pa.array(sketches, pa.binary()), codes, tiles).estimates(boundaries, codes * span + tiles,
                                                                               [window])[window]
    for key, estimate in zip(boundaries.tolist(), got.tolist()):
        code, boundary = divmod(key, span)
        inside = [s for s, c, t in zip(sketches, codes, tiles) if c == code and boundary - window <= t < boundary]
        assert estimate == sketch.estimate(sketch.merge_sketches(inside) if inside else None), (code, boundary)
