"""`featurectl stream --parallelism 2` into a Redis Cluster of the test's own (3 masters, a replica each, 1 s node
timeout), started from a backfilled and materialized Parquet history: after each phase of Kafka events, and after a
master is SIGKILLed under the stream (its replica promoted by the cluster), every served value, read by our SDK and
by Feast's own cluster reader, equals the plain-Python oracle over the history plus the on-time events; each dead
letter is written once, the writers ride through the failover without a restart, and `stream --status` says
caught up.

What `test_redis_sink_cluster.py` and `test_cluster_failover.py` show of the sink and of the writers' retries
alone, here through the real command: Flink, the writer pool, the run-id check, materialization beside it.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

import window_oracle
from cli_helpers import sibling
from feature_repo.sample_data import SampleSpec
from featurectl.services.scratch_redis import RedisServer, master_with_replica, redis_cluster
from stream_env import (BOOTSTRAP, COLUMNS, EventLog, StreamProcess, StreamRepo, dead_letters, dead_payload,
                        expected, mismatches, module_env, produce, sample_events)

pytestmark = pytest.mark.integration

MINUTE, HOUR = 60_000, 3_600_000
T0 = int(time.time() * 1000) // HOUR * HOUR - 28 * HOUR
SPEC = SampleSpec(n_assets=60, n_users=200, seed=31)
VIEWS = ("asset_activity", "user_activity")
PARALLELISM = 2
HISTORY_MS = 60 * MINUTE


def events(n: int, start: int, end: int, part: int) -> list[dict]:
    """`n` sample interactions in [start, end), in time order; a view's dwell_ms absent now and then."""
    return sample_events(SPEC, n, start, end, part, null_dwell=False)


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def cli(repo: StreamRepo, *args: str) -> str:
    """`featurectl ARGS` in this process (a subprocess costs seconds of imports, the backfill a JVM too); its
    output."""
    return sibling("version_env", "featurectl").run(repo.folder, *args).output


def read_both(repo: StreamRepo, view, keys: list[str]) -> tuple[dict, dict]:
    """Every feature of `view` for `keys`, as {key: {feature: value}}: through our SDK and through Feast's own
    `get_online_features` (redis-py's cluster client), each from the repo's feature_store.yaml."""
    from feast import FeatureStore

    from serving.client import OnlineClient

    join_key = next(iter(view.entity.join_keys))
    refs = [f"{view.name}:{n}" for n in view.feature_names]

    def per_key(table: dict) -> dict[str, dict[str, Any]]:
        return {k: {n: table[n][i] for n in view.feature_names} for i, k in enumerate(table[join_key])}

    with OnlineClient.from_repo(repo.folder) as client:
        ours = per_key(client.get_features(refs, {join_key: keys}))
    feast = FeatureStore(repo_path=str(repo.folder)).get_online_features(refs, [{join_key: k} for k in keys])
    return ours, per_key(feast.to_dict())


def check_served(env: dict, counted: list[dict]) -> None:
    """Our SDK and Feast's reader both serve the oracle over `counted` for every entity of both views."""
    for name in VIEWS:
        view = env["views"][name]
        want = expected(view, counted)
        ours, feast = read_both(env["repo"], view, sorted(want))
        wrong = mismatches(want, ours, view.feature_names)
        assert not wrong, f"{name}, our SDK: {len(wrong)} values differ from the oracle, e.g. {wrong[:5]}"
        wrong = mismatches(want, feast, view.feature_names)
        assert not wrong, f"{name}, Feast: {len(wrong)} values differ from the oracle, e.g. {wrong[:5]}"


