"""API keys on a live `featurectl generate-server` turned on by `platform.auth.enabled` (the tiny model on the
CPU): 401 without a valid key, 403 for a key without the conditioning feature service or whose whole budget is
below one mesh, 429 with Retry-After once the key's generated shape tokens per minute are spent, jobs visible only
to their key, usage recorded, loopback bind, no key in logs."""

from __future__ import annotations

import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import orjson
import psutil
import pytest
import yaml

from cli_helpers import ROOT, cli_server, featurectl, project_keys, register_repo

pytestmark = pytest.mark.integration

TINY_TOKENS = 12                       # the tiny model decodes 12 shape tokens per mesh
REFRESH_S = 0.5


@dataclass
class Server:
    url: str
    repo: Path
    log: Path
    pid: int
    keys: dict[str, tuple[str, str]]   # name -> (key id, secret)


def _call(url: str, body: dict | None = None, key: str | None = None):
    """(status, headers, body bytes)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = urllib.request.Request(url, data=None if body is None else orjson.dumps(body), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.headers, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def _repo(folder: Path, redis_address: str) -> Path:
    """The example definitions under a project of their own, registered in a SQLite registry."""
    repo = folder / "genkeys"
    repo.mkdir()
    shutil.copy(ROOT / "feature_repo" / "features.py", repo / "features.py")
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings.update(project=f"genkeys{os.getpid()}", online_store={"type": "redis", "connection_string": redis_address})
    settings["registry"]["path"] = f"sqlite:///{folder / 'registry.db'}"
    settings["platform"] = {"auth": {"enabled": True, "refresh_s": REFRESH_S}}    # keys on from the config
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    register_repo(repo)
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("genkeys")
    host, port = local_services.redis_host_port
    repo = _repo(folder, f"{host}:{port}")
    store = project_keys(repo)
    made = {"gen": store.create("gen", ["cube3d_conditioning"], 100, 2 * TINY_TOKENS + 6),
            "other": store.create("other", ["*"], 100, 1000),
            "ranker": store.create("ranker", ["asset_ranking"], 100, 1000),
            "small": store.create("small", ["*"], 100, TINY_TOKENS - 1)}
    with cli_server(repo, "generate-server", "--config", "tiny", ready_path="/ready",
                    log=folder / "generate-server.log", grace_s=30) as running:
        yield Server(running.url, repo, running.log, running.process.pid,
                     {n: (k.key_id, s) for n, (k, s) in made.items()})


def test_generate_without_a_valid_key_is_401(server):
    status, headers, body = _call(server.url + "/generate", {"prompt": "a chair"})
    reply = orjson.loads(body)
    assert status == 401 and reply["code"] == "missing_api_key" and headers["WWW-Authenticate"] == "Bearer"
    status, _, body = _call(server.url + "/generate", {"prompt": "a chair"}, "fk_0000_not-a-key")
    assert status == 401 and orjson.loads(body)["code"] == "invalid_api_key"
    assert _call(server.url + "/health")[0] == 200                # probes stay open


def test_a_key_without_the_conditioning_service_is_403(server):
    status, _, body = _call(server.url + "/generate", {"prompt": "a chair"}, server.keys["ranker"][1])
    reply = orjson.loads(body)
    assert status == 403 and "no access to feature service `cube3d_conditioning`" in reply["error"]


def test_token_budget_429_with_retry_after_jobs_per_key_and_usage(server):
    key_id, secret = server.keys["gen"]                          # 30 tokens per minute: two meshes of 12
    status, _, body = _call(server.url + "/generate", {"prompt": "a wooden chair"}, secret)
    assert status == 200 and body[:4] == b"glTF"
    status, _, body = _call(server.url + "/generate", {"prompt": "a stone lamp", "async": True}, secret)
    assert status == 202
    job = orjson.loads(body)["job_id"]
    assert _call(f"{server.url}/jobs/{job}", key=server.keys["other"][1])[0] == 404     # another key's job
    assert _call(f"{server.url}/jobs/{job}")[0] == 401
    deadline = time.monotonic() + 60
    while (reply := _call(f"{server.url}/jobs/{job}", key=secret))[0] == 202:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert reply[0] == 200 and reply[2][:4] == b"glTF"

    status, headers, body = _call(server.url + "/generate", {"prompt": "a red car"}, secret)
    reply = orjson.loads(body)
    assert status == 429 and reply["code"] == "over_budget"
    assert 1 <= int(headers["Retry-After"]) <= 60
    assert f"key `{key_id}` is over its budget of {2 * TINY_TOKENS + 6} generated shape tokens" in reply["error"]

    status, headers, body = _call(server.url + "/generate", {"prompt": "a cup"}, server.keys["small"][1])
    assert status == 403 and "Retry-After" not in headers and orjson.loads(body)["code"] == "over_key_limit"
    assert "more than key" in orjson.loads(body)["error"] and "--tokens-per-minute" in orjson.loads(body)["error"]

    deadline = time.monotonic() + 10 * REFRESH_S + 10
    while (usage := {r[0]: r[2:] for r in project_keys(server.repo).usage()}).get(key_id) != (2, 2 * TINY_TOKENS, 1):
        assert time.monotonic() < deadline, f"usage not recorded as expected: {usage}"
        time.sleep(0.2)
    shown = featurectl("--repo", str(server.repo), "keys", "usage")
    assert [key_id, "gen", "2", str(2 * TINY_TOKENS), "1"] in [line.split() for line in shown.stdout.splitlines()]


def test_a_job_left_by_a_passed_timeout_s_is_visible_only_to_its_key(server):
    secret = server.keys["other"][1]
    status, _, body = _call(server.url + "/generate", {"prompt": "a blue vase", "timeout_s": 0.001}, secret)
    assert status == 202
    poll = server.url + orjson.loads(body)["poll"]
    assert _call(poll, key=server.keys["small"][1])[0] == 404 and _call(poll)[0] == 401
    deadline = time.monotonic() + 60
    while (reply := _call(poll, key=secret))[0] == 202:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert reply[0] == 200 and reply[2][:4] == b"glTF"


def test_the_generation_server_binds_loopback_and_logs_no_key(server):
    listening = {c.laddr.ip for c in psutil.Process(server.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {"127.0.0.1"}
    log = server.log.read_text()
    for _, secret in server.keys.values():
        assert secret not in log and secret.split("_", 2)[2] not in log
