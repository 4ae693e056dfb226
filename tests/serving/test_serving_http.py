"""`featurectl serve` as a user meets it: Feast's request and response shapes, precise 400s, health, readiness,
metrics, OpenAPI, `--stats`, and 503 within the timeout when Redis hangs or dies (a redis-server of the test's
own, frozen and killed by pid)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_helpers import free_port
from featurectl.services.scratch_redis import RedisServer
from serving_env import feature_server, get, post, scratch_repo

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5
FEATURES = ["asset_activity:views_1h", "asset_attributes:category", "asset_activity:dwell_ms_mean_1h"]


@dataclass
class Served:
    url: str
    redis: RedisServer
    store: object
    repo: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with scratch_repo(tmp_path_factory.mktemp("http"), f"servinghttp{os.getpid()}") as (repo, store, redis_server):
        with feature_server(repo, free_port(), "--timeout", str(TIMEOUT_S)) as url:
            yield Served(url, redis_server, store, repo)


def test_features_come_back_in_feast_shape_and_request_order(server):
    url, store = server.url, server.store
    from feast.feature_server_utils import convert_response_to_dict

    status, body = post(url, {"features": FEATURES, "entities": {"asset_id": ["a1", "zz"]}})
    assert status == 200
    assert body["metadata"]["feature_names"] == ["asset_id", "views_1h", "category", "dwell_ms_mean_1h"]
    assert [r["values"] for r in body["results"]] == [["a1", "zz"], [4, None], ["chair", None], [2.5, None]]
    feast = convert_response_to_dict(store.get_online_features(FEATURES, [{"asset_id": "a1"}]).proto)
    theirs = dict(zip(feast["metadata"]["feature_names"], feast["results"]))
    status, body = post(url, {"features": FEATURES, "entities": {"asset_id": ["a1"]}})
    assert dict(zip(body["metadata"]["feature_names"], body["results"])) == theirs


def test_feature_service_and_full_feature_names(server):
    url = server.url
    status, body = post(url, {"feature_service": "cube3d_conditioning", "entities": {"asset_id": ["a1"]},
                              "full_feature_names": True})
    assert status == 200
    names = body["metadata"]["feature_names"]
    assert names[:2] == ["asset_id", "asset_attributes__bbox_x"] and "asset_activity__views_24h" in names


@pytest.mark.parametrize("body, code, fragment", [
    (b"{not json", "malformed_json", "malformed JSON body"),
    (b"", "malformed_json", "malformed JSON body"),
    ([1, 2], "bad_request", "must be a JSON object"),
    ({"entities": {"asset_id": ["a1"]}}, "bad_request", "`features` must be a non-empty list"),
    ({"features": "asset_activity:views_1h", "entities": {"asset_id": ["a1"]}}, "bad_request", "non-empty list"),
    ({"features": FEATURES, "feature_service": "asset_ranking", "entities": {"asset_id": ["a1"]}}, "bad_request",
     "not both"),
    ({"features": ["asset_activity:nope"], "entities": {"asset_id": ["a1"]}}, "unknown_feature", "has no feature"),
    ({"feature_service": "nope", "entities": {"asset_id": ["a1"]}}, "unknown_feature_service", "known services"),
    ({"features": FEATURES, "entities": {"asset_id": [7]}}, "bad_entities", "takes string values"),
    ({"features": FEATURES, "entities": {"asset_id": "a1"}}, "bad_entities", "must be a list"),
    ({"features": FEATURES, "entities": {}}, "bad_request", "`entities` must be an object"),
    ({"features": FEATURES, "entities": {"asset": ["a1"]}}, "bad_entities", "lack join key(s) `asset_id`"),
    ({"features": FEATURES, "entities": {"asset_id": ["a1"]}, "full_feature_names": "yes"}, "bad_request",
     "true or false"),
])
def test_bad_requests_get_a_400_that_says_what_is_wrong(server, body, code, fragment):
    status, reply = post(server.url, body)
    assert status == 400
    assert reply["code"] == code and fragment in reply["error"]


def test_routing_errors_and_oversized_bodies(server):
    url = server.url
    assert get(url, "/get-online-features")[0] == 405
    assert get(url, "/nope")[0] == 404
    status, reply = post(url, b'{"features": ["' + b"x" * (2 << 20) + b'"]}')
    assert status == 413 and reply["code"] == "body_too_large"


def test_health_ready_openapi_and_metrics(server):
    url = server.url
    assert get(url, "/health")[0] == 200
    status, body = get(url, "/ready")
    assert status == 200 and json.loads(body)["feature_views"] == 4
    spec = json.loads(get(url, "/openapi.json")[1])
    assert {"/get-online-features", "/health", "/ready", "/metrics"} <= set(spec["paths"])
    post(url, {"feature_service": "asset_ranking", "entities": {"asset_id": ["a1"]}})
    status, metrics = get(url, "/metrics")
    text = metrics.decode()
    assert status == 200
    assert 'featurectl_request_duration_seconds_bucket{endpoint="/get-online-features",le="+Inf"}' in text
    assert 'featurectl_feature_service_request_duration_seconds_count{feature_service="asset_ranking"} 1.0' in text
    assert 'featurectl_request_duration_quantile_seconds{endpoint="/get-online-features",quantile="0.99"}' in text
    assert 'featurectl_responses_total{endpoint="/get-online-features",status="400"}' in text
    assert "featurectl_requests_in_flight" in text and "featurectl_redis_errors_total" in text


def test_stats_command_prints_percentiles_per_endpoint(server, run_featurectl):
    done = run_featurectl("serve", "--stats", server.url)
    assert done.returncode == 0, done.stderr
    assert "p99.9 ms" in done.stdout and "/get-online-features" in done.stdout and "asset_ranking" in done.stdout


def _raw(url: str, data: bytes) -> bytes:
    """Bytes in, everything the server answers until it closes or goes quiet."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        out = b""
        with contextlib.suppress(socket.timeout):
            sock.settimeout(1.0)
            while chunk := sock.recv(65536):
                out += chunk
    return out


