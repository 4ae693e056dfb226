"""`featurectl stream --parallelism 2`: two window writer processes over a 3-partition source topic, started from
Parquet history; every served value equals the oracle over the history plus the Kafka events after the cutover,
after a writer process is SIGKILLed (and restarted by the stream) too, and when only one writer's entities have
new events (the other's slide on the shared clock). Topic layouts that cannot serve the parallelism are refused.
"""

from __future__ import annotations

import os
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cli_helpers import featurectl, sibling
from feature_repo.sample_data import SampleSpec
from stream_env import BOOTSTRAP, COLUMNS, StreamProcess, StreamRepo, expected, mismatches, sample_events, served
from streaming.partitioning import entity_partition

pytestmark = pytest.mark.integration

MINUTE, HOUR = 60_000, 3_600_000
T0 = int(time.time() * 1000) // HOUR * HOUR - 28 * HOUR
SPEC = SampleSpec(n_assets=60, n_users=200, seed=23)
VIEWS = ("asset_activity", "user_activity")
SOURCE_PARTITIONS = 3
in_process = sibling("version_env", "featurectl").run  # the CLI in this process: a subprocess costs seconds of imports


def events(n: int, start: int, end: int, part: int) -> list[dict]:
    """`n` sample interactions in [start, end), in time order; a view's dwell_ms NULL now and then."""
    return sample_events(SPEC, n, start, end, part, null_dwell=True)


def produce_spread(topic: str, batch: list[dict]) -> None:
    """Events in time order over every partition, round robin (so each partition's watermark follows the
    others' and none is late)."""
    import json

    producer = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for i, event in enumerate(batch):
        payload = {k: v for k, v in event.items() if v is not None}
        producer.produce(topic, json.dumps(payload).encode(), partition=i % SOURCE_PARTITIONS)
        producer.poll(0)
    assert producer.flush(60) == 0


def caught_up(counts: dict[str, int]):
    def done(status: dict) -> bool:
        return (status.get("lag", {}).get("caught_up") is True
                and all(status["views"][v]["events"] == n for v, n in counts.items()))
    return done


@pytest.fixture(scope="module")
def run(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("stream_parallel")
    repo = StreamRepo.create(folder / "repo", VIEWS, name="stream_par")
    history = events(4_000, T0, T0 + 60 * MINUTE, part=1)
    data = folder / "repo" / "data" / "asset_interactions"
    data.mkdir(parents=True)
    pq.write_table(pa.table({c: [e[c] for e in history] for c in COLUMNS}), data / "history.parquet")
    cutover = max(e["event_time"] for e in history) + 1
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(repo.topic, SOURCE_PARTITIONS, 1)])[repo.topic].result()
    in_process(repo.folder, "apply")
    views = {v.name: v for v in repo.views()}
    stream = StreamProcess(repo, folder / "stream.log", "--parallelism", "2")
    live: list[dict] = []
    phases = []

    def phase(name: str, batch: list[dict], during=None) -> None:
        produce_spread(repo.topic, batch)
        live.extend(batch)
        if during is not None:
            during()
        status = stream.wait(caught_up({v: len(live) for v in VIEWS}), f"phase {name} caught up")
        everything = history + live
        keys = {v: sorted({e[next(iter(views[v].entity.join_keys))] for e in everything}) for v in VIEWS}
        phases.append({"name": name, "status": status, "events": list(everything),
                       "served": {v: served(repo.project, views[v], keys[v]) for v in VIEWS},
                       "expected": {v: expected(views[v], everything) for v in VIEWS}})

    def kill_writer() -> None:
        writer = stream.wait(lambda s: len(s.get("writers", [])) == 2, "two writers")["writers"][1]
        os.kill(writer["pid"], signal.SIGKILL)
        stream.wait(lambda s: s["writers"][1]["restarts"] == 1 and s["writers"][1]["state"] == "running",
                    "writer 1 restarted")

    try:
        stream.wait_running()
        phase("a", events(2_000, cutover, cutover + 40 * MINUTE, part=2))
        phase("b", events(1_500, cutover + 40 * MINUTE, cutover + 80 * MINUTE, part=3), during=kill_writer)
        quiet = [{**e, "asset_id": "asset_000003"} for e in events(5, T0 + 26 * HOUR, T0 + 26 * HOUR + 20 * MINUTE,
                                                                   part=4)]
        phase("c", quiet)
        yield {"repo": repo, "views": views, "phases": phases, "stream": stream, "cutover": cutover}
    finally:
        stream.stop()
        repo.cleanup()


