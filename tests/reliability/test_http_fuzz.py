"""Both HTTP servers fuzzed from their own OpenAPI documents (schemathesis, valid and invalid inputs) while they
run for real (`featurectl serve`, `featurectl generate-server --config tiny` on the CPU, a private Redis): no
input gets a 5xx, and every error is a JSON body naming the problem (`error`) and its kind (`code`). Then hostile
clients on raw sockets: huge or endless headers, deep nesting, slow and silent senders, pipelines never read."""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time

import psutil
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from cli_helpers import cli_server
from fault_env import PrivateServices, example_repo, http, sibling
from inference.service.openapi import OPENAPI as GENERATION_OPENAPI
from serving.openapi import OPENAPI as FEATURE_OPENAPI

pytestmark = pytest.mark.integration

FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
REQUEST_TIMEOUT_S = 1.0  # platform.http.request_timeout_s of the repo both servers run on


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The example repo in a SQLite registry with a few assets' values in a private Redis."""
    from feast import FeatureStore

    from common.config import load_config

    folder = tmp_path_factory.mktemp("http_fuzz")
    services = PrivateServices(folder / "services")
    services.redis.up()
    try:
        repo = example_repo(folder, "http_fuzz", {"path": f"sqlite:///{folder}/registry.db"}, services.redis_port)
        settings_path = repo / "feature_store.yaml"
        raw = yaml.safe_load(settings_path.read_text())
        raw.setdefault("platform", {})["http"] = {"request_timeout_s": REQUEST_TIMEOUT_S}
        settings_path.write_text(yaml.safe_dump(raw))
        store = FeatureStore(config=load_config(repo).feast_repo_config())
        values = {f"asset_{i:06d}": {"views_1h": i, "views_24h": 2 * i} for i in range(3)}
        sibling("serving_env", "serving").feast_rows(store, "asset_activity", values,
                                                     dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
        yield repo
    finally:
        services.down()


def operations(document: dict) -> list:
    """(operation, generation mode) pairs of an OpenAPI document: one test each, valid and invalid inputs."""
    schema = schemathesis.openapi.from_dict(document)
    found = [result.ok() for result in schema.get_all_operations()]
    return [pytest.param(op, mode, id=f"{op.method.upper()} {op.path} {mode.value}")
            for op in found for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            if mode is GenerationMode.POSITIVE or len(op.body)]  # a string path parameter has no invalid value


def fuzz(operation, mode: GenerationMode, url: str, max_examples: int, timeout_s: float) -> None:
    """Hypothesis drives the operation's strategy; every generated request goes to the live server."""
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(FUZZ, max_examples=max_examples)
    def one(case) -> None:
        check(case, case.call(base_url=url, timeout=timeout_s))

    one()


def check(case, response) -> None:
    """No 5xx, not even when a `timeout_s` passes before the mesh is done (that is a 202 naming the job to poll);
    every error a JSON object with a non-empty `error` message and a `code`."""
    described = (f"{case.method} {case.formatted_path} {case.body!r:.300} -> {response.status_code} "
                 f"{response.content[:300]!r}")
    if response.status_code == 202:
        job = json.loads(response.content)
        poll = f"/jobs/{job['job_id']}"
        assert job["poll"] == poll and response.headers["location"] == [poll], described   # header values: lists
    if response.status_code < 400:
        return
    try:
        body = json.loads(response.content)
    except ValueError:
        pytest.fail(f"an error without a JSON body: {described}")
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip() \
        and isinstance(body.get("code"), str), f"an error body that names no problem: {described}"
    case.validate_response(response, checks=[not_a_server_error])


@pytest.fixture(scope="module")
def feature(repo):
    with cli_server(repo, "serve") as server:
        yield server


@pytest.fixture(scope="module")
def feature_url(feature):
    return feature.url


@pytest.mark.parametrize("operation, mode", operations(FEATURE_OPENAPI))
def test_feature_server_never_answers_5xx_and_names_every_error(feature_url, operation, mode):
    fuzz(operation, mode, feature_url, max_examples=60, timeout_s=30)


@pytest.fixture(scope="module")
def generation(repo):
    with cli_server(repo, "generate-server", "--config", "tiny", "--device", "cpu", "--resolution", "3",
                    "--timeout", "20") as server:
        yield server


@pytest.fixture(scope="module")
def generation_url(generation):
    return generation.url


@pytest.mark.parametrize("operation, mode", operations(GENERATION_OPENAPI))
def test_generation_server_never_answers_5xx_and_names_every_error(generation_url, operation, mode):
    valid_generate = operation.path == "/generate" and mode is GenerationMode.POSITIVE  # a mesh each, on the CPU
    fuzz(operation, mode, generation_url, max_examples=6 if valid_generate else 25, timeout_s=60)


@pytest.mark.parametrize("path, document", [("feature", FEATURE_OPENAPI), ("generation", GENERATION_OPENAPI)])
def test_servers_publish_the_documents_fuzzed_here(feature_url, generation_url, path, document):
    url = feature_url if path == "feature" else generation_url
    assert http("GET", url + "/openapi.json") == (200, json.loads(json.dumps(document)))


# hostile clients, on raw sockets, against both servers

@pytest.fixture(params=["feature", "generation"])
def server(request):
    return request.getfixturevalue(request.param)


def _connect(url: str, timeout: float = 10.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def _read_responses(sock: socket.socket, count: int = 1) -> list[tuple[int, dict]]:
    """(status, JSON body or {}) of the next `count` responses, reading until they are whole or the server closes."""
    data, found = b"", []
    while len(found) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].decode("latin-1")
            length = int(next((line.split(":", 1)[1] for line in head.split("\r\n")
                               if line.lower().startswith("content-length:")), "0"))
            if len(data) >= head_end + 4 + length:
                body = data[head_end + 4:head_end + 4 + length]
                kind = "application/json" in head.lower()
                found.append((int(head.split()[1]), json.loads(body) if kind and body else {}))
                data = data[head_end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return found


def _send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send while the caller reads: the server answers a refusal before the client has sent everything."""
    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:  # the server closed after its answer: expected
            pass

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _health_answers(url: str) -> bool:
    return http("GET", url + "/health", timeout=5)[0] == 200


@pytest.mark.parametrize("head, status, code", [
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (8 << 20) + b"\r\n\r\n", 431, "headers_too_large"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(10_000)) + b"\r\n", 431,
     "headers_too_large"),
    (b"GET /" + b"a" * (100 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
])
def test_huge_heads_are_refused_early_and_others_are_still_served(server, head, status, code):
    with _connect(server.url) as sock:
        sender = _send_in_background(sock, head)
        [(answered, body)] = _read_responses(sock)
        assert _health_answers(server.url)
        sender.join(10)
    assert answered == status and body["code"] == code and body["error"]


@pytest.mark.parametrize("partial", [b"GET /health HTTP/1.1\r\nHost: x\r\n",
                                     b"POST /health HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}"],
                         ids=["half a head", "short body"])
def test_slow_and_silent_clients_get_408_and_are_closed(server, partial):
    socks = [_connect(server.url) for _ in range(50)]
    try:
        for sock in socks:
            sock.sendall(partial)
        assert _health_answers(server.url)
        for sock in socks:
            assert _read_responses(sock) == [(408, {"error": f"the request was not received whole within "
                                                            f"{REQUEST_TIMEOUT_S:g} s", "code": "request_timeout"})]
            assert sock.recv(1) == b""                 # and closed: nothing is held for a silent client
    finally:
        for sock in socks:
            sock.close()


def test_pipelined_answers_never_read_do_not_pile_up_in_memory(server):
    process = psutil.Process(server.process.pid)
    before = process.memory_info().rss
    sock = _connect(server.url)
    sender = _send_in_background(sock, b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 60_000)
    time.sleep(2 * REQUEST_TIMEOUT_S + 1)              # long enough to have answered all, were it not paused
    grown = process.memory_info().rss - before
    assert _health_answers(server.url)
    sock.close()
    sender.join(10)
    assert grown < 20 << 20, f"the server grew by {grown >> 20} MB holding answers nobody reads"


def test_a_valid_request_then_garbage_in_one_packet_gets_both_answers(server):
    with _connect(server.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n\x00garbage\r\n\r\n")
        answers = _read_responses(sock, 2)
    assert [status for status, _ in answers] == [200, 400] and answers[1][1]["code"] == "bad_request"


def _post(url: str, path: str, body: bytes) -> tuple[int, dict]:
    with _connect(url, timeout=30) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (path.encode(), len(body)) + body)
        [answer] = _read_responses(sock)
    return answer


def test_deep_nesting_is_a_400_json_with_no_traceback(feature, generation):
    deep_entity = b'{"features": ["asset_activity:views_1h"], "entities": {"asset_id": [' + b"[" * 975 \
        + b"]" * 975 + b"]}}"
    status, body = _post(feature.url, "/get-online-features", deep_entity)
    assert status == 400 and body["code"] == "malformed_json" and "nested more than 32 levels" in body["error"]
    deep_seed = b'{"prompt": "a chair", "seed": ' + b"[" * 1020 + b"]" * 1020 + b"}"
    status, body = _post(generation.url, "/generate", deep_seed)
    assert status == 400 and body["code"] == "bad_request" and "nested more than 32 levels" in body["error"]
    for server in (feature, generation):
        assert "Traceback" not in server.log.read_text()


def test_long_inputs_are_not_echoed_whole_and_bodies_over_the_limit_are_413(feature, generation):
    name = "s" * 1_000_000
    status, body = _post(feature.url, "/get-online-features",
                         json.dumps({"feature_service": name, "entities": {"asset_id": ["a"]}}).encode())
    assert status == 400 and body["code"] == "unknown_feature_service" and len(body["error"]) < 1000
    status, body = _post(generation.url, "/generate", json.dumps({"prompt": "p" * (65 << 10)}).encode())
    assert status == 413 and body["code"] == "body_too_large"
