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
        yield [(key, values) for key, values, _ in state.take_dirty()]


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
    served = {key: values for key, values, _ in state.take_dirty()}
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
            served.update((key, values) for key, values, _ in state.take_dirty())
    assert {len(s.entities) > 0 for s in states} == {True} and states[0].current == states[1].current
    check(states[0], VIEW, served, events)


def last_change(events: list[dict], current: int) -> dict:
    """Per entity, the `_ts` it is written with when the clock is at tile `current` (window_oracle)."""
    return {key: window_oracle.last_change_ms(VIEW, rows, current * MINUTE)
            for key, rows in window_oracle.by_entity(VIEW, events).items()}


def tile_rows(events: list[dict]) -> list[tuple]:
    names = [c.name for c in compile_view(VIEW, SourceSettings("x:1", Path("/"))).tile_columns]
    return [(tuple(key), start, tuple(values[n] for n in names))
            for (*key, start), values in tile_oracle.tiles(VIEW, events, Path("/")).items()]


def test_each_entity_is_written_at_its_last_change():
    """Every write's `_ts` is the boundary of the entity's own last change (where a tile of it entered or left a
    window), not the view's clock: started from history, then live, quiet entities sliding out."""
    rng = random.Random(11)
    events = sorted(make_events(rng, 1_200, minutes=90), key=lambda e: e["ts"])
    events += [{"shop": "quiet", "user": "u1", "kind": "buy", "price": 1.0, "qty": 1, "ts": T0 + 3_000}]
    events.sort(key=lambda e: e["ts"])
    cutover = T0 + 40 * MINUTE
    history = [e for e in events if e["ts"] < cutover]
    live = [e for e in events if e["ts"] >= cutover]
    state = new_state(VIEW)
    state.load_history(tile_rows(history), cutover)
    written = state.take_dirty()
    want = last_change(history, state.current)
    assert {key: ts for key, _, ts in written} == {key: want[key] for key, _, _ in written}
    assert written and {key for key, _, _ in written} <= set(want)
    quiet = next(ts for key, _, ts in written if key == ("quiet",))
    assert quiet == T0 + 31 * MINUTE < state.head_ms       # not the clock: where its tile left the 30m window
    seen = list(history)
    for cut in range(0, len(live), 37):
        batch = live[cut:cut + 37]
        seen += batch
        for key, start, values in tile_rows(seen):
            if any(e["ts"] // MINUTE == start // MINUTE and (e["shop"],) == key for e in batch):
                state.apply(key, start, values)
        want = last_change(seen, state.current)
        written = state.take_dirty()
        assert written and all(ts == want[key] for key, _, ts in written), cut


def test_a_restart_writes_each_entity_at_the_ts_the_running_stream_gave_it():
    """A state rebuilt as a restart rebuilds it (the same history tiles, then the tile topics' latest versions in
    another order, replays included) writes every entity it holds with the `_ts` of its last write before."""
    rng = random.Random(12)
    events = make_events(rng, 2_500, minutes=180)          # live for longer than the longest window (1h)
    end = max(e["ts"] for e in events) // MINUTE
    events += [{"shop": "newcomer", "user": "u1", "kind": "buy", "price": 1.0, "qty": 1, "ts": (end - m) * MINUTE}
               for m in (61, 40)]                           # its first tile left the 1h window a minute ago
    cutover = T0 + 50 * MINUTE
    history = [e for e in events if e["ts"] < cutover]
    live = [e for e in events if e["ts"] >= cutover]
    running = new_state(VIEW)
    running.load_history(tile_rows(history), cutover)
    last = {key: ts for key, _, ts in running.take_dirty()}
    cuts = sorted(rng.sample(range(1, len(live)), 30)) + [len(live)]
    names = [c.name for c in compile_view(VIEW, SourceSettings("x:1", Path("/"))).tile_columns]
    versions: dict = {}
    previous: dict = {}
    for cut in cuts:
        tiles = tile_oracle.tiles(VIEW, live[:cut], Path("/"))
        for (*key, start), values in tiles.items():
            if previous.get((*key, start)) != values:
                running.apply(tuple(key), start, tuple(values[n] for n in names))
                versions[(*key, start)] = values
        previous = tiles
        last.update((key, ts) for key, _, ts in running.take_dirty())
    restarted = new_state(VIEW)
    restarted.load_history(tile_rows(history), cutover)
    replay = list(versions.items())
    rng.shuffle(replay)             # the newest tile first, and the newcomer's old tile before its new one
    replay.sort(key=lambda item: (item[0][-1] != max(k[-1] for k in versions), item[0][0] == "newcomer",
                                  item[0][-1] if item[0][0] == "newcomer" else 0))
    for (*key, start), values in replay:
        restarted.apply(tuple(key), start, tuple(values[n] for n in names))
    restarted.take_dirty()
    restarted.dirty = set(restarted.entities)              # what `WindowWriter.write_all` does after catching up
    again = {key: ts for key, _, ts in restarted.take_dirty()}
    assert again and set(again) == set(running.entities)
    assert {key: ts for key, ts in again.items() if ts != last[key]} == {}


def test_entities_whose_tiles_left_every_window_before_they_came_are_written_once_empty():
    """From history (tiles older than every window, newer than the ttl) and live (a tile behind the clock, as from a
    trailing partition): such an entity is written once with empty windows at the boundary where its tile left,
    as a stream that saw the tile in time would have left it, then forgotten."""
    state = new_state(VIEW)
    old = [{"shop": "gone", "user": "u1", "kind": "buy", "price": 2.0, "qty": 1, "ts": T0 + 30_000}]
    busy = [{"shop": "busy", "user": "u2", "kind": "view", "price": 1.0, "qty": 1, "ts": T0 + 70 * MINUTE}]
    assert state.load_history(tile_rows(old + busy), T0 + 71 * MINUTE) == 2
    written = {key: (dict(zip(state.layout.feature_names, values)), ts) for key, values, ts in state.take_dirty()}
    values, ts = written[("gone",)]
    assert values["buys_30m"] == 0 and values["users_30m"] == 0 and values["last_kind"] is None
    assert ts == T0 + 61 * MINUTE and ("gone",) not in state.entities              # left the 1h window at 61m
    behind = [{"shop": "behind", "user": "u3", "kind": "buy", "price": 4.0, "qty": 2, "ts": T0 + 2 * MINUTE}]
    for key, start, values in tile_rows(behind):
        assert state.apply(key, start, values) == 0
    (key, values, ts), = state.take_dirty()
    assert key == ("behind",) and dict(zip(state.layout.feature_names, values))["buys_30m"] == 0
    assert ts == T0 + 63 * MINUTE and ("behind",) not in state.entities