@pytest.mark.parametrize("phase", [0, 1, 2], ids=["a", "b-after-writer-kill", "c-one-writer-only"])
@pytest.mark.parametrize("view", VIEWS)
def test_every_served_value_equals_the_oracle(run, phase, view):
    p = run["phases"][phase]
    names = run["views"][view].feature_names
    assert p["served"][view].keys() == p["expected"][view].keys()
    assert not mismatches(p["expected"][view], p["served"][view], names)


def test_two_writers_own_disjoint_partitions_and_entities_of_both(run):
    status = run["phases"][0]["status"]
    writers = status["writers"]
    assert status["parallelism"] == 2 and [w["writer"] for w in writers] == [0, 1]
    owned = [set(w["partitions"]) for w in writers]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert all(p.endswith(("[0]", "[1]")) for p in owned[0] | owned[1])
    keys = {e["asset_id"] for e in run["phases"][0]["events"]}
    assert {entity_partition((k,), 2) for k in keys} == {0, 1}  # both writers hold entities
    assert status["generation"]["history"]["views"]["asset_activity"]["entities"] == len(keys)


def test_status_shows_the_writers(run):
    done = in_process(run["repo"].folder, "stream", "--status")
    assert "parallelism 2; window writers: 0 pid " in done.stdout and "restarted 1x" in done.stdout
    assert "caught up" in done.stdout


def test_a_source_topic_with_fewer_partitions_than_the_parallelism_is_refused(tmp_path, local_services):
    repo = StreamRepo.create(tmp_path / "repo", ("asset_activity",), name="stream_par_bad")
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin.create_topics([NewTopic(repo.topic, 1, 1)])[repo.topic].result()
    try:
        done = featurectl("--repo", str(repo.folder), "stream", "--parallelism", "2")
        assert done.returncode != 0
        assert f"topic {repo.topic} has 1 partition(s), fewer than the parallelism 2" in done.stderr
        assert "--partitions 2" in done.stderr and "Traceback" not in done.stderr
        config = repo.folder / "feature_store.yaml"
        config.write_text(config.read_text().replace("  kafka:\n", "  kafka:\n    partitions: 1\n"))
        done = featurectl("--repo", str(repo.folder), "stream", "--parallelism", "3")
        assert done.returncode != 0 and "would get 1 partitions, fewer than the parallelism 3" in done.stderr
        done = featurectl("--repo", str(repo.folder), "stream", "--parallelism", "0")
        assert done.returncode == 2 and "--parallelism" in done.stderr
    finally:
        repo.cleanup()


def test_more_replicas_than_brokers_is_refused_before_any_topic_is_made(tmp_path, local_services):
    repo = StreamRepo.create(tmp_path / "repo", ("asset_activity",), name="stream_par_rf")
    config = repo.folder / "feature_store.yaml"
    config.write_text(config.read_text().replace("  kafka:\n", "  kafka:\n    replication_factor: 3\n"))
    try:
        done = featurectl("--repo", str(repo.folder), "stream")
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert "would get 3 replicas but Kafka at" in done.stderr and "replication_factor" in done.stderr
        topics = AdminClient({"bootstrap.servers": BOOTSTRAP}).list_topics(timeout=10).topics
        assert repo.topic not in topics and f"{repo.topic}.dead-letters" not in topics
    finally:
        repo.cleanup()