def test_pipelined_requests_are_answered_in_order(server):
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    nope = b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
    out = _raw(server.url, health + nope + health)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", out) == [b"200", b"404", b"200"]


def test_malformed_http_gets_a_400_and_a_closed_connection(server):
    out = _raw(server.url, b"GARBAGE\x00 / HTTP/9\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ") and b"connection: close" in out and b"malformed HTTP request" in out


def test_expect_100_continue_is_answered(server):
    body = json.dumps({"features": FEATURES, "entities": {"asset_id": ["a1"]}}).encode()
    head = (f"POST /get-online-features HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            "Expect: 100-continue\r\n\r\n").encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")


def test_the_asgi_face_serves_the_same_replies():
    from serving.http_app import MAX_BODY_BYTES, FeatureServer

    app = FeatureServer(make_client=lambda: None)

    async def call(method: str, path: str, body: bytes) -> tuple[int, dict]:
        sent: list[dict] = []
        chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)] or [b""]
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                    for i, c in enumerate(chunks)]

        async def receive() -> dict:
            return messages.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        await app({"type": "http", "method": method, "path": path}, receive, send)
        return sent[0]["status"], json.loads(sent[1]["body"])

    assert asyncio.run(call("GET", "/health", b"")) == (200, {"status": "ok"})
    assert asyncio.run(call("POST", "/get-online-features", b"{"))[1]["code"] == "malformed_json"
    assert asyncio.run(call("POST", "/get-online-features", b" " * (MAX_BODY_BYTES + 1)))[0] == 413
    assert asyncio.run(call("DELETE", "/health", b""))[0] == 405


def test_workers_share_one_set_of_latency_counts(server):
    with feature_server(server.repo, free_port(), "--workers", "2") as url:
        for _ in range(30):  # a new connection each: the kernel spreads them over both workers
            assert post(url, {"feature_service": "asset_ranking", "entities": {"asset_id": ["a1"]}})[0] == 200
        time.sleep(1.5)  # each worker publishes its counters every second
        summary = json.loads(get(url, "/stats")[1])
    assert summary["endpoints"]["/get-online-features"]["count"] == 30
    assert summary["feature_services"]["asset_ranking"]["count"] == 30


def test_redis_hanging_or_down_gives_503_within_the_timeout(server):
    url, redis_server = server.url, server.redis
    body = {"features": FEATURES, "entities": {"asset_id": ["a1"]}}
    redis_server.freeze()
    try:
        started = time.monotonic()
        status, reply = post(url, body)
        assert status == 503 and reply["code"] == "redis_unavailable" and "did not answer within" in reply["error"]
        assert time.monotonic() - started < TIMEOUT_S + 1.0
        assert get(url, "/ready")[0] == 503
    finally:
        redis_server.thaw()
    assert post(url, body)[0] == 200  # a fresh connection once Redis answers again
    redis_server.stop()
    started = time.monotonic()
    status, reply = post(url, body)
    assert status == 503 and "cannot reach redis" in reply["error"]
    assert time.monotonic() - started < TIMEOUT_S + 1.0
    assert "featurectl_redis_errors_total 3.0" in get(url, "/metrics")[1].decode()
