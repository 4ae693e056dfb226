"""The streaming guarantee, end to end: a fixed event log replayed through Kafka and `featurectl stream`, stopped
at known points, where every served value equals (a) a plain-Python oracle over the on-time events and (b) the
batch backfill of the same events at the same instants; Feast's `get_online_features` and our SDK read the same.
Bad events (malformed, missing or mistyped fields, later than the allowed lateness) go to the dead-letter topic
with their reason, the job keeps running and no good event is lost.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import window_oracle
from cli_helpers import sibling
from common.config import load_config
from feature_repo.sample_data import SampleSpec, interaction_columns
from stream_env import (LATENESS_MS, REDIS_PORT, EventLog, StreamProcess, StreamRepo, boundary, dead_letters,
                        dead_payload, expected, mismatches, produce, served)

pytestmark = pytest.mark.integration

MINUTE, HOUR = 60_000, 3_600_000
# Recent, so no reader treats the values as expired, and over a day back, so that phase c (a day after phase a) is
# in the past too: an event time more than an hour ahead of its Kafka record is refused as `future`.
T0 = int(time.time() * 1000) // HOUR * HOUR - 28 * HOUR
SPEC = SampleSpec(n_assets=40, n_users=150, seed=11)
VIEWS = ("asset_activity", "user_activity")
in_process = sibling("version_env", "featurectl").run  # the CLI in this process: a subprocess costs seconds of imports


def interactions(rng: random.Random, n: int, start: int, end: int, part: int) -> list[dict]:
    """`n` events in [start, end) in arrival order, up to 4 s out of order, some without dwell_ms."""
    cols = interaction_columns(SPEC, start, end, n, part)
    out = []
    for i in range(n):
        event = {"asset_id": str(cols["asset_id"][i]), "user_id": str(cols["user_id"][i]),
                 "event_type": str(cols["event_type"][i]),
                 "event_time": max(start, int(cols["event_time"][i]) - rng.randint(0, 4_000))}
        if cols["dwell_ms"][i] >= 0:
            event["dwell_ms"] = int(cols["dwell_ms"][i])
        out.append(event)
    return out


def interaction_parts(log: EventLog, rng: random.Random, parts: int, per_part: int, span_ms: int, first_part: int,
                      late_share: float = 0.0) -> list[list]:
    """`parts` spans of `span_ms` one after the other from T0, `per_part` events each, into `log`, with about
    `late_share` of them repeated an hour late (dead letters); returns each part's payloads."""
    out = []
    for i in range(parts):
        sent = len(log.payloads)
        for event in interactions(rng, per_part, T0 + i * span_ms, T0 + (i + 1) * span_ms, part=first_part + i):
            log.event(event)
            if late_share and rng.random() < late_share:
                log.event({**event, "event_time": event["event_time"] - HOUR})
        out.append(log.payloads[sent:])
    return out


def phase_a(log: EventLog, rng: random.Random) -> None:
    """90 minutes of ordinary traffic."""
    for event in interactions(rng, 3_000, T0, T0 + 90 * MINUTE, part=1):
        log.event(event)


def phase_b(log: EventLog, rng: random.Random) -> None:
    """60 more minutes, with events up to 30 s behind (they count), events 10 to 80 minutes behind (late), and
    payloads that are malformed, lack a required field or carry a value of the wrong type."""
    events = interactions(rng, 1_500, T0 + 90 * MINUTE, T0 + 150 * MINUTE, part=2)
    good = dict(events[0])
    for i, event in enumerate(events):
        log.event(event)
        if i > 100 and i % 50 == 0:
            log.event({**event, "user_id": f"user_x{i}", "event_time": event["event_time"] - rng.randint(5, 30) * 1000})
        if i > 100 and i % 70 == 0:
            log.event({**event, "event_time": event["event_time"] - rng.randint(10, 80) * MINUTE})
        if i > 100 and i % 90 == 0:  # right at the allowed lateness: the first counts, the second is late
            log.event({**event, "user_id": "user_edge", "event_time": log.max_seen - LATENESS_MS})
            log.event({**event, "user_id": "user_edge", "event_time": log.max_seen - LATENESS_MS - 1})
    log.bad(b'{"asset_id": "asset_000001", "event_time": ', "malformed_json")
    log.bad(b"[1, 2, 3]", "malformed_json")
    log.bad(None, "malformed_json")
    log.bad(json.dumps({k: v for k, v in good.items() if k != "asset_id"}).encode(), "missing_field:asset_id")
    log.bad(json.dumps({**good, "user_id": None}).encode(), "missing_field:user_id")
    log.bad(json.dumps({k: v for k, v in good.items() if k != "event_time"}).encode(), "missing_field:event_time")
    log.bad(json.dumps({**good, "dwell_ms": "slow"}).encode(), "wrong_type:dwell_ms")
    log.bad(json.dumps({**good, "event_time": "yesterday"}).encode(), "wrong_type:event_time")
    log.bad(json.dumps({**good, "dwell_ms": 12.5}).encode(), "wrong_type:dwell_ms")  # strict types: never cast
    log.bad(json.dumps({**good, "dwell_ms": "42"}).encode(), "wrong_type:dwell_ms")
    log.bad(json.dumps({**good, "event_type": 3}).encode(), "wrong_type:event_type")
    log.bad(json.dumps({**good, "event_time": float(good["event_time"])}).encode(), "wrong_type:event_time")
    for event in interactions(rng, 200, T0 + 150 * MINUTE, T0 + 155 * MINUTE, part=3):
        log.event(event)  # good events after the bad ones still count


