"""Arrow IPC on `POST /get-online-features` (`serving.arrow_ipc`) against a live `featurectl serve
--require-api-key`: the same answers as the JSON route (values, statuses, event times; missing and stale rows; one
row, answered from the Redis callback, and several, answered by `respond`), the same API key refusals, 400 for a
malformed stream, 503 within the timeout when Redis hangs, and `HttpClient(binary=True)`."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pyarrow as pa
import pytest
import yaml
from cli_helpers import free_port, project_keys
from featurectl.services.scratch_redis import RedisServer
from serving_env import feast_rows, feature_server, make_repo

from serving.arrow_ipc import arrow_request
from serving.http_client import HttpClient, HttpServingError
from serving.media import ARROW_STREAM
from serving.result import rfc3339_many

pytestmark = pytest.mark.integration

ARROW = ARROW_STREAM.decode()
TIMEOUT_S = 0.5
FEATURES = ["asset_activity:views_1h", "asset_attributes:category", "asset_activity:dwell_ms_mean_1h",
            "asset_attributes:polygon_count"]


@dataclass
class Served:
    url: str
    redis: RedisServer
    secret: str          # a key of every feature service and feature list
    ranker: str          # a key of `asset_ranking` only


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("binary")
    redis_server = RedisServer(folder)
    try:
        repo, store = make_repo(folder, f"servingbinary{os.getpid()}", f"127.0.0.1:{redis_server.port}")
        settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
        settings["platform"] = {"auth": {"enabled": False, "refresh_s": 0.5}}
        (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
        feast_rows(store, "asset_activity", {"a1": {"views_1h": 4, "dwell_ms_mean_1h": 2.5},
                                             "a2": {"views_1h": 7}})  # a2: dwell_ms_mean_1h NULL_VALUE
        feast_rows(store, "asset_activity", {"old": {"views_1h": 1}},  # past the view's 2 d ttl
                   dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3))
        feast_rows(store, "asset_attributes", {"a1": {"category": "chair", "polygon_count": 1200},
                                               "old": {"category": "lamp"}},
                   dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc))
        keys = project_keys(repo)
        _, secret = keys.create("all", ["*"], 1000, 1000)
        _, ranker = keys.create("ranker", ["asset_ranking"], 1000, 1000)
        with feature_server(repo, free_port(), "--require-api-key", "--timeout", str(TIMEOUT_S)) as url:
            yield Served(url, redis_server, secret, ranker)
    finally:
        redis_server.stop()


def _post(url: str, body: bytes, headers: dict) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url + "/get-online-features", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def _as_json(table: pa.Table, entity_keys: int) -> dict:
    """An Arrow answer in Feast's JSON shape, for comparison: entity columns are PRESENT at the epoch."""
    names, results = [], []
    for name in table.column_names[:entity_keys]:
        values = table[name].to_pylist()
        names.append(name)
        results.append({"values": values, "statuses": ["PRESENT"] * len(values),
                        "event_timestamps": ["1970-01-01T00:00:00Z"] * len(values)})
    for i in range(entity_keys, table.num_columns, 3):
        name = table.column_names[i]
        assert table.column_names[i + 1:i + 3] == [f"{name}:status", f"{name}:event_timestamp"]
        assert table.schema.field(i + 2).type == pa.timestamp("ns", tz="UTC")
        stamps = table[i + 2].cast(pa.int64()).to_pylist()
        names.append(name)
        results.append({"values": table[name].to_pylist(), "statuses": table[i + 1].to_pylist(),
                        "event_timestamps": rfc3339_many([t // 10**9 for t in stamps], [t % 10**9 for t in stamps])})
    return {"metadata": {"feature_names": names}, "results": results}


@pytest.mark.parametrize("entities", [["a1"], ["zz"], ["old"], ["a1", "zz", "a2", "old"]],
                         ids=["one", "missing", "stale", "several"])
def test_arrow_answers_equal_the_json_ones(served, entities):
    with HttpClient(served.url, api_key=served.secret) as client:
        expected = client.get_online_features(FEATURES, {"asset_id": entities})
        table = client.get_online_features(FEATURES, {"asset_id": entities}, binary=True)
    assert _as_json(table, 1) == expected
    assert table.schema.field("views_1h").type == pa.int64() and table.schema.field("category").type == pa.string()
    seen = {status for result in expected["results"] for status in result["statuses"]}
    assert seen == {"one": {"PRESENT"}, "missing": {"PRESENT", "NOT_FOUND"},
                    "stale": {"PRESENT", "OUTSIDE_MAX_AGE", "NULL_VALUE"},
                    "several": {"PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"}}[entities_id(entities)]


def entities_id(entities: list[str]) -> str:
    return {"a1": "one", "zz": "missing", "old": "stale"}[entities[0]] if len(entities) == 1 else "several"


def test_each_way_alone_and_a_feature_service(served):
    auth = {"Authorization": f"Bearer {served.secret}"}
    entities = {"asset_id": ["a1", "zz"]}
    with HttpClient(served.url, api_key=served.secret) as client:
        expected = client.get_online_features("asset_ranking", entities, full_feature_names=True)
        both = client.get_online_features("asset_ranking", entities, full_feature_names=True, binary=True)
    assert _as_json(both, 1) == expected
    assert any(name.startswith("asset_activity__") for name in both.column_names)
    body = arrow_request("asset_ranking", entities, True)
    status, kind, payload = _post(served.url, body, {"Content-Type": ARROW, **auth})  # Arrow in, JSON out
    assert (status, kind) == (200, "application/json")
    assert json.loads(payload) == expected
    status, kind, payload = _post(served.url, json.dumps({"feature_service": "asset_ranking", "entities": entities,
                                                          "full_feature_names": True}).encode(),
                                  {"Content-Type": "application/json", "Accept": f"{ARROW}, application/json",
                                   **auth})  # JSON in, Arrow out
    assert (status, kind) == (200, ARROW)
    assert pa.ipc.open_stream(payload).read_all().equals(both)


def test_api_keys_refuse_the_binary_route_as_the_json_one(served):
    body = arrow_request(FEATURES, {"asset_id": ["a1"]})
    headers = {"Content-Type": ARROW, "Accept": ARROW}
    status, kind, payload = _post(served.url, body, headers)
    assert (status, kind) == (401, "application/json") and b"missing_api_key" in payload
    with pytest.raises(HttpServingError, match="403") as refused:
        HttpClient(served.url, api_key=served.ranker).get_online_features(FEATURES, {"asset_id": ["a1"]},
                                                                          binary=True)
    assert refused.value.code == "forbidden"
    table = HttpClient(served.url, api_key=served.ranker).get_online_features("asset_ranking", {"asset_id": ["a1"]},
                                                                              binary=True)
    assert table.num_rows == 1


@pytest.mark.parametrize("body, fragment", [
    (b"not arrow at all", "the body is not an Arrow IPC stream"),
    (b"", "the body is not an Arrow IPC stream"),
    (arrow_request(FEATURES, {"asset_id": ["a1"]})[:-40], "the body is not an Arrow IPC stream"),
    (arrow_request(FEATURES, {"asset_id": ["a1"]}).replace(b"features", b"featurez"),
     "must name either `features`"),
    (arrow_request(FEATURES, {"asset_id": [1]}), "entity `asset_id` takes string values; row 0 holds int 1"),
])
def test_a_malformed_arrow_body_gets_a_400_that_says_what_is_wrong(served, body, fragment):
    status, kind, payload = _post(served.url, body, {"Content-Type": ARROW, "Accept": ARROW,
                                                     "Authorization": f"Bearer {served.secret}"})
    reply = json.loads(payload)
    assert (status, kind) == (400, "application/json") and fragment in reply["error"], reply
    assert reply["code"] in ("malformed_arrow", "bad_entities")


def test_redis_hanging_gives_503_within_the_timeout_on_the_binary_route(served):
    client = HttpClient(served.url, api_key=served.secret)
    served.redis.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(HttpServingError, match="503") as failed:
            client.get_online_features(FEATURES, {"asset_id": ["a1"]}, binary=True)
        assert failed.value.code == "redis_unavailable" and time.monotonic() - started < TIMEOUT_S + 1.0
    finally:
        served.redis.thaw()
    assert client.get_online_features(FEATURES, {"asset_id": ["a1"]}, binary=True).num_rows == 1
    with urllib.request.urlopen(served.url + "/metrics", timeout=5) as reply:
        assert "featurectl_redis_errors_total 1.0" in reply.read().decode()
