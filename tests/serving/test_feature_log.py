"""Feature logging: `featurectl serve` writes the vectors it serves for a service with `logging`, in Feast's
feature-logging layout, row for row what the answers said; Feast's offline store reads the files; a full queue
drops (and counts) vectors, never requests; sampling by `X-Request-ID` follows the documented rule."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.request
import zlib
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from cli_helpers import free_port
from feature_log_env import (log_counts, log_table, logged_repo, one_feature_spec, one_row_answer, pipelined,
                             post_features)
from featurectl.services.scratch_redis import RedisServer
from serving_env import feature_server

from common.config import FeatureLogSettings
from serving.feature_log import FeatureLogger
from serving.stats import ServerStats

pytestmark = pytest.mark.integration

STATUS = {"PRESENT": 1, "NULL_VALUE": 2, "NOT_FOUND": 3, "OUTSIDE_MAX_AGE": 4}
ENTITY_LISTS = [["a1"], ["a1", "a2", "zz", "old"], ["old", "a1"], ["zz"], ["old"], ["a2"]]  # one row: the fast path

def _expected_rows(response: dict, service_columns: list[str]) -> list[dict]:
    """What the log must hold for one answer: per entity row, each feature's value, status and timestamp (to the
    second, as Feast's log schema keeps them)."""
    names, results = response["metadata"]["feature_names"], response["results"]
    rows = []
    for i, asset in enumerate(results[0]["values"]):
        row = {"asset_id": asset}
        for column, result in zip(service_columns, results[1:]):
            stamp = dt.datetime.fromisoformat(result["event_timestamps"][i].replace("Z", "+00:00"))
            row |= {column: result["values"][i], f"{column}__status": STATUS[result["statuses"][i]],
                    f"{column}__timestamp": stamp.replace(microsecond=0)}
        rows.append(row)
    assert len(names) == len(service_columns) + 1
    return rows


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Two workers, files written every 0.3 s."""
    folder = tmp_path_factory.mktemp("featurelog")
    redis_server = RedisServer(folder)
    try:
        repo, store = logged_repo(folder, f"featurelog{os.getpid()}", redis_server.port, {"flush_s": 0.3})
        with feature_server(repo, free_port(), "--workers", "2") as url:
            yield url, repo, store
    finally:
        redis_server.stop()


def test_every_served_vector_is_logged_as_the_answer_said_it(served):
    url, repo, _ = served
    columns = ["asset_activity__views_1h", "asset_activity__dwell_ms_mean_1h", "asset_attributes__category",
               "asset_attributes__polygon_count"]
    began = dt.datetime.now(dt.timezone.utc)
    expected: dict[str, list[dict]] = {}
    for i in range(40):
        given = f"client-{i}" if i % 3 == 0 else None
        body = {"feature_service": "logged_ranking", "full_feature_names": i % 2 == 0,
                "entities": {"asset_id": ENTITY_LISTS[i % len(ENTITY_LISTS)]}}
        status, body, logged_id = post_features(url, body, given)
        assert status == 200 and logged_id and (given is None or logged_id == given)
        expected[logged_id] = _expected_rows(body, columns)
    served_rows = sum(len(rows) for rows in expected.values())
    deadline = time.monotonic() + 30  # workers share their counters every second
    while log_counts(url, "logged_ranking")["written"] < served_rows and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.1)
    counts = log_counts(url, "logged_ranking")
    assert [counts[k] for k in ("logged", "dropped", "written", "failed")] == [served_rows, 0, served_rows, 0]
    table = log_table(repo, "logged_ranking")
    assert table.num_rows == served_rows
    logged: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        logged.setdefault(row["__request_id"], []).append(row)
    assert logged.keys() == expected.keys()
    for request_id, rows in logged.items():
        assert [{k: row[k] for k in want} for row, want in zip(rows, expected[request_id])] == expected[request_id]
        assert len({row["__log_timestamp"] for row in rows}) == 1
        assert began <= rows[0]["__log_timestamp"] <= dt.datetime.now(dt.timezone.utc)
        assert rows[0]["__log_date"] == rows[0]["__log_timestamp"].date().isoformat()
    names = {Path(f).name for f in ds.dataset(repo.parent / "data" / "feature_logs" / "logged_ranking",
                                              partitioning="hive", ignore_prefixes=["."]).files}
    assert len(names) == counts["files"]


def test_feast_reads_the_logs_with_the_schema_it_derives(served):
    url, repo, store = served
    from feast.feature_logging import FeatureServiceLoggingSource

    post_features(url, {"feature_service": "logged_ranking", "entities": {"asset_id": ["a1", "zz"]}}, "feast-read")
    deadline = time.monotonic() + 30
    while "feast-read" not in log_table(repo, "logged_ranking").column("__request_id").to_pylist():
        assert time.monotonic() < deadline, "the vector was not written within 30 s"
        time.sleep(0.2)
    service = store.get_feature_service("logged_ranking")
    schema = FeatureServiceLoggingSource(service, store.project).get_schema(store.registry)
    ours = ds.dataset(repo.parent / "data" / "feature_logs" / "logged_ranking", format="parquet", schema=schema,
                      partitioning=ds.partitioning(pa.schema([schema.field("__log_date")]), flavor="hive"),
                      ignore_prefixes=["."]).to_table()
    assert ours.schema == schema and ours.num_rows == log_table(repo, "logged_ranking").num_rows
    now = dt.datetime.now(dt.timezone.utc)
    job = store._get_provider().retrieve_feature_service_logs(
        feature_service=service, start_date=now - dt.timedelta(hours=1), end_date=now + dt.timedelta(hours=1),
        config=store.config, registry=store.registry)
    theirs = job.to_arrow()
    assert theirs.num_rows == ours.num_rows
    assert set(schema.names) <= set(theirs.column_names)
    row = next(r for r in theirs.to_pylist() if r["__request_id"] == "feast-read" and r["asset_id"] == "a1")
    assert (row["asset_activity__views_1h"], row["asset_attributes__category"]) == (4, "chair")


def test_an_on_demand_views_request_data_is_logged_as_the_request_sent_it(served):
    """Feast's schema of a service with an on-demand view has the request data that view reads (the answer does not
    echo it) and, for a service of on-demand views only, no join keys (the request's entity column is dropped)."""
    url, repo, store = served
    from feast.feature_logging import FeatureServiceLoggingSource

    entities = {"asset_id": ["a1", "zz", "old"], "prompt": ["a chair", "ü", ""], "target_volume": [8.0, 1.5, 3]}
    answers = {}
    for service in ("logged_fit", "logged_fit_only"):
        status, answer, _ = post_features(url, {"feature_service": service, "entities": entities}, f"{service}-1")
        assert status == 200
        answers[service] = {name: result["values"] for name, result in
                            zip(answer["metadata"]["feature_names"], answer["results"])}
    deadline = time.monotonic() + 30
    while not all(log_counts(url, s)["written"] + log_counts(url, s)["failed"] == 3 for s in answers):
        assert time.monotonic() < deadline, {s: log_counts(url, s) for s in answers}
        time.sleep(0.2)
    assert all(log_counts(url, s)["failed"] == 0 for s in answers)
    for service, answer in answers.items():
        schema = FeatureServiceLoggingSource(store.get_feature_service(service), store.project).get_schema(
            store.registry)
        table = log_table(repo, service)
        assert set(table.column_names) == set(schema.names)
        rows = sorted(table.to_pylist(), key=lambda r: entities["prompt"].index(r["prompt"]))
        assert [r["prompt"] for r in rows] == entities["prompt"]
        assert [r["target_volume"] for r in rows] == [8.0, 1.5, 3.0]
        assert [r["generation_fit__prompt_length"] for r in rows] == answer["prompt_length"] == [7, 1, 0]
        assert [r["generation_fit__scale_to_target"] for r in rows] == answer["scale_to_target"]
    assert "asset_id" not in log_table(repo, "logged_fit_only").column_names
    assert [r["asset_attributes__category"] for r in sorted(log_table(repo, "logged_fit").to_pylist(),
                                                            key=lambda r: entities["prompt"].index(r["prompt"]))] \
        == answers["logged_fit"]["category"] == ["chair", None, "lamp"]


def test_sampling_follows_the_request_id(served):
    url, repo, _ = served
    ids = [f"sample-{i}" for i in range(60)]
    echoed = {rid for rid in ids
              if post_features(url, {"feature_service": "sampled_ranking", "entities": {"asset_id": ["a1"]}}, rid)[2]}
    rule = {rid for rid in ids if zlib.crc32(rid.encode()) < 0.5 * 2**32}  # README: crc32(id) < rate * 2^32
    assert echoed == rule and 0 < len(rule) < len(ids)
    deadline = time.monotonic() + 30
    while log_counts(url, "sampled_ranking")["written"] < len(rule) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(log_table(repo, "sampled_ranking").column("__request_id").to_pylist()) == rule


def test_an_arrow_answer_is_logged_as_its_json_twin(served):
    """`serving.arrow_ipc`: a logged service asked for Arrow logs what the JSON answer would have said."""
    url, repo, _ = served
    columns = ["asset_activity__views_1h", "asset_activity__dwell_ms_mean_1h", "asset_attributes__category",
               "asset_attributes__polygon_count"]
    body = {"feature_service": "logged_ranking", "full_feature_names": True,
            "entities": {"asset_id": ["a1", "a2", "zz", "old"]}}
    arrow = "application/vnd.apache.arrow.stream"
    request = urllib.request.Request(url + "/get-online-features", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Accept": arrow,
                                              "X-Request-ID": "arrow-logged"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.headers["Content-Type"] == arrow and reply.headers["x-request-id"] == "arrow-logged"
        assert pa.ipc.open_stream(reply.read()).read_all().num_rows == 4
    expected = _expected_rows(post_features(url, body)[1], columns)
    deadline = time.monotonic() + 30
    rows: list[dict] = []
    while not rows and time.monotonic() < deadline:
        time.sleep(0.2)
        if (repo.parent / "data" / "feature_logs" / "logged_ranking").exists():
            rows = [row for row in log_table(repo, "logged_ranking").to_pylist()
                    if row["__request_id"] == "arrow-logged"]
    assert [{k: row[k] for k in want} for row, want in zip(rows, expected)] == expected


def test_a_full_queue_drops_and_counts_vectors_never_requests(tmp_path):
    redis_server = RedisServer(tmp_path)
    try:
        repo, _ = logged_repo(tmp_path, f"featurelogfull{os.getpid()}", redis_server.port,
                        {"queue_rows": 4, "flush_s": 3600})
        three = json.dumps({"feature_service": "logged_ranking", "entities": {"asset_id": ["a1", "a2", "zz"]}})
        five = json.dumps({"feature_service": "logged_ranking", "entities": {"asset_id": ["a1"] * 5}})
        bodies = [three.encode()] * 60 + [five.encode()]  # five rows never fit a queue of four
        port = free_port()
        with feature_server(repo, port) as url:
            assert pipelined(port, bodies) == [200] * len(bodies)
            counts = log_counts(url, "logged_ranking")
            assert counts["dropped"] >= 5 and counts["logged"] >= 3
            assert counts["logged"] + counts["dropped"] == 60 * 3 + 5
            assert counts["written"] == 0  # flush_s is an hour: only the shutdown writes
        assert log_table(repo, "logged_ranking").num_rows == counts["logged"]
    finally:
        redis_server.stop()


def test_the_queue_bound_never_waits_and_a_failed_write_loses_only_its_rows(tmp_path):
    stats = ServerStats()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    log = FeatureLogger(FeatureLogSettings(queue_rows=3, flush_s=3600), stats)
    for value in range(5):  # no writer thread yet: the queue fills, the rest is dropped at once
        log.offer(one_feature_spec(blocked / "logs"), one_row_answer(value), 1, f"r{value}")
    assert (stats.feature_log["svc"].logged, stats.feature_log["svc"].dropped, stats.log_queued) == (3, 2, 3)
    log.start()
    log.close()  # cannot create its folder under a file: counted, not raised
    assert (stats.feature_log["svc"].failed, stats.feature_log["svc"].written) == (3, 0)
    good = FeatureLogger(FeatureLogSettings(flush_s=3600), stats)
    good.start()
    good.offer(one_feature_spec(tmp_path / "logs"), one_row_answer(7.5), 1, None)
    good.offer(one_feature_spec(tmp_path / "logs"), one_row_answer(float("inf")), 1, None)  # "Infinity" in JSON
    good.close()
    rows = ds.dataset(tmp_path / "logs", partitioning="hive", ignore_prefixes=["."]).to_table().to_pylist()
    assert [(r["asset_id"], r["v__views"], r["v__views__status"]) for r in rows] == [("a1", 7.5, 1),
                                                                                       ("a1", float("inf"), 1)]
    assert rows[0]["v__views__timestamp"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert stats.feature_log["svc"].written == 2


@pytest.mark.parametrize("given", ["has space", "x" * 129, "ünï"])
def test_a_request_id_the_server_would_not_echo_is_replaced(served, given):
    url, _, _ = served
    status, _, logged_id = post_features(url, {"feature_service": "logged_ranking", "entities": {"asset_id": ["a1"]}},
                                 given.encode().decode("latin-1"))
    assert status == 200 and logged_id and logged_id != given and " " not in logged_id and len(logged_id) < 64


def test_an_answer_of_another_shape_fails_alone(tmp_path):
    """The writer thread parses the answers: one that does not fit its service (the catalog changed under the
    plan) is counted as failed, and the answers beside it are written."""
    stats = ServerStats()
    spec = one_feature_spec(tmp_path / "logs")
    wider = orjson.loads(one_row_answer(2.0))
    wider["metadata"]["feature_names"].append("other")
    wider["results"].append(wider["results"][-1])
    log = FeatureLogger(FeatureLogSettings(flush_s=3600), stats)
    log.offer(spec, one_row_answer(1.0), 1, "fits")
    log.offer(spec, orjson.dumps(wider), 1, "wider")
    log.start()
    log.close()
    counts = stats.feature_log["svc"]
    assert (counts.logged, counts.failed, counts.written) == (2, 1, 1)
    rows = ds.dataset(tmp_path / "logs", partitioning="hive", ignore_prefixes=["."]).to_table().to_pylist()
    assert [(r["__request_id"], r["v__views"]) for r in rows] == [("fits", 1.0)]