def phase_c(log: EventLog, rng: random.Random) -> None:
    """A day later, a few events for two assets: every other value leaves its windows with no event of its own."""
    start = T0 + 26 * HOUR
    for i in range(6):
        log.event({"asset_id": f"asset_00000{i % 2}", "user_id": "user_000001", "event_type": "view",
                   "dwell_ms": 1_000 + i, "event_time": start + i * 7 * MINUTE + rng.randint(0, 999)})


@pytest.fixture(scope="module")
def run(tmp_path_factory, local_services):
    """The stream, fed phase by phase; after each phase the values served and what they should be."""
    folder = tmp_path_factory.mktemp("stream_exactness")
    repo = StreamRepo.create(folder / "repo", VIEWS)
    in_process(repo.folder, "apply")
    views = {v.name: v for v in repo.views()}
    stream = StreamProcess(repo, folder / "stream.log")
    rng, log, phases = random.Random(5), EventLog(), []
    try:
        stream.wait_running()
        for name, fill in (("a", phase_a), ("b", phase_b), ("c", phase_c)):
            sent = len(log.payloads)
            fill(log, rng)
            produce(repo.topic, log.payloads[sent:])
            status = stream.wait_events({v: len(log.on_time) for v in VIEWS})
            keys = {v: sorted({e[next(iter(views[v].entity.join_keys))] for e in log.on_time}) for v in VIEWS}
            phases.append({"name": name, "status": status, "on_time": list(log.on_time),
                           "served": {v: served(repo.project, views[v], keys[v]) for v in VIEWS},
                           "expected": {v: expected(views[v], log.on_time) for v in VIEWS}})
        yield {"repo": repo, "views": views, "log": log, "phases": phases, "stream": stream}
    finally:
        stream.stop()
        repo.cleanup()


@pytest.mark.parametrize("phase", [0, 1, 2], ids=["a", "b", "c"])
@pytest.mark.parametrize("view", VIEWS)
def test_every_served_value_equals_the_oracle(run, phase, view):
    p = run["phases"][phase]
    names = run["views"][view].feature_names
    assert p["served"][view].keys() == p["expected"][view].keys()
    assert not mismatches(p["expected"][view], p["served"][view], names)
    head = max(e["event_time"] for e in p["on_time"])
    events = window_oracle.by_entity(run["views"][view], p["on_time"])   # each entity at its own last change
    wrong_ts = {key: (v["_ts"], window_oracle.last_change_ms(run["views"][view], events[(key,)], head))
                for key, v in p["served"][view].items()}
    assert {key: ts for key, ts in wrong_ts.items() if ts[0] != ts[1]} == {}


def test_values_leave_windows_without_new_events(run):
    a, c = run["phases"][0]["served"]["asset_activity"], run["phases"][2]["served"]["asset_activity"]
    quiet = [k for k in a if k not in ("asset_000000", "asset_000001")]
    assert any(a[k]["views_10m"] for k in quiet) and any(a[k]["views_24h"] for k in quiet)
    assert all(c[k]["views_10m"] == 0 and c[k]["views_1h"] == 0 and c[k]["unique_users_1h"] == 0 for k in quiet)
    assert all(c[k]["dwell_ms_mean_1h"] is None for k in quiet)


def test_dead_letters_carry_the_reason_and_good_events_all_count(run):
    log, repo = run["log"], run["repo"]
    letters = dead_letters(repo.topic, len(log.dead))
    assert len(letters) == len(log.dead), "a dead letter is missing or written twice"
    assert {d["kafka_offset"]: d["reason"] for d in letters} == log.dead
    assert sorted(set(log.dead.values())) == ["late", "malformed_json", "missing_field:asset_id",
                                              "missing_field:event_time", "missing_field:user_id",
                                              "wrong_type:dwell_ms", "wrong_type:event_time",
                                              "wrong_type:event_type"]
    late = [d for d in letters if d["reason"] == "late"]
    assert late and all(json.loads(d["payload"])["asset_id"] for d in late)
    for letter in letters:  # the original bytes of each payload, never a re-serialization
        assert (letter["payload"], letter["payload_encoding"]) == dead_payload(log.payloads[letter["kafka_offset"]])
    status = run["stream"].wait(lambda s: s["dead_letters"]["total"] == len(log.dead), "dead letters counted")
    assert status["state"] == "running" and status["flink_status"] == "RUNNING"
    assert status["views"]["asset_activity"]["events"] == len(log.on_time)


