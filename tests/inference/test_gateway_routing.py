"""`featurectl gateway` routing against real HTTP replica processes (`bench._replica`: generate-server's API on
the servers' HTTP protocol, without the model, with an injected delay), so that three replicas, a slow one and a
killed one fit this 2-core host: traffic leaves the slow and the killed replica with no idempotent request
failing, jobs route back to their replica, a non-idempotent request is never run twice, and an ejected replica
comes back once its health probe passes. `test_gateway_keys.py` runs the gateway in front of real generate-servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import math
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import orjson
import pytest

from cli_helpers import ROOT, cli_server
from featurectl.services.scratch_redis import free_port, stop_process
from serving.routing.app import GatewayApp, _replica_wait_s, _with_gateway_job_id
from serving.routing.replica import Replica, RoutingSettings
from serving.routing.router import Router
from serving.routing.upstream import Answer as ReplicaAnswer, ReplicaClient

FAST_MS, SLOW_MS = 2, 200


@dataclass
class FakeReplica:
    url: str
    port: int
    process: subprocess.Popen


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return orjson.loads(reply.read())


def _post(url: str, body: dict) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=orjson.dumps(body), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def _start_replica(name: str, port: int, delay_ms: float = FAST_MS) -> FakeReplica:
    process = subprocess.Popen([sys.executable, "-m", "bench._replica", "--port", str(port), "--delay-ms",
                                str(delay_ms), "--name", name], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            _get(url + "/ready")
            return FakeReplica(url, port, process)
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica {name} did not start") from None
            time.sleep(0.1)


@contextlib.contextmanager
def _replicas(count: int = 3) -> Iterator[list[FakeReplica]]:
    started: list[FakeReplica] = []
    try:
        for i in range(count):
            started.append(_start_replica(f"r{i}", free_port()))
        yield started
    finally:
        for replica in started:
            stop_process(replica.process, 5)


@pytest.fixture
def replicas():
    with _replicas() as started:
        yield started


@pytest.fixture
def gateway(replicas, tmp_path):
    args = [arg for r in replicas for arg in ("--replica", r.url)]
    with cli_server(ROOT / "feature_repo", "gateway", *args, "--no-require-api-key", ready_path="/ready",
                    log=tmp_path / "gateway.log", grace_s=5) as running:
        yield running


class Answer(NamedTuple):
    at: float
    status: int
    replica: str


class Traffic:
    """`clients` threads sending idempotent `POST /generate` (each with an X-Request-ID) one after another on
    keep-alive connections until stopped; every answer kept with its time and replica tag."""

    def __init__(self, url: str, clients: int = 4):
        self.port = int(url.rsplit(":", 1)[1])
        self.answers: list[Answer] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]

    def _client(self, index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        n = 0
        while not self.stop.is_set():
            n += 1
            conn.request("POST", "/generate", b'{"prompt": "a chair"}', {"X-Request-ID": f"c{index}-{n}"})
            reply = conn.getresponse()
            reply.read()
            self.answers.append(Answer(time.monotonic(), reply.status, reply.getheader("x-replica", "")))
        conn.close()

    def served(self, tag: str, since: float = 0.0) -> int:
        return sum(a.replica == tag for a in self.answers if a.at >= since)

    def __enter__(self) -> "Traffic":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def _wait_for(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


def test_traffic_leaves_a_slow_and_a_killed_replica_and_no_idempotent_request_fails(replicas, gateway):
    tags = [r["tag"] for r in _get(gateway.url + "/stats")["replicas"]]
    fast, slow, killed = tags
    with Traffic(gateway.url) as traffic:
        _wait_for(lambda: all(traffic.served(tag) >= 20 for tag in tags))
        _post(replicas[1].url + "/delay", {"ms": SLOW_MS})
        replicas[2].process.kill()
        changed = time.monotonic()
        time.sleep(8)
    assert {a.status for a in traffic.answers} == {200}, "an idempotent request failed"
    settled = changed + 3                                   # traffic has moved away within seconds
    late = [a for a in traffic.answers if a.at >= settled]
    assert len(late) > 100 and traffic.served(killed, settled) == 0
    assert traffic.served(slow, settled) / len(late) <= 0.05
    stats = {r["tag"]: r for r in _get(gateway.url + "/stats")["replicas"]}
    assert stats[killed]["ejected"] and stats[killed]["errors"]["connect"] + stats[killed]["errors"]["broken"] >= 1
    assert stats[slow]["ewma_ms"] > 10 * stats[fast]["ewma_ms"]
    metrics = urllib.request.urlopen(gateway.url + "/metrics", timeout=5).read().decode()
    assert f'gateway_replica_ejected{{replica="{replicas[2].url}"}} 1.0' in metrics
    assert f'gateway_replica_requests_total{{replica="{replicas[0].url}"}}' in metrics


def test_a_job_id_routes_back_to_the_replica_that_runs_it(replicas, gateway):
    for replica in replicas:
        _post(replica.url + "/delay", {"ms": 300})
    jobs = {}
    for _ in range(12):
        status, headers, body = _post(gateway.url + "/generate", {"prompt": "a chair", "async": True})
        job = orjson.loads(body)
        assert status == 202 and job["poll"] == f"/jobs/{job['job_id']}" == headers["location"]
        jobs[job["job_id"]] = headers["x-replica"]
    assert len(set(jobs.values())) >= 2 and all(job.startswith(tag + "-") for job, tag in jobs.items())
    names = {r["tag"]: f"r{i}".encode() for i, r in enumerate(_get(gateway.url + "/stats")["replicas"])}
    for job, tag in jobs.items():
        _wait_for(lambda: urllib.request.urlopen(f"{gateway.url}/jobs/{job}", timeout=5).status == 200)
        with urllib.request.urlopen(f"{gateway.url}/jobs/{job}", timeout=5) as reply:
            assert reply.read() == b"glTF " + names[tag] and reply.headers["x-replica"] == tag
    assert _post(gateway.url + "/generate", {"prompt": "x"})[0] == 200
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(f"{gateway.url}/jobs/ffffff-0", timeout=5)
    assert unknown.value.code == 404


def _route(urls: list[str], idempotent: bool, during=None, **settings):
    """One `POST /generate` through a round-robin router (the first URL first); `during(router)` runs while the
    request is in flight."""
    async def run():
        router = Router(urls, RoutingSettings(balance="round-robin", **settings))
        request = asyncio.ensure_future(router.forward("POST", "/generate", b'{"prompt": "a"}', b"", idempotent))
        if during is not None:
            await asyncio.sleep(0.3)
            during()
        answer, replica = await request
        router.close()
        return answer, replica, router

    return asyncio.run(run())


def test_polls_of_a_failed_job_leave_its_replica_in_rotation():
    """A job that failed answers its polls with 500 `generation_failed`: the job's outcome, not the replica's
    health (three such answers in a row used to eject a healthy replica)."""
    async def run(url: str) -> tuple[list[int], bool, int]:
        router = Router([url], RoutingSettings(failures_to_eject=2))
        app = GatewayApp(router)
        try:
            status, body, _, _ = await app.respond("POST", "/generate", b'{"prompt": "a", "async": true}')
            assert status == 202
            await asyncio.sleep(0.1)                                     # past the job's 20 ms
            polls = [(await app.respond("GET", orjson.loads(body)["poll"], b""))[0] for _ in range(4)]
            return polls, router.replicas[0].in_rotation, router.replicas[0].errors["5xx"]
        finally:
            router.close()

    with _replicas(1) as (replica,):
        _post(replica.url + "/delay", {"ms": 20})
        _post(replica.url + "/fail", {"jobs": True})
        polls, in_rotation, errors = asyncio.run(run(replica.url))
    assert polls == [500] * 4 and in_rotation and errors == 0


def test_a_request_that_asks_to_wait_longer_than_the_gateway_timeout_gets_its_mesh():
    """The body's `timeout_s` (plus 10 s) extends how long the gateway waits for the replica when it is longer than
    `--timeout`: a slow mesh the request asked to wait for is answered, and its replica stays in rotation."""
    async def run(url: str) -> tuple[tuple, bool, tuple]:
        router = Router([url], RoutingSettings(timeout_s=0.3))
        app = GatewayApp(router)
        try:
            asked = await app.respond("POST", "/generate", b'{"prompt": "a", "timeout_s": 5}')
            in_rotation = router.replicas[0].in_rotation
            plain = await app.respond("POST", "/generate", b'{"prompt": "a"}')
            return asked, in_rotation, plain
        finally:
            router.close()

    with _replicas(1) as (replica,):
        _post(replica.url + "/delay", {"ms": 800})
        asked, in_rotation, plain = asyncio.run(run(replica.url))
    assert asked[:2] == (200, b"glTF r0") and in_rotation
    assert plain[0] == 502 and b"replica_failed" in plain[1]                 # past --timeout, not retried


@pytest.mark.parametrize("body, wait_s", [(b'{"prompt": "a"}', 90.0), (b'{"prompt": "a", "timeout_s": 30}', 90.0),
                                          (b'{"prompt": "a", "timeout_s": 300}', 310.0),
                                          (b'{"prompt": "a", "timeout_s": 1e9}', 3610.0),
                                          (b'{"prompt": "a", "timeout_s": true}', 90.0),
                                          (b'{"prompt": "a", "timeout_s": "600"}', 90.0), (b"[1]", 90.0),
                                          (b"not json", 90.0)])
def test_the_replica_wait_follows_the_request_timeout(body, wait_s):
    assert _replica_wait_s(body, 90.0) == wait_s


def test_a_request_never_sent_goes_elsewhere_even_when_not_idempotent():
    with _replicas(1) as (alive,):
        answer, replica, router = _route([f"http://127.0.0.1:{free_port()}", alive.url], idempotent=False)
    assert answer.status == 200 and answer.body == b"glTF r0" and replica.url == alive.url
    assert router.retries == 1 and not router.replicas[0].in_rotation
    assert router.replicas[0].errors["connect"] == 1


@pytest.mark.parametrize("status, retried_when_not_idempotent", [(503, True), (429, True), (500, False)])
def test_a_failing_answer_is_retried_elsewhere_only_when_the_request_was_not_run_or_is_idempotent(
        status, retried_when_not_idempotent):
    with _replicas(2) as (failing, alive):
        _post(failing.url + "/fail", {"status": status})
        for idempotent in (False, True):
            answer, replica, router = _route([failing.url, alive.url], idempotent)
            retried = idempotent or retried_when_not_idempotent
            assert (answer.status, replica.url, router.retries) == ((200, alive.url, 1) if retried
                                                                    else (status, failing.url, 0))
        assert _get(alive.url + "/count")["generated"] == 1 + retried_when_not_idempotent
    assert router.replicas[0].errors["5xx"] == (status >= 500)
    assert router.replicas[0].in_rotation == (status != 503)         # a 503 ejects at once; one 500 does not


def test_a_request_the_replica_may_have_started_is_retried_only_when_idempotent():
    with _replicas(2) as (dying, alive):
        _post(dying.url + "/delay", {"ms": 3000})
        answer, _, router = _route([dying.url, alive.url], idempotent=False, during=dying.process.kill)
        assert _get(alive.url + "/count")["generated"] == 0              # not run again elsewhere
    assert answer.status == 502 and b"replica_failed" in answer.body and b"X-Request-ID" in answer.body
    assert router.retries == 0 and router.replicas[0].errors["broken"] == 1

    with _replicas(2) as (dying, alive):
        _post(dying.url + "/delay", {"ms": 3000})
        answer, replica, router = _route([dying.url, alive.url], idempotent=True, during=dying.process.kill)
        assert _get(alive.url + "/count")["generated"] == 1
    assert answer.status == 200 and replica.url == alive.url and router.retries == 1


def test_an_ejected_replica_comes_back_when_its_probe_passes():
    async def run(replica: FakeReplica, port: int) -> list[bool]:
        router = Router([replica.url], RoutingSettings(eject_s=0.2, max_eject_s=0.4))
        seen = []
        await router.probe()
        seen.append(router.replicas[0].in_rotation)
        stop_process(replica.process, 5)
        await router.probe()
        seen.append(router.replicas[0].in_rotation)
        back = _start_replica("again", port)
        try:
            await asyncio.sleep(0.5)                        # past the back-off
            await router.probe()
            seen.append(router.replicas[0].in_rotation)
        finally:
            stop_process(back.process, 5)
            router.close()
        return seen

    with _replicas(1) as (replica,):
        assert asyncio.run(run(replica, replica.port)) == [True, False, True]


def test_requests_to_a_replica_reuse_one_keep_alive_connection():
    async def run(url: str) -> set[int]:
        router = Router([url])
        client = router.replicas[0].client
        used = set()
        for _ in range(5):
            answer = await router.send(router.replicas[0], "POST", "/generate", b'{"prompt": "a"}')
            assert answer.status == 200
            used.add(id(client.idle[-1]))
        router.close()
        return used

    with _replicas(1) as (replica,):
        assert len(asyncio.run(run(replica.url))) == 1


def test_a_replica_costs_its_faded_latency_estimate_times_its_queue():
    replica = Replica("http://127.0.0.1:1", ReplicaClient("127.0.0.1", 1), RoutingSettings(alpha=0.5, decay_s=2.0))
    assert replica.cost(0.0) == 0.0
    replica.in_flight = 1
    assert replica.cost(0.0) == math.inf                    # not measured yet: one request at a time
    replica.observe(0.010, now=100.0)
    assert replica.cost(100.0) == pytest.approx(0.020)      # 10 ms x (1 in flight + 1)
    replica.in_flight = 0
    assert replica.cost(102.0) == pytest.approx(0.010 * math.exp(-1))      # unused for one decay_s
    replica.observe(0.002, now=102.0)
    assert replica.ewma_s == pytest.approx(0.006) and replica.cost(102.0) == pytest.approx(0.006)


def test_an_interim_1xx_answer_is_skipped_for_the_replicas_final_answer():
    async def run() -> ReplicaAnswer:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 100 Continue\r\nx-interim: 1\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\ncontent-type: model/gltf-binary\r\ncontent-length: 4\r\n\r\nglTF")
            await writer.drain()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        client = ReplicaClient("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            return await client.request("POST", "/generate", b'{"prompt": "a"}', timeout_s=5)
        finally:
            client.close()
            server.close()

    answer = asyncio.run(run())
    assert (answer.status, answer.body, answer.content_type, answer.headers) == (200, b"glTF", b"model/gltf-binary", [])


def test_a_replica_job_id_that_is_no_url_safe_string_is_not_put_in_a_header():
    replica = Replica("http://127.0.0.1:1", ReplicaClient("127.0.0.1", 1), RoutingSettings())
    for job_id in ("abc\r\nset-cookie: pwned=1", "../ready", ["x"], 7, ""):
        answer = ReplicaAnswer(202, orjson.dumps({"job_id": job_id}), b"application/json", [(b"location", b"/jobs/x")])
        assert _with_gateway_job_id(answer, replica) == (answer, None)
    answer = ReplicaAnswer(202, b'{"job_id": "0f3a", "status": "queued"}', b"application/json",
                           [(b"location", b"/jobs/0f3a")])
    changed, job_id = _with_gateway_job_id(answer, replica)
    assert job_id == f"{replica.tag}-0f3a" and changed.headers == [(b"location", f"/jobs/{job_id}".encode())]
    assert orjson.loads(changed.body) == {"job_id": job_id, "status": "queued", "poll": f"/jobs/{job_id}"}
