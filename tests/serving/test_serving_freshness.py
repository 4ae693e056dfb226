"""Freshness end to end against the real Redis: `featurectl materialize` and a push record each view's newest event
time, which `featurectl status` and the feature server's /metrics show with its age; the server counts exactly the
rows it served missing (NOT_FOUND) or older than the ttl (OUTSIDE_MAX_AGE), and with two workers the counts add
up."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cli_helpers import cli_server, copy_example_repo, featurectl, free_port, register_repo
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.types import ValueType
from featurectl.status_commands import render
from redis_store import freshness, freshness_history
from redis_store.settings import RedisSettings
from serving_env import feast_rows, feature_server, get, post

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
VIEW = "asset_activity"  # ttl 2 days
NEWEST = NOW - dt.timedelta(hours=1)  # the newest offline row materialized
FEATURES = ["asset_activity:views_1h", "asset_attributes:category"]


def _ms(instant: dt.datetime) -> int:
    return int(instant.timestamp() * 1000)


def _offline_rows(view, rows: dict[str, dt.datetime]) -> pa.Table:
    """One offline row per asset at the given time, every feature set."""
    filler = {ValueType.INT64: 1, ValueType.FLOAT64: 1.5, ValueType.STRING: "user_1"}
    columns = {"asset_id": pa.array(list(rows)),
               EVENT_TIMESTAMP: pa.array(list(rows.values()), pa.timestamp("ms", "UTC"))}
    for name, kind in view.output_schema().items():
        columns[name] = pa.array([filler[kind]] * len(rows))
    columns["date"] = pa.array([t.strftime("%Y-%m-%d") for t in rows.values()])
    return pa.table(columns)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, local_services):
    """A project with `asset_activity` materialized (a_new at NEWEST, a_old 3 h before) and one asset written by
    Feast three days ago (past the 2-day ttl)."""
    folder = tmp_path_factory.mktemp("freshness")
    project = f"freshness_{uuid.uuid4().hex[:8]}"
    repo = copy_example_repo(folder, project, {"path": f"sqlite:///{folder / project}.db"}, data_dir=folder / "data")
    store = register_repo(repo)
    view = load_repo(repo).view(VIEW)
    table = _offline_rows(view, {"a_new": NEWEST, "a_old": NEWEST - dt.timedelta(hours=3)})
    ds.write_dataset(table, offline_table_path(folder / "data", view), format="parquet",
                     partitioning=ds.partitioning(pa.schema([("date", pa.string())])))
    start, end = NOW - dt.timedelta(days=1), NOW
    done = featurectl("--repo", str(repo), "materialize", start.isoformat(), end.isoformat(), "--view", VIEW)
    assert done.returncode == 0, done.stdout + done.stderr
    feast_rows(store, VIEW, {"a_stale": {"views_1h": 9}}, NOW - dt.timedelta(days=3))
    feast_rows(store, "asset_attributes", {"a_new": {"category": "chair"}})
    yield repo, project, (start, end)
    client = redis.Redis(*local_services.redis_host_port)
    client.delete(freshness.record_key(project), freshness_history.history_key(project))
    for key in client.scan_iter(match=f"*{project}".encode(), count=10_000):
        client.delete(key)


def _status_json(repo: Path, *args: str) -> dict:
    done = featurectl("--repo", str(repo), "status", "--json", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["view"]: row for row in json.loads(done.stdout)["views"]}


def _metrics(url: str) -> dict:
    status, body = get(url, "/metrics")
    assert status == 200
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def _samples(families: dict, name: str) -> dict:
    return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples
            if not s.name.endswith("_created")} if name in families else {}


def _served(url: str) -> dict:
    return _samples(_metrics(url), "featurectl_view_served_rows")


def _wait_for(read, want, what: str, timeout_s: float = 30.0):
    """`read()` until it returns `want` (a value the server reaches within a refresh or a stats share)."""
    deadline = time.monotonic() + timeout_s
    while (got := read()) != want:
        assert time.monotonic() < deadline, f"{what}: still {got}, want {want}"
        time.sleep(0.2)
    return got


def test_materialize_records_the_newest_event_time_and_status_shows_it(repo, local_services):
    folder, project, (start, end) = repo
    host, port = local_services.redis_host_port
    assert freshness.read_newest(RedisSettings.parse(f"{host}:{port}"), project) == {VIEW: _ms(NEWEST)}
    before = time.time()
    rows = _status_json(folder)
    after = time.time()
    row = rows[VIEW]
    assert row["materialized"] == [start.isoformat(), end.isoformat()]
    assert row["newest_event_ms"] == _ms(NEWEST) and row["newest_event_time"] == f"{NEWEST:%Y-%m-%dT%H:%M:%S}Z"
    assert before - NEWEST.timestamp() - 1 <= row["newest_value_age_s"] <= after - NEWEST.timestamp() + 1
    assert row["stream"] is None and row["served"] is None
    assert rows["user_activity"]["materialized"] is None and rows["user_activity"]["newest_event_time"] is None
    lines = {line.split()[0]: line for line in render(list(rows.values()), asked_server=False)}
    assert f"{start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}" in lines[VIEW]
    assert re.search(r"\(1h\d\dm\)", lines[VIEW]) and lines["user_activity"].split()[1] == "never"


@pytest.fixture(scope="module")
def server(repo):
    with feature_server(repo[0], free_port()) as url:
        yield url


def test_served_rows_are_counted_exactly_and_status_shows_the_rate(repo, server):
    folder, url = repo[0], server
    for entities in (["a_new", "a_stale", "zz", "a_old"], ["a_stale"], ["zz"], ["a_new"]):
        status, _ = post(url, {"features": FEATURES, "entities": {"asset_id": entities}})
        assert status == 200
    status, _ = post(url, {"features": ["asset_activity:nope"], "entities": {"asset_id": ["a_new"]}})
    assert status == 400, "a refused request serves no row"
    assert _served(url) == {
        (("status", "NOT_FOUND"), ("view", VIEW)): 2, (("status", "OUTSIDE_MAX_AGE"), ("view", VIEW)): 2,
        (("status", "PRESENT"), ("view", VIEW)): 3,
        (("status", "NOT_FOUND"), ("view", "asset_attributes")): 5,
        (("status", "OUTSIDE_MAX_AGE"), ("view", "asset_attributes")): 0,
        (("status", "PRESENT"), ("view", "asset_attributes")): 2}
    row = _status_json(folder, "--server", url)[VIEW]
    assert row["served"] == {"rows": 7, "not_found": 2, "outside_max_age": 2, "missing_rate": round(4 / 7, 6)}
    _wait_for(lambda: _samples(_metrics(url), "featurectl_view_newest_event_timestamp_seconds").get((("view", VIEW),)),
              NEWEST.timestamp(), "the newest event time in /metrics")
    age = _samples(_metrics(url), "featurectl_view_newest_value_age_seconds")[(("view", VIEW),)]
    assert 3_600 <= age <= time.time() - NEWEST.timestamp() + 1


def test_a_push_raises_the_views_newest_event_time(repo, server, local_services):
    _, project, _ = repo
    at = NOW - dt.timedelta(minutes=5)
    body = {"push_source_name": "asset_attributes_push",
            "df": {"asset_id": ["p1"], "event_timestamp": [at.isoformat()], "category": ["lamp"],
                   "creator_id": ["c1"], "style": ["voxel"], "bbox_x": [1.0], "bbox_y": [1.0], "bbox_z": [1.0],
                   "polygon_count": [10]}}
    status, reply = post(server, body, path="/push")
    assert status == 200 and reply["online_written"] == 1, reply
    _wait_for(lambda: _samples(_metrics(server), "featurectl_view_newest_event_timestamp_seconds").get(
        (("view", "asset_attributes"),)), at.timestamp(), "the pushed event time in /metrics")
    host, port = local_services.redis_host_port
    assert freshness.read_newest(RedisSettings.parse(f"{host}:{port}"), project)["asset_attributes"] == _ms(at)


def _worker_shares(server_pid: int) -> list[int]:
    """Rows of `asset_activity` each worker served, from its last shared counters (`ServerStats.dump`) in the stats
    folder the server gave its workers."""
    workers = [p for p in psutil.Process(server_pid).children(recursive=True)
               if "FEATURECTL_SERVE_SETTINGS" in p.environ()]
    folder = Path(json.loads(workers[0].environ()["FEATURECTL_SERVE_SETTINGS"])["stats_dir"])
    return [json.loads(path.read_text())["served"].get(VIEW, [0])[0] for path in folder.glob("*.json")]


def test_with_two_workers_the_served_counts_add_up(repo):
    folder, _, _ = repo
    requests = 120
    with cli_server(folder, "serve", "--workers", "2", ready_s=120) as server:
        _wait_for(lambda: len(_worker_shares(server.process.pid)), 2, "both workers up and sharing", 120)
        def one(_: int) -> int:
            body = json.dumps({"features": FEATURES, "entities": {"asset_id": ["a_new", "zz"]}}).encode()
            request = urllib.request.Request(server.url + "/get-online-features", data=body)
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(one, range(requests))) == {200}
        want = {(("status", "NOT_FOUND"), ("view", VIEW)): requests,
                (("status", "OUTSIDE_MAX_AGE"), ("view", VIEW)): 0,
                (("status", "PRESENT"), ("view", VIEW)): requests,
                (("status", "NOT_FOUND"), ("view", "asset_attributes")): requests,
                (("status", "OUTSIDE_MAX_AGE"), ("view", "asset_attributes")): 0,
                (("status", "PRESENT"), ("view", "asset_attributes")): requests}
        _wait_for(lambda: sum(_worker_shares(server.process.pid)), 2 * requests,
                  "the rows of every worker in their shared files (each shares its counts every second)")
        shares = _worker_shares(server.process.pid)
        assert len(shares) == 2 and min(shares) > 0, f"both workers served: {shares}"
        for _ in range(10):  # whichever worker answers the scrape: its own counts and the other's
            assert _served(server.url) == want


MONITORING_FAMILIES = {"featurectl_view_served_rows", "featurectl_view_newest_event_timestamp_seconds",
                       "featurectl_view_newest_value_age_seconds", "featurectl_stream_running",
                       "featurectl_stream_lag_seconds", "featurectl_feature_drift", "featurectl_feature_drift_values"}


def _unmonitored_copy(folder: Path) -> Path:
    """The same repo (registry, project, state folder) with `platform.serving.monitoring: false`."""
    copy = folder.parent / f"{folder.name}_unmonitored"
    shutil.copytree(folder, copy)
    settings = yaml.safe_load((copy / "feature_store.yaml").read_text())
    settings["platform"].setdefault("serving", {})["monitoring"] = False
    (copy / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return copy


def test_monitoring_off_serves_the_same_answers_without_the_freshness_and_quality_metrics(repo, server):
    body = {"features": FEATURES, "entities": {"asset_id": ["a_new", "a_stale", "zz"]}}
    with feature_server(_unmonitored_copy(repo[0]), free_port()) as unmonitored:
        answers = {}
        for url in (server, unmonitored):
            status, answers[url] = post(url, body)
            assert status == 200, answers[url]
        assert answers[server] == answers[unmonitored]
        off = _metrics(unmonitored)
        assert "featurectl_request_duration_seconds" in off and not MONITORING_FAMILIES & set(off), sorted(off)
        stats = json.loads(get(unmonitored, "/stats")[1])
        assert stats["served_rows"] == {} and "drift" not in stats
    assert MONITORING_FAMILIES <= set(_metrics(server))
    assert "drift" in json.loads(get(server, "/stats")[1])