def test_status_reports_the_running_job(run):
    done = in_process(run["repo"].folder, "stream", "--status")
    assert f"stream {run['repo'].project}.asset_activity.user_activity: running" in done.stdout
    for fragment in ("events/s", "event-to-Redis lag p50", "p99", "checkpoint ", "dead letters", "view user_activity",
                     "history: none (Kafka only)"):
        assert fragment in done.stdout
    # this repo has no Parquet history: the stream says so, and how to start from one
    logged = run["stream"].log.read_text()
    assert "source `asset_interactions` has no history at " in logged and "featurectl stream --reset" in logged


def test_the_newest_event_time_recorded_is_the_clock_the_stream_wrote(run):
    """The window writers record each view's clock after each flush; `featurectl status` shows it, with the
    running stream writing the view."""
    from redis_store.freshness import read_newest
    from redis_store.settings import RedisSettings

    repo, served = run["repo"], run["phases"][2]["served"]
    newest = read_newest(RedisSettings.parse(f"127.0.0.1:{REDIS_PORT}"), repo.project)
    assert newest == {v: max(e["event_time"] for e in run["phases"][2]["on_time"]) for v in VIEWS}
    for v in VIEWS:                # the entity that moved the clock last changed at the boundary after it
        tile = window_oracle.tile_ms(run["views"][v])
        assert max(row["_ts"] for row in served[v].values()) == newest[v] // tile * tile + tile
    done = in_process(repo.folder, "status", "--json")
    rows = {row["view"]: row for row in json.loads(done.stdout)["views"]}
    for view in VIEWS:
        assert rows[view]["stream"]["running"] and rows[view]["stream"]["state"] == "running"
        assert rows[view]["stream"]["job"] == f"{repo.project}.asset_activity.user_activity"
        assert rows[view]["newest_event_ms"] == newest[view]


def test_feast_and_our_sdk_read_the_served_values(run):
    from feast import FeatureStore

    from serving.client import OnlineClient

    view = run["views"]["asset_activity"]
    p = run["phases"][2]
    keys = sorted(p["served"]["asset_activity"])
    refs = [f"asset_activity:{n}" for n in view.feature_names]
    store = FeatureStore(config=load_config(run["repo"].folder).feast_repo_config())
    feast = store.get_online_features(features=refs, entity_rows=[{"asset_id": k} for k in keys]).to_dict()
    with OnlineClient.from_repo(run["repo"].folder) as client:
        ours = client.get_features(refs, {"asset_id": keys})
    for reader in (feast, ours):
        got = {k: {n: reader[n][i] for n in view.feature_names} for i, k in enumerate(keys)}
        assert not mismatches(p["expected"]["asset_activity"], got, view.feature_names)


def test_batch_backfill_agrees_at_the_same_instants(run, tmp_path_factory):
    from batch.backfill import BackfillTarget, backfill
    from common.flink import create_table_env
    from batch.offline_table import read_range
    from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path

    repo, views, phases = run["repo"], run["views"], run["phases"]
    data = tmp_path_factory.mktemp("batch_data")
    folder = data / "asset_interactions"
    folder.mkdir()
    events = phases[-1]["on_time"]
    columns = {c: [e.get(c) for e in events] for c in ("asset_id", "user_id", "event_type", "dwell_ms", "event_time")}
    pq.write_table(pa.table({**columns, "dwell_ms": pa.array(columns["dwell_ms"], pa.int64())}),
                   folder / "events.parquet")
    end = max(boundary(views[v], events) for v in VIEWS) + HOUR
    utc = lambda ms: dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)  # noqa: E731
    target = BackfillTarget(data, f"sqlite:///{data / 'registry.db'}", repo.project)
    backfill([views[v] for v in VIEWS], utc(T0), utc(end), target, env=create_table_env(streaming=False))
    for name in VIEWS:
        view = views[name]
        key = next(iter(view.entity.join_keys))
        rows = read_range(offline_table_path(data, view), [key, EVENT_TIMESTAMP, *view.feature_names], T0,
                          end).to_pylist()
        for p in phases:
            b = boundary(view, p["on_time"])
            latest: dict = {}
            for row in sorted(rows, key=lambda r: r[EVENT_TIMESTAMP]):
                if row[EVENT_TIMESTAMP].timestamp() * 1000 <= b:
                    latest[row[key]] = row
            assert latest.keys() == p["served"][name].keys(), (name, p["name"])
            assert not mismatches(latest, p["served"][name], view.feature_names), (name, p["name"])
