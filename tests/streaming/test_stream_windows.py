"""The window writer's incremental state equals window values recomputed from raw events (window_oracle), for
every entity, whatever order and granularity tile updates come in, with replays and with entities that go quiet."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import oracle as tile_oracle
import window_oracle
from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, Float64, Int64, String, Timestamp, col
from dsl.compile_flink import SourceSettings, compile_view
from streaming.windows import ViewLayout, WindowState

MINUTE = 60_000
T0 = 1_767_225_600_000

EVENTS = EventSource("clicks", {"shop": String, "user": String, "kind": String, "price": Float64, "qty": Int64,
                                "ts": Timestamp}, timestamp_field="ts", kafka_topic="clicks", path="clicks")
SHOP = Entity("shop", join_keys={"shop": String})
VIEW = FeatureView("shop_stats", SHOP, EVENTS, tile="1m", ttl="1h", features=[
    Aggregation("count", windows=["2m", "10m", "30m"], filter=col("kind") == "buy", name="buys"),
    Aggregation("sum", "qty", windows=["10m"]),
    Aggregation("sum", "price", windows=["10m"], name="revenue"),
    Aggregation("mean", "price", windows=["30m"]),
    Aggregation("min", "price", windows=["10m"]),
    Aggregation("max", "qty", windows=["30m"]),
    Aggregation("last", "user", windows=["10m"]),
    Aggregation("approx_distinct", "user", windows=["10m", "30m"], name="users"),
    Attribute("kind", name="last_kind"),
])


def make_events(rng: random.Random, n: int, minutes: int) -> list[dict]:
    """Events in arrival order: event times increase with a few seconds of disorder, a few minutes for some (their
    tile update comes after later tiles'); some fields missing."""
    out = []
    for i in range(n):
        ts = T0 + int(i * minutes * MINUTE / n) - rng.choice([rng.randint(0, 4_000)] * 30 + [rng.randint(0, 150_000)])
        out.append({"shop": f"s{min(rng.paretovariate(1.2), 30):.0f}", "user": f"u{rng.randint(0, 40)}",
                    "kind": rng.choice(["buy", "view", "view", None]), "price": round(rng.uniform(0, 20), 2),
                    "qty": rng.choice([None, 1, 2, 5, -3]), "ts": ts})
    return out


def feed(state: WindowState, view: FeatureView, events: list[dict], cuts: list[int], replay_from: int = -1):
    """Tile versions as Flink would emit them: after each cut, the changed tiles of the prefix so far. With
    `replay_from`, the versions after that cut are sent a second time (a recovery), interleaved late."""
    sent: list[list] = []
    previous: dict = {}
    for cut in cuts:
        tiles = tile_oracle.tiles(view, events[:cut], Path("/"))
        changed = [(key, values) for key, values in tiles.items() if previous.get(key) != values]
        previous = tiles
        sent.append(changed)
    names = [c.name for c in compile_view(view, SourceSettings("x:1", Path("/"))).tile_columns]
    for i, changed in enumerate(sent):
        batch = changed + (sent[i - 2] if replay_from >= 0 and i >= replay_from + 2 else [])
        for (*key, start), values in batch:
            state.apply(tuple(key), start, tuple(values[n] for n in names))
        yield state.take_dirty()


def expected(view: FeatureView, events: list[dict], current_tile: int) -> dict:
    boundary = (current_tile + 1) * MINUTE
    return {key: window_oracle.values_at(view, rows, boundary)
            for key, rows in window_oracle.by_entity(view, events).items()}


def same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12)
    return a == b


def check(state: WindowState, view: FeatureView, served: dict, events: list[dict]) -> None:
    want = expected(view, events, state.current)
    names = state.layout.feature_names
    assert set(served) == set(want)
    bad = [(key, name, want[key][name], got) for key, values in served.items()
           for name, got in zip(names, values) if not same(want[key][name], got)]
    assert not bad, bad[:5]


def new_state(view: FeatureView) -> WindowState:
    return WindowState(ViewLayout(compile_view(view, SourceSettings("x:1", Path("/")))))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_windows_equal_the_raw_event_oracle(seed):
    rng = random.Random(seed)
    events = make_events(rng, 1_500, minutes=45)
    cuts = sorted(rng.sample(range(1, len(events)), 60)) + [len(events)]
    state = new_state(VIEW)
    served: dict = {}
    for rows in feed(state, VIEW, events, cuts):
        served.update(rows)
    check(state, VIEW, served, events)


