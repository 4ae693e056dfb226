"""The streaming path under faults and hostile input, against private Redis and Kafka instances: one running
`featurectl stream` and one `featurectl serve` are shared by the module's tests (in file order), each test adding
a later stretch of events to one event log, and each ending with every served value equal to the oracle over the
whole log (nothing lost, nothing counted twice).

SIGKILL of the Flink job itself is covered by tests/streaming/test_stream_recovery.py.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from feature_repo.sample_data import SampleSpec, interaction_columns
from fault_env import PrivateServices, feature_server, http, stream_env, stream_repo, wait_exact

pytestmark = pytest.mark.integration

MINUTE, HOUR = 60_000, 3_600_000
T0 = int(time.time() * 1000) // HOUR * HOUR - 4 * HOUR  # recent, so no reader treats the values as expired
VIEW = "asset_activity"
SPEC = SampleSpec(n_assets=30, n_users=100, seed=17)


class FaultLog(stream_env.EventLog):
    """The streaming suite's event log, plus events too far in the future to count."""

    def future(self, event: dict) -> None:
        self.bad(json.dumps(event).encode(), "future")


@dataclass
class Env:
    folder: Path
    services: PrivateServices
    repo: object
    view: object
    stream: object
    url: str
    log: FaultLog
    rng: random.Random
    stretch: int = 0
    sent: int = 0  # payloads of the log produced so far

    def events(self, n: int) -> list[dict]:
        """`n` ordinary events in the next 20-minute stretch after the previous one, up to 4 s out of order."""
        start = T0 + self.stretch * 20 * MINUTE
        self.stretch += 1
        cols = interaction_columns(SPEC, start, start + 20 * MINUTE, n, self.stretch)
        return [{"asset_id": str(cols["asset_id"][i]), "user_id": str(cols["user_id"][i]),
                 "event_type": str(cols["event_type"][i]), "dwell_ms": abs(int(cols["dwell_ms"][i])),
                 "event_time": max(start, int(cols["event_time"][i]) - self.rng.randint(0, 4_000))}
                for i in range(n)]

    def add(self, events: list[dict]) -> list[bytes]:
        sent = len(self.log.payloads)
        for event in events:
            self.log.event(event)
        return self.log.payloads[sent:]

    def produce(self, payloads: list) -> None:
        stream_env.produce(self.repo.topic, payloads, self.services.bootstrap)
        self.sent += len(payloads)

    def assert_exact(self) -> None:
        """Every event applied once, every served value the oracle's, every dead letter there once."""
        self.stream.wait_events({VIEW: len(self.log.on_time)})
        wrong = wait_exact(self.services.redis_port, self.repo.project, self.view, self.log.on_time)
        assert not wrong, f"{len(wrong)} served values differ from the oracle, e.g. {wrong[:5]}"
        letters = stream_env.dead_letters(self.repo.topic, len(self.log.dead), 90.0, self.services.bootstrap)
        assert {d["kafka_offset"]: d["reason"] for d in letters} == self.log.dead
        assert len(letters) == len(self.log.dead), "a dead letter was written twice"
        for letter in letters:  # the original bytes, never a re-serialization
            assert (letter["payload"], letter["payload_encoding"]) == stream_env.dead_payload(
                self.log.payloads[letter["kafka_offset"]]), letter["kafka_offset"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream_faults")
    services = PrivateServices(folder / "services")
    try:
        services.redis.up()
        with ThreadPoolExecutor(1) as pool:  # Kafka's JVM starts while the repo is applied (that needs only Redis)
            kafka = pool.submit(services.kafka.up)
            repo = stream_repo(folder / "repo", services, (VIEW,))
            kafka.result()
        stream = stream_env.StreamProcess(repo, folder / "stream.log")
        try:
            with feature_server(repo.folder, "--timeout", "0.5") as url:  # starts while the stream's job does
                stream.wait_running()
                env = Env(folder, services, repo, repo.views()[0], stream, url, FaultLog(), random.Random(3))
                env.produce(env.add(env.events(1_500)))
                env.assert_exact()
                yield env
        finally:
            stream.stop()
    finally:
        services.down()


def test_fuzzed_events_are_dead_letters_with_reasons_and_good_events_all_count(env):
    rng, log = env.rng, env.log
    good = env.events(1_000)
    env.add(good[:500])
    template = {**good[499], "event_time": log.max_seen}
    for n in (1, 7, 64, 1_000):
        log.bad(bytes(rng.choice(b"\x00\x01\x7f\x80\xfe\xff abc[]\"'") for _ in range(n)), "malformed_json")
    log.bad(b"\xff\xfe" + json.dumps(template).encode(), "malformed_json")
    log.bad(b"x" * 900_000, "malformed_json")
    log.bad(b'"' * 600_000, "malformed_json")  # twice as long once escaped in its dead letter
    log.bad(b"", "malformed_json")
    for value in (True, [1], {"ms": 1}, "12 s", 12.5, 12.0, "42"):  # strict: never a cast
        log.bad(json.dumps({**template, "dwell_ms": value}).encode(), "wrong_type:dwell_ms")
    for value in (False, [template["event_time"]], "now", float(template["event_time"]), str(template["event_time"])):
        log.bad(json.dumps({**template, "event_time": value}).encode(), "wrong_type:event_time")
    for value in (3, True):
        log.bad(json.dumps({**template, "event_type": value}).encode(), "wrong_type:event_type")
    log.event({**template, "padding": "p" * 900_000})  # huge but valid: it counts
    for ts in (4_102_444_800_000, 10**18, 2**63 - 1):  # 2100, and beyond any calendar
        log.future({**template, "event_time": ts})
    for ts in (0, -1, -(10**15), 86_400_000):  # far in the past: late
        log.event({**template, "event_time": ts})
    env.add(good[500:])
    env.produce(log.payloads[env.sent:])
    env.assert_exact()
    status = env.stream.status()
    reasons = status["dead_letters"]["by_reason"]
    assert reasons["malformed_json"] >= 7 and reasons["future"] == 3 and reasons["late"] >= 4, reasons


class Poller(threading.Thread):
    """Asks the feature server for some entities over and over, recording each status."""

    def __init__(self, url: str, keys: list[str]):
        super().__init__(daemon=True)
        self.url, self.keys = url, keys
        self.statuses: list[tuple[float, int, dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        body = {"features": [f"{VIEW}:views_1h"], "entities": {"asset_id": self.keys}}
        while not self.stop.is_set():
            status, reply = http("POST", self.url + "/get-online-features", body, timeout=3)
            self.statuses.append((time.monotonic(), status, reply))
            time.sleep(0.05)


def test_redis_killed_and_restarted_while_streaming_and_serving(env):
    """Redis comes back empty (no persistence): the entities written before the kill and untouched since must be
    written again, the events of the outage applied once, and the server answers 503 meanwhile, then 200."""
    env.produce(env.add(env.events(1_000)))
    env.stream.wait_events({VIEW: len(env.log.on_time)})
    keys = sorted({e["asset_id"] for e in env.log.on_time})
    poller = Poller(env.url, keys[:5])
    poller.start()
    time.sleep(1)
    env.services.kill(env.services.redis)
    killed = time.monotonic()
    # Written while Redis is away, in the clock's tile: no window slides, so only these three entities change.
    env.produce(env.add([{"asset_id": key, "user_id": f"user_outage_{i}", "event_type": "view", "dwell_ms": i,
                          "event_time": env.log.max_seen} for key in keys[:3] for i in range(20)]))
    time.sleep(3)
    assert http("GET", env.url + "/ready")[0] == 503
    restarting = time.monotonic()
    env.services.redis.up()
    env.assert_exact()
    time.sleep(1)
    poller.stop.set()
    poller.join()
    assert env.stream.proc.poll() is None, "the stream died with Redis"
    down = [(s, r) for t, s, r in poller.statuses if killed + 1.5 < t < restarting]
    assert down and all(s == 503 and r.get("code") == "redis_unavailable" for s, r in down), \
        [s for s, _ in down]
    assert {s for _, s, _ in poller.statuses} <= {200, 503}
    assert poller.statuses[-1][1] == 200 and http("GET", env.url + "/ready")[0] == 200


def test_kafka_broker_restarted_mid_stream(env):
    first = env.add(env.events(3_000))
    env.produce(first)
    env.stream.wait(lambda s: s["views"][VIEW]["events"] > 0, "the job to start on the new events")
    env.services.kill(env.services.kafka)
    time.sleep(3)
    env.services.kafka.up()
    env.produce(env.add(env.events(1_000)))
    env.assert_exact()
    assert env.stream.proc.poll() is None, "the stream died with the broker"
