"""`featurectl gateway` in front of real `featurectl generate-server` replicas (the tiny model on the CPU), with API
keys on at the gateway and off at the replicas: meshes and jobs through one API, a job polled back from the replica
that runs it, a job visible only to its key, and each key's token budget charged once, at the gateway (given back
when no mesh comes of a request)."""

from __future__ import annotations

import contextlib
import http.client
import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from urllib.parse import urlsplit

import orjson
import psutil
import pytest
import yaml

from cli_helpers import cli_server, copy_example_repo, project_keys, register_repo

pytestmark = pytest.mark.integration

TINY_TOKENS = 12                       # the tiny model decodes 12 shape tokens per mesh
REFRESH_S = 0.5


def _call(url: str, body: dict | None = None, key: str | None = None):
    """(status, headers, body bytes) of a GET, or a POST of `body`; with `key` as a bearer token."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET" if body is None else "POST", parts.path, None if body is None else orjson.dumps(body),
                     {"Authorization": f"Bearer {key}"} if key else {})
        reply = conn.getresponse()
        return reply.status, reply.headers, reply.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, local_services):
    """(gateway URL, replica URLs, repo, {name: (key id, secret)}): two replicas without keys, a gateway with."""
    folder = tmp_path_factory.mktemp("gatewaykeys")
    host, port = local_services.redis_host_port
    repo = copy_example_repo(folder, f"gatewaykeys{os.getpid()}", {"path": f"sqlite:///{folder / 'registry.db'}"},
                             {"type": "redis", "connection_string": f"{host}:{port}"})
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["platform"] = {"auth": {"enabled": True, "refresh_s": REFRESH_S}}
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    register_repo(repo)
    store = project_keys(repo)
    made = {"gen": store.create("gen", ["cube3d_conditioning"], 100, 2 * TINY_TOKENS + 6),
            "other": store.create("other", ["*"], 100, 1000)}
    starting = [cli_server(repo, "generate-server", "--config", "tiny", "--no-require-api-key", ready_path="/ready",
                           log=folder / f"replica{i}.log", grace_s=30) for i in range(2)]
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        started = [pool.submit(server.__enter__) for server in starting]          # both start at once
        wait(started)
        for server, done in zip(starting, started):
            if done.exception() is None:
                stack.push(server)
        replicas = [done.result() for done in started]
        gateway = stack.enter_context(cli_server(repo, "gateway", "--config", "tiny", "--replica", replicas[0].url,
                                                 "--replica", replicas[1].url, ready_path="/ready",
                                                 log=folder / "gateway.log", grace_s=10))
        yield gateway, [r.url for r in replicas], repo, {n: (k.key_id, s) for n, (k, s) in made.items()}


def test_keys_and_budgets_are_checked_once_at_the_gateway(deployment):
    gateway, replicas, repo, keys = deployment
    key_id, secret = keys["gen"]                            # 30 tokens a minute: two meshes of 12
    status, headers, body = _call(gateway.url + "/generate", {"prompt": "a chair"})
    assert status == 401 and orjson.loads(body)["code"] == "missing_api_key" and headers["WWW-Authenticate"]
    status, _, body = _call(gateway.url + "/generate", {"prompt": "a chair", "colour": 1}, secret)
    assert status == 400 and "`colour`" in orjson.loads(body)["error"]           # the replica's answer; refunded

    status, headers, body = _call(gateway.url + "/generate", {"prompt": "a wooden chair"}, secret)
    assert status == 200 and body[:4] == b"glTF" and headers["X-Replica"]
    status, headers, body = _call(gateway.url + "/generate", {"prompt": "a stone lamp", "async": True}, secret)
    job = orjson.loads(body)
    assert status == 202 and job["job_id"].startswith(headers["X-Replica"] + "-") and headers["Location"] == job["poll"]
    poll = gateway.url + job["poll"]
    assert _call(poll, key=keys["other"][1])[0] == 404 and _call(poll)[0] == 401
    deadline = time.monotonic() + 60
    while (reply := _call(poll, key=secret))[0] == 202:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert reply[0] == 200 and reply[2][:4] == b"glTF" and reply[1]["X-Replica"] == headers["X-Replica"]

    status, headers, body = _call(gateway.url + "/generate", {"prompt": "a red car"}, secret)
    assert status == 429 and orjson.loads(body)["code"] == "over_budget" and 1 <= int(headers["Retry-After"]) <= 60

    deadline = time.monotonic() + 10 * REFRESH_S + 10
    while (usage := {r[0]: r[2:] for r in project_keys(repo).usage()}).get(key_id) != (2, 2 * TINY_TOKENS, 1):
        assert time.monotonic() < deadline, f"usage not recorded once as expected: {usage}"
        time.sleep(0.2)
    served = [orjson.loads(_call(url + "/stats")[2])["outcomes"]["ok"] for url in replicas]
    assert sum(served) == 2                                 # two meshes made, each charged once


def test_the_replicas_behind_the_gateway_take_no_keys_and_everything_binds_loopback(deployment):
    gateway, replicas, _, keys = deployment
    status, _, body = _call(replicas[0] + "/generate", {"prompt": "a cup"})
    assert status == 200 and body[:4] == b"glTF"
    listening = {c.laddr.ip for c in psutil.Process(gateway.process.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {"127.0.0.1"}
    log = gateway.log.read_text()
    for _, secret in keys.values():
        assert secret not in log
    stats = orjson.loads(_call(gateway.url + "/stats")[2])
    assert [r["url"] for r in stats["replicas"]] == replicas and not any(r["ejected"] for r in stats["replicas"])


def test_a_job_asked_with_another_method_keeps_its_charge(deployment):
    gateway, _, repo, _ = deployment
    _, secret = project_keys(repo).create("onemesh", ["cube3d_conditioning"], 100, TINY_TOKENS + 6)
    time.sleep(3 * REFRESH_S)                               # the gateway's copy of the keys has it
    status, _, body = _call(gateway.url + "/generate", {"prompt": "a stone lamp", "async": True}, secret)
    assert status == 202
    poll = urlsplit(gateway.url + orjson.loads(body)["poll"])
    conn = http.client.HTTPConnection(poll.hostname, poll.port, timeout=60)
    try:
        conn.request("DELETE", poll.path, headers={"Authorization": f"Bearer {secret}"})
        reply = conn.getresponse()
        assert reply.status == 405 and reply.headers["Allow"] == "GET, HEAD" and b"method_not_allowed" in reply.read()
    finally:
        conn.close()
    status, _, body = _call(gateway.url + "/generate", {"prompt": "a red car"}, secret)
    assert status == 429 and orjson.loads(body)["code"] == "over_budget"  # the job's mesh is still charged
