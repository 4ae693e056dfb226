"""Batch and streaming compose: a stream started over two days of Parquet history (backfilled and materialized)
serves, for every entity and window, the plain-Python oracle over the history plus the on-time Kafka events at or
after the source's cutover (one past the history's last event), at the README's boundary. History that is also in
the topic counts once; Kafka events before the cutover count only through the history; the same holds after a
clean restart, after a SIGKILL, against a backfill over both, after `materialize-incremental`, and after
`--reset` once the history holds the live events too.

The data has another shape than the example repo's: players and game sessions, two views of different tiles on
one source, every aggregation, windows of 10 minutes to 2 days that straddle the cutover.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import sibling
from stream_env import (BOOTSTRAP, FEATURE_STORE_YAML, REDIS_PORT, StreamProcess, StreamRepo, boundary, dead_letters,
                        dead_payload, expected, mismatches, module_env, produce, served)

pytestmark = pytest.mark.integration

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
LATENESS_MS = 35_000
NOW = int(time.time() * 1000)
HISTORY_END = NOW // MINUTE * MINUTE - 3 * MINUTE + 17_123  # the history's last event, inside a tile of both views
CUTOVER = HISTORY_END + 1
HISTORY_START = HISTORY_END - 2 * DAY
MODES = ["duel", "squad", "solo", "ranked"]
MAPS = [f"map_{i:02d}" for i in range(30)]
VIEWS = ("player_stats", "player_daily")

FEATURES_PY = """\
from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, Float64, Int64, String, Timestamp, col