def test_replayed_tile_versions_never_move_values_back():
    rng = random.Random(7)
    events = make_events(rng, 800, minutes=20)
    cuts = list(range(40, 801, 40))
    state = new_state(VIEW)
    served: dict = {}
    history: dict = {}
    for rows in feed(state, VIEW, events, cuts, replay_from=5):
        for key, values in rows:
            counts = dict(zip(state.layout.feature_names, values))
            assert counts["buys_30m"] >= history.get(key, 0) or counts["buys_30m"] == 0
            history[key] = counts["buys_30m"]
        served.update(rows)
    check(state, VIEW, served, events)


def test_windows_empty_out_for_quiet_entities_when_the_clock_moves():
    quiet = [{"shop": "quiet", "user": "u1", "kind": "buy", "price": 3.0, "qty": 2, "ts": T0 + 5_000}]
    busy = [{"shop": "busy", "user": "u2", "kind": "view", "price": 1.0, "qty": 1, "ts": T0 + m * MINUTE}
            for m in range(0, 70, 3)]
    events = quiet + busy
    state = new_state(VIEW)
    served: dict = {}
    for rows in feed(state, VIEW, events, list(range(1, len(events) + 1))):
        served.update(rows)
    check(state, VIEW, served, events)
    values = dict(zip(state.layout.feature_names, served[("quiet",)]))
    assert values["buys_30m"] == 0 and values["users_30m"] == 0 and values["price_mean_30m"] is None
    assert values["last_kind"] is None and ("quiet",) not in state.entities  # older than the ttl: forgotten


@pytest.mark.parametrize("seed, cutover_in_tile", [(4, 23_456), (5, 0), (6, 59_999)])
def test_windows_started_from_history_equal_the_oracle_over_history_and_live(seed, cutover_in_tile):
    """History tiles (events before the cutover) loaded first, then the stream's tiles of the later events, with
    replays: every value is the oracle's over both, the tile holding the cutover counted from both sides once."""
    rng = random.Random(seed)
    events = make_events(rng, 2_000, minutes=80)
    cutover = T0 + 50 * MINUTE + cutover_in_tile
    history = [e for e in events if e["ts"] < cutover]
    live = [e for e in events if e["ts"] >= cutover]
    names = [c.name for c in compile_view(VIEW, SourceSettings("x:1", Path("/"))).tile_columns]
    rows = [(tuple(key), start, tuple(values[n] for n in names))
            for (*key, start), values in tile_oracle.tiles(VIEW, history, Path("/")).items()]
    state = new_state(VIEW)
    assert state.load_history(rng.sample(rows, len(rows)), cutover) == len(state.dirty) > 10
    assert state.head_ms == max(e["ts"] for e in history)
    served = dict(state.take_dirty())
    check(state, VIEW, served, history)
    cuts = sorted(rng.sample(range(1, len(live)), 40)) + [len(live)]
    for rows in feed(state, VIEW, live, cuts, replay_from=3):
        served.update(rows)
    check(state, VIEW, served, events)


def test_writers_sharing_a_clock_equal_one_writer():
    """Entities split over two states (two window writers), each fed only its own entities' tile updates and
    following the greatest clock of both (`SharedClock`): together they serve the oracle's values, quiet entities
    of one writer sliding with the other writer's clock."""
    from streaming.partitioning import entity_partition
    from streaming.shared_clock import NONE, SharedClock

    rng = random.Random(8)
    events = make_events(rng, 1_500, minutes=45)
    events += [{"shop": "late_quiet", "user": "u1", "kind": "buy", "price": 1.0, "qty": 1, "ts": T0}]
    events.sort(key=lambda e: e["ts"])
    cuts = sorted(rng.sample(range(1, len(events)), 50)) + [len(events)]
    names = [c.name for c in compile_view(VIEW, SourceSettings("x:1", Path("/"))).tile_columns]
    heads = [NONE, NONE]
    states = [new_state(VIEW), new_state(VIEW)]
    clocks = [SharedClock(heads, 1, w) for w in range(2)]
    served: dict = {}
    previous: dict = {}
    for cut in cuts:
        tiles = tile_oracle.tiles(VIEW, events[:cut], Path("/"))
        for (*key, start), values in tiles.items():
            if previous.get((*key, start)) != values:
                states[entity_partition(tuple(key), 2)].apply(tuple(key), start, tuple(values[n] for n in names))
        previous = tiles
        for state, clock in zip(states, clocks):
            clock.publish(0, state.head_ms)
        for state, clock in zip(states, clocks):
            state.follow(clock.head(0))
            served.update(state.take_dirty())
    assert {len(s.entities) > 0 for s in states} == {True} and states[0].current == states[1].current
    check(states[0], VIEW, served, events)