def wait_for(check, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s: {what}"
        time.sleep(0.1)


def promoted(replica: RedisServer, alive: list[RedisServer]) -> bool:
    return ("role:master" in replica.cli("info", "replication")
            and all("cluster_state:ok" in s.cli("cluster", "info") for s in alive))


@pytest.fixture(scope="module")
def env(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("stream_cluster")
    with redis_cluster(folder / "redis", nodes=3, replicas=1, node_timeout_ms=1_000) as servers:
        repo = StreamRepo.create(folder / "repo", VIEWS, name="stream_cluster")
        masters = [s for s in servers if "role:master" in s.cli("info", "replication")]
        config = repo.folder / "feature_store.yaml"
        nodes = ",".join(f"127.0.0.1:{s.port}" for s in masters)
        text = config.read_text()
        single = next(line for line in text.splitlines() if line.strip().startswith("connection_string:"))
        config.write_text(text.replace(single, f'  connection_string: "{nodes}"\n  redis_type: redis_cluster'))
        history = events(3_000, T0, T0 + HISTORY_MS, part=1)
        data = repo.folder / "data" / "asset_interactions"
        data.mkdir(parents=True)
        pq.write_table(pa.table({c: [e.get(c) for e in history] for c in COLUMNS}), data / "history.parquet")
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        admin.create_topics([NewTopic(repo.topic, PARALLELISM, 1)])[repo.topic].result()
        env = {"repo": repo, "folder": folder, "servers": servers, "log": EventLog(),
               "views": {v.name: v for v in repo.views()}, "cutover": max(e["event_time"] for e in history) + 1,
               "history": [{c: e.get(c) for c in COLUMNS} for e in history]}
        with module_env(repo, env):
            yield env


def test_materialized_history_is_read_alike_by_our_sdk_and_feast(env):
    """Backfill the history, materialize it into the cluster up to its end: both readers serve, for every entity,
    the oracle's values at that boundary."""
    repo = env["repo"]
    cli(repo, "apply")
    end = T0 + HISTORY_MS  # a tile boundary of both views; the stream's clock passes it with the first live events
    # from a longest window (24 h) and a tile before the cutover, as the stream wants; on past the history's end
    cli(repo, "backfill", "--start", iso(T0 - 25 * HOUR), "--end", iso(end + HOUR))
    out = cli(repo, "materialize", iso(T0), iso(end))
    assert " written, " in out, out
    for name in VIEWS:
        view = env["views"][name]
        want = {k[0]: window_oracle.values_at(view, rows, end)
                for k, rows in window_oracle.by_entity(view, env["history"]).items()}
        ours, feast = read_both(repo, view, sorted(want))
        assert not mismatches(want, ours, view.feature_names), name
        assert not mismatches(want, feast, view.feature_names), name


def test_stream_from_the_history_serves_the_oracle(env):
    repo, log = env["repo"], env["log"]
    stream = env["stream"] = StreamProcess(repo, env["folder"] / "stream.log", "--parallelism", str(PARALLELISM))
    status = stream.wait_running()
    assert status["generation"]["cutovers_ms"] == {"asset_interactions": env["cutover"]}
    stream.wait(lambda s: [w["state"] for w in s.get("writers", [])] == ["running"] * PARALLELISM, "the writers")
    for event in events(1_500, env["cutover"], env["cutover"] + 30 * MINUTE, part=2):
        log.event(event)
    late = log.max_seen - 60_000
    log.event({"asset_id": "asset_000001", "user_id": "user_000001", "event_type": "view", "event_time": late})
    log.bad(b"{not json", "malformed_json")
    log.bad(json.dumps({"asset_id": "asset_000002", "user_id": "u", "event_type": "like", "dwell_ms": "9",
                        "event_time": log.max_seen}).encode(), "wrong_type:dwell_ms")
    produce(repo.topic, log.payloads)
    stream.wait_events({v: len(log.on_time) for v in VIEWS})
    check_served(env, env["history"] + log.on_time)


def test_a_master_killed_under_the_stream_loses_nothing(env):
    """SIGKILL a master while the writers write; once its replica is promoted, more events: every value still
    the oracle's, written through the new master, with no writer restarted."""
    repo, log, stream, servers = env["repo"], env["log"], env["stream"], env["servers"]
    master, replica = master_with_replica(servers)
    sent = len(log.payloads)
    for event in events(2_000, env["cutover"] + 30 * MINUTE, env["cutover"] + 60 * MINUTE, part=3):
        log.event(event)
    half = sent + (len(log.payloads) - sent) // 2
    produce(repo.topic, log.payloads[sent:half])
    master.kill()  # Flink and the writers are at the first half: some of their writes meet the dead master
    wait_for(lambda: promoted(replica, [s for s in servers if s is not master]), "the replica promoted")
    produce(repo.topic, log.payloads[half:])
    status = stream.wait_events({v: len(log.on_time) for v in VIEWS})
    assert [w["restarts"] for w in status["writers"]] == [0] * PARALLELISM, status["writers"]
    for writer in range(PARALLELISM):  # its slot map named the dead master: it met the failover and rode through
        assert f"writer {writer}: redis cluster: writes carried on after" in stream.log.read_text()
        wait_for(lambda: f"writer {writer}: Redis restarted or a cluster master failed over" in stream.log.read_text(),
                 f"writer {writer} to notice the new master (its run id) and write every entity again", 10)
    check_served(env, env["history"] + log.on_time)


def test_status_says_caught_up_and_dead_letters_are_written_once(env):
    repo, log, stream = env["repo"], env["log"], env["stream"]
    status = stream.wait(lambda s: (s.get("lag") or {}).get("caught_up"), "the stream to report it is caught up")
    assert sum(o["end"] for o in status["lag"]["offsets"]) == len(log.payloads)
    out = cli(repo, "stream", "--status")
    assert "caught up: every event produced so far is applied and in Redis" in out, out
    assert f"parallelism {PARALLELISM}; window writers: 0 pid " in out, out
    letters = dead_letters(repo.topic, len(log.dead))
    assert {d["kafka_offset"]: d["reason"] for d in letters} == log.dead
    assert len(letters) == len(log.dead)
    for letter in letters:
        assert (letter["payload"], letter["payload_encoding"]) == dead_payload(log.payloads[letter["kafka_offset"]])
    assert stream.stop() == 0
    check_served(env, env["history"] + log.on_time)