player = Entity("player", join_keys={{"player_id": String}})
sessions = EventSource(
    name="game_sessions",
    schema={{"player_id": String, "mode": String, "map": String, "score": Int64, "duration_s": Float64,
            "event_time": Timestamp}},
    timestamp_field="event_time", kafka_topic={topic!r}, path="game_sessions",
    watermark_delay="5s", allowed_lateness="30s",
)
player_stats = FeatureView(name="player_stats", entity=player, source=sessions, tile="1m", ttl="2d", features=[
    Aggregation("count", windows=["10m", "1h", "24h"], name="sessions"),
    Aggregation("count", windows=["1h", "24h"], filter=col("mode") == "ranked", name="ranked"),
    Aggregation("sum", "score", windows=["1h", "24h"]),
    Aggregation("mean", "duration_s", windows=["10m", "24h"]),
    Aggregation("min", "score", windows=["1h"]),
    Aggregation("max", "duration_s", windows=["24h"]),
    Aggregation("last", "mode", windows=["24h"]),
    Aggregation("approx_distinct", "map", windows=["1h", "24h"], name="maps"),
])
player_daily = FeatureView(name="player_daily", entity=player, source=sessions, tile="5m", ttl="2d", features=[
    Aggregation("count", windows=["24h"], name="sessions"),
    Aggregation("approx_distinct", "mode", windows=["24h"], name="modes"),
    Attribute("map", name="latest_map"),
])
"""


def session(rng: random.Random, player: str, ts: int) -> dict:
    event = {"player_id": player, "mode": rng.choice(MODES), "map": rng.choice(MAPS),
             "duration_s": round(rng.uniform(30, 1800), 3), "event_time": ts}
    if rng.random() < 0.9:
        event["score"] = rng.randint(-50, 5_000)  # some sessions have no score
    return event


def player(rng: random.Random) -> str:
    return f"p{min(int(rng.paretovariate(1.1)), 60):03d}"


def history(rng: random.Random) -> list[dict]:
    """Two days of sessions, some on tile boundaries of both views, the last one at HISTORY_END."""
    events = [session(rng, player(rng), rng.randint(HISTORY_START, HISTORY_END - 1)) for _ in range(6_000)]
    events += [session(rng, player(rng), HISTORY_END - HISTORY_END % (5 * MINUTE) - k * 5 * MINUTE)
               for k in range(40)]
    events.append(session(rng, "p001", HISTORY_END))
    return sorted(({"score": None, **e} for e in events), key=lambda e: e["event_time"])


def write_parquet(folder: Path, name: str, events: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    columns = {"player_id": pa.string(), "mode": pa.string(), "map": pa.string(), "score": pa.int64(),
               "duration_s": pa.float64(), "event_time": pa.int64()}
    pq.write_table(pa.table({c: pa.array([e.get(c) for e in events], t) for c, t in columns.items()}),
                   folder / name)


class Log:
    """Kafka payloads in produce order (offsets 0, 1, ...) and their fate under the README's rules: valid events
    before the cutover are history (neither counted here nor dead letters), later ones count unless more than
    the lateness behind the greatest valid event time before them in the partition."""

    def __init__(self) -> None:
        self.payloads: list[Optional[bytes]] = []
        self.on_time: list[dict] = []
        self.dead: dict[int, str] = {}
        self.max_seen: Optional[int] = None

    def event(self, event: dict) -> None:
        ts = event["event_time"]
        late = self.max_seen is not None and ts < self.max_seen - LATENESS_MS
        if ts >= CUTOVER and late:
            self.dead[len(self.payloads)] = "late"
        elif ts >= CUTOVER:
            self.on_time.append({"score": None, **event})
        self.max_seen = ts if self.max_seen is None else max(self.max_seen, ts)
        self.payloads.append(json.dumps(event).encode())

    def bad(self, payload: bytes, reason: str) -> None:
        self.dead[len(self.payloads)] = reason
        self.payloads.append(payload)


def live(rng: random.Random, log: Log, start: int, end: int, n: int) -> None:
    """`n` sessions in [start, end) in arrival order, up to 20 s out of order, some on 5-minute boundaries."""
    for i in range(n):
        ts = start + (end - start) * i // n
        ts = max(start, ts - rng.randint(0, 20_000)) if rng.random() < 0.97 else ts - ts % (5 * MINUTE)
        log.event(session(rng, player(rng) if rng.random() < 0.9 else f"new{rng.randint(0, 9)}", max(ts, start)))


@pytest.fixture(scope="module")
def env(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("stream_history")
    suffix = uuid.uuid4().hex[:8]
    repo = StreamRepo(folder / "repo", f"history_{suffix}", f"history-{suffix}")
    repo.folder.mkdir()
    (repo.folder / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(
        project=repo.project, folder=repo.folder, redis_port=REDIS_PORT, bootstrap=BOOTSTRAP))
    (repo.folder / "features.py").write_text(FEATURES_PY.format(topic=repo.topic))
    rng = random.Random(2026)
    events = history(rng)
    write_parquet(repo.folder / "data" / "game_sessions", "history.parquet", events)
    env = {"repo": repo, "folder": folder, "history": events, "rng": rng, "log": Log(),
           "views": {v.name: v for v in repo.views()}}
    with module_env(repo, env):
        yield env


def cli(repo: StreamRepo, *args: str) -> str:
    """`featurectl ARGS` in this process (a subprocess costs seconds of imports, and a JVM the later in-process
    backfill shares); its output."""
    return sibling("version_env", "featurectl").run(repo.folder, *args).output


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def check_served(env: dict, events: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every served value of both views equals the oracle over `events` at the boundary after their clock."""
    out = {}
    for name in VIEWS:
        view = env["views"][name]
        want = expected(view, events)
        got = served(env["repo"].project, view, sorted(want))
        wrong = mismatches(want, got, view.feature_names)
        assert not wrong, f"{name}: {len(wrong)} values differ from the oracle, e.g. {wrong[:5]}"
        out[name] = got
    return out


def counted(env: dict) -> list[dict]:
    return env["history"] + env["log"].on_time


def caught_up(stream: StreamProcess) -> dict:
    return stream.wait(lambda s: (s.get("lag") or {}).get("caught_up"), "the stream to report it is caught up")


def test_backfill_and_materialize_the_history(env):
    repo = env["repo"]
    cli(repo, "apply")
    start = iso(HISTORY_START // DAY * DAY)
    cli(repo, "backfill", "--start", start, "--end", iso(NOW))
    cli(repo, "materialize", start, iso(NOW))
    env["materialized"] = iso(NOW)


def test_stream_starts_from_the_history_and_counts_live_events_once(env):
    repo, rng, log = env["repo"], env["rng"], env["log"]
    for event in env["history"][-300:]:  # history also in the topic: counted once, from Parquet
        log.event(event)
    log.event(session(rng, "p002", HISTORY_END))  # in Kafka only, before the cutover: history's, not counted here
    produce(repo.topic, log.payloads)
    stream = StreamProcess(repo, env["folder"] / "stream-1.log")
    env["stream"] = stream
    status = stream.wait_running()
    assert status["generation"]["cutovers_ms"] == {"game_sessions": CUTOVER}
    loaded = status["generation"]["history"]["views"]
    assert loaded["player_stats"]["entities"] > 30 and loaded["player_daily"]["tiles"] > 100

    sent = len(log.payloads)
    log.event(session(rng, "p003", CUTOVER))  # at the cutover: counts
    live(rng, log, CUTOVER, CUTOVER + 6 * MINUTE, 500)
    late_from = log.max_seen
    log.event(session(rng, "p004", late_from - LATENESS_MS - 1))  # late, after the cutover: a dead letter
    log.event(session(rng, "p004", late_from - LATENESS_MS))  # right at the lateness: counts
    log.event(session(rng, "p005", CUTOVER - 2 * MINUTE))  # late and before the cutover: history's, no letter
    good = session(rng, "p006", late_from)
    log.bad(json.dumps({**good, "score": 12.5}).encode(), "wrong_type:score")
    log.bad(json.dumps({**good, "score": "42"}).encode(), "wrong_type:score")
    log.bad(json.dumps({**good, "mode": 3}).encode(), "wrong_type:mode")
    log.bad(json.dumps({**good, "event_time": float(late_from)}).encode(), "wrong_type:event_time")
    live(rng, log, CUTOVER + 6 * MINUTE, CUTOVER + 15 * MINUTE, 700)
    produce(repo.topic, log.payloads[sent:])
    stream.wait_events({v: len(log.on_time) for v in VIEWS})
    check_served(env, counted(env))


def test_status_says_when_every_event_is_applied(env):
    stream = env["stream"]
    status = caught_up(stream)
    assert all(o["applied"] == o["end"] == len(env["log"].payloads) for o in status["lag"]["offsets"])
    out = cli(env["repo"], "stream", "--status")
    assert f"caught up: every event produced so far is applied and in Redis (offsets {env['repo'].topic}[0] " in out
    assert f"game_sessions at {dt.datetime.fromtimestamp(CUTOVER / 1000, dt.timezone.utc).isoformat()}" in out


def test_dead_letters_are_the_late_and_mistyped_events_after_the_cutover(env):
    log = env["log"]
    letters = dead_letters(env["repo"].topic, len(log.dead))
    assert {d["kafka_offset"]: d["reason"] for d in letters} == log.dead
    for letter in letters:
        assert (letter["payload"], letter["payload_encoding"]) == dead_payload(log.payloads[letter["kafka_offset"]])


def test_a_clean_restart_resumes_with_the_same_cutover(env):
    repo, rng, log = env["repo"], env["rng"], env["log"]
    assert env["stream"].stop() == 0
    sent = len(log.payloads)
    live(rng, log, CUTOVER + 15 * MINUTE, CUTOVER + 25 * MINUTE, 600)
    produce(repo.topic, log.payloads[sent:])
    stream = env["stream"] = StreamProcess(repo, env["folder"] / "stream-2.log")
    status = stream.wait_running()
    assert status["restored_from"] and status["generation"]["cutovers_ms"] == {"game_sessions": CUTOVER}
    stream.wait_events({v: len(log.on_time) for v in VIEWS})
    check_served(env, counted(env))


def test_a_killed_stream_resumes_and_ends_exact(env):
    repo, rng, log = env["repo"], env["rng"], env["log"]
    stream = env["stream"]
    sent = len(log.payloads)
    live(rng, log, CUTOVER + 25 * MINUTE, CUTOVER + 35 * MINUTE, 800)
    half = sent + (len(log.payloads) - sent) // 2
    produce(repo.topic, log.payloads[sent:half])
    stream.wait(lambda s: s["views"]["player_stats"]["events"] > 0 and s.get("checkpoint"), "a checkpoint")
    stream.kill()
    produce(repo.topic, log.payloads[half:])
    stream = env["stream"] = StreamProcess(repo, env["folder"] / "stream-3.log")
    assert stream.wait_running()["restored_from"]
    stream.wait_events({v: len(log.on_time) for v in VIEWS})
    env["served"] = check_served(env, counted(env))


def test_a_backfill_over_history_and_live_events_agrees(env, tmp_path_factory):
    """The live events written to the Parquet history too, a backfill over both gives the served values."""
    from batch.backfill import BackfillTarget, backfill
    from common.flink import create_table_env
    from batch.offline_table import read_range
    from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path

    repo, views = env["repo"], env["views"]
    write_parquet(repo.folder / "data" / "game_sessions", "live.parquet", env["log"].on_time)
    data = repo.folder / "data"
    events = counted(env)
    end = max(boundary(views[v], events) for v in VIEWS) + HOUR
    utc = lambda ms: dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)  # noqa: E731
    target = BackfillTarget(data, f"sqlite:///{tmp_path_factory.mktemp('registry') / 'registry.db'}", repo.project)
    backfill([views[v] for v in VIEWS], utc(HISTORY_START // DAY * DAY), utc(end), target,
             env=create_table_env(streaming=False))
    for name in VIEWS:
        view = views[name]
        b = boundary(view, events)
        rows = read_range(offline_table_path(data, view), ["player_id", EVENT_TIMESTAMP, *view.feature_names],
                          HISTORY_START, end).to_pylist()
        latest = {}
        for row in sorted(rows, key=lambda r: r[EVENT_TIMESTAMP]):
            if row[EVENT_TIMESTAMP].timestamp() * 1000 <= b:
                latest[row["player_id"]] = row
        got = served(repo.project, view, sorted(latest))
        assert not mismatches(latest, got, view.feature_names), name


def test_materialize_incremental_after_the_stream_moves_nothing_back(env):
    """The offline table now holds the live events too (the backfill above): materializing beside the running
    stream stops at its cutover and writes only what is newer than what the stream wrote; the values stay the
    oracle's."""
    repo = env["repo"]
    head = max(e["event_time"] for e in counted(env))
    out = cli(repo, "materialize-incremental", iso(head))
    at = dt.datetime.fromtimestamp(CUTOVER / 1000, dt.timezone.utc).isoformat()
    for name in VIEWS:  # the rows past the cutover are the running stream's to write
        assert f"{name}: a running stream writes its values from its cutover {at} on" in out, out
    after = check_served(env, counted(env))
    for name in VIEWS:
        assert all(after[name][k]["_ts"] >= env["served"][name][k]["_ts"] for k in after[name]), name


def test_reset_starts_a_new_generation_from_the_grown_history(env):
    """With the live events in Parquet too, a new generation's cutover is after them (at most now: the live events
    run ahead of the wall clock here): the Kafka events before it are history's, those after it count from Kafka
    alone, nothing counts twice, and the values stay the oracle's."""
    repo = env["repo"]
    assert env["stream"].stop() == 0
    began = int(time.time() * 1000)
    stream = env["stream"] = StreamProcess(repo, env["folder"] / "stream-4.log", "--reset")
    status = stream.wait_running()
    last = max(e["event_time"] for e in counted(env))
    cutover = status["generation"]["cutovers_ms"]["game_sessions"]
    if last + 1 > began:  # history ahead of the wall clock: the cutover is when the stream started
        assert began <= cutover <= int(time.time() * 1000)
    else:
        assert cutover == last + 1
    assert not status["restored_from"]
    stream.wait_events({v: len([e for e in env["log"].on_time if e["event_time"] >= cutover]) for v in VIEWS})
    check_served(env, counted(env))
    assert stream.stop() == 0
    # the repo's backfill ended before the live events: the stream is right regardless, and says what to run
    logged = stream.log.read_text()
    assert "no backfill covers " in logged and "featurectl backfill --start " in logged and "--view player_stats" in \
        logged
