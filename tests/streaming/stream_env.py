"""What the streaming integration tests share: a throwaway feature repo on its own Kafka topic and project,
`featurectl stream` as a real subprocess, an event log with its expected fate, and readers of served values.

Every test module gets a unique project and topic, and removes its topics, Redis keys and state when done, so
suites can run side by side against the same local services.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import window_oracle
from cli_helpers import ROOT
from dsl import load_repo
from dsl.feature_view import FeatureView
from feature_repo.sample_data import SampleSpec, interaction_columns
from redis_store import layout as redis_layout
from redis_store.freshness import record_key
from redis_store.freshness_history import history_key
from streaming.status import read_statuses

BOOTSTRAP = "127.0.0.1:19092"
REDIS_PORT = 16379
LATENESS_MS = 35_000  # the example source: watermark_delay 5s + allowed_lateness 30s
COLUMNS = ("asset_id", "user_id", "event_type", "dwell_ms", "event_time")  # the example source's schema

FEATURE_STORE_YAML = """\
project: {project}
provider: local
registry:
  registry_type: sql
  path: sqlite:///{folder}/registry.db
online_store:
  type: redis
  connection_string: "127.0.0.1:{redis_port}"
offline_store:
  type: batch.feast_offline_store.FeaturectlOfflineStore
entity_key_serialization_version: 3
platform:
  state_dir: {folder}/state
  data_dir: {folder}/data
  kafka:
    bootstrap_servers: "{bootstrap}"
"""

FEATURES_PY = """\
import dataclasses

from feature_repo import features as example

interactions = dataclasses.replace(example.interactions, kafka_topic={topic!r})
{views}
"""


@dataclass
class StreamRepo:
    folder: Path
    project: str
    topic: str

    @classmethod
    def create(cls, folder: Path, views: tuple[str, ...], redis_port: int = REDIS_PORT, bootstrap: str = BOOTSTRAP,
               name: str = "stream_test") -> "StreamRepo":
        """The example views on a topic of their own, against the Redis and Kafka given (the shared ones by default)."""
        suffix = uuid.uuid4().hex[:8]
        repo = cls(folder, f"{name}_{suffix}", f"{name.replace('_', '-')}-{suffix}")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "feature_store.yaml").write_text(FEATURE_STORE_YAML.format(
            project=repo.project, folder=folder, redis_port=redis_port, bootstrap=bootstrap))
        lines = "\n".join(f"{v} = dataclasses.replace(example.{v}, source=interactions)" for v in views)
        (folder / "features.py").write_text(FEATURES_PY.format(topic=repo.topic, views=lines))
        return repo

    def views(self) -> list[FeatureView]:
        return load_repo(self.folder).views

    def cleanup(self) -> None:
        """Delete the topics of this project's streams and its Redis keys."""
        topics, groups = [self.topic, f"{self.topic}.dead-letters"], []
        for _, status in read_statuses(self.folder / "state"):
            topics += status.get("topics", {}).get("tiles", [])
            groups += status.get("consumer_groups", [])
        admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
        futures = list(admin.delete_topics(list(set(topics)), operation_timeout=30).values())
        if groups:
            futures += list(admin.delete_consumer_groups(list(set(groups)), request_timeout=30).values())
        for future in futures:
            try:
                future.result()
            except Exception:  # a topic or group this test never created
                pass
        client = redis.Redis(port=REDIS_PORT)
        for key in client.scan_iter(match=b"*" + self.project.encode(), count=10_000):
            client.delete(key)
        client.delete(record_key(self.project), history_key(self.project))


@contextlib.contextmanager
def module_env(repo: StreamRepo, env: dict) -> Iterator[dict]:
    """A test module's shared `env`; after it, the stream a test started (`env["stream"]`) is stopped and the repo
    cleaned up."""
    try:
        yield env
    finally:
        if "stream" in env:
            env["stream"].stop()
        repo.cleanup()


class StreamProcess:
    """`featurectl stream` in its own session, so that SIGINT and SIGKILL reach it and nothing else."""

    def __init__(self, repo: StreamRepo, log: Path, *args: str):
        self.repo = repo
        self.log = log
        argv = [sys.executable, "-m", "featurectl", "--repo", str(repo.folder), "stream", "--checkpoint-interval",
                "2", "--mini-batch-latency", "200", *args]
        with log.open("a") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def status(self) -> dict:
        found = read_statuses(self.repo.folder / "state")
        return found[0][1] if found else {}

    def wait(self, ready: Callable[[dict], bool], what: str, timeout_s: float = 180.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if status.get("pid") == self.proc.pid and ready(status):
                return status
            if self.proc.poll() is not None:
                raise AssertionError(f"featurectl stream exited ({self.proc.returncode}) while waiting for {what}:\n"
                                     + self.log.read_text()[-3000:])
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; status: {self.status()}\n"
                             + self.log.read_text()[-3000:])

    def wait_running(self) -> dict:
        return self.wait(lambda s: s.get("state") == "running" and s.get("flink_status") == "RUNNING",
                         "the Flink job to run")

    def wait_events(self, counts: dict[str, int]) -> dict:
        """Until each view has applied exactly `counts` events (its on-time events so far)."""
        def done(status: dict) -> bool:
            return all(status["views"][v]["events"] == n for v, n in counts.items())
        return self.wait(done, f"events applied {counts}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=120)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@dataclass
class EventLog:
    """Payloads in produce order (offsets 0, 1, ...), and what should become of each one."""

    payloads: list[Optional[bytes]] = field(default_factory=list)
    on_time: list[dict] = field(default_factory=list)
    dead: dict[int, str] = field(default_factory=dict)  # offset -> reason
    _max_seen: Optional[int] = None

    def event(self, event: dict) -> None:
        """A valid event: on time unless more than the lateness behind the greatest valid event time before it."""
        ts = event["event_time"]
        if self._max_seen is not None and ts < self._max_seen - LATENESS_MS:
            self.dead[len(self.payloads)] = "late"
        else:
            self.on_time.append({c: event.get(c) for c in COLUMNS})  # absent fields are NULL
        self._max_seen = ts if self._max_seen is None else max(self._max_seen, ts)
        self.payloads.append(json.dumps(event).encode())

    @property
    def max_seen(self) -> Optional[int]:
        return self._max_seen

    def bad(self, payload: Optional[bytes], reason: str) -> None:
        self.dead[len(self.payloads)] = reason
        self.payloads.append(payload)


def produce(topic: str, payloads: list[Optional[bytes]], bootstrap: str = BOOTSTRAP) -> None:
    """Into partition 0, in order: a payload's offset is then its index in the `EventLog`, however many partitions
    the topic has (a stream at parallelism N creates N)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 2_000_000})
    for payload in payloads:
        producer.produce(topic, value=payload, partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0, "could not deliver the test events to Kafka"


def dead_letters(topic: str, expected: int, timeout_s: float = 60.0, bootstrap: str = BOOTSTRAP) -> list[dict]:
    """The committed dead letters of a source topic: waits until `expected` are there, then one second more (for
    any that should not be)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    partitions = consumer.list_topics(f"{topic}.dead-letters", timeout=10).topics[f"{topic}.dead-letters"].partitions
    consumer.assign([TopicPartition(f"{topic}.dead-letters", p, 0) for p in partitions])
    out: list[dict] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            out += [json.loads(m.value()) for m in consumer.consume(1000, 0.5) if not m.error()]
        out += [json.loads(m.value()) for m in consumer.consume(1000, 1.0) if not m.error()]
    finally:
        consumer.close()
    return out


def dead_payload(payload: Optional[bytes], limit: int = 16_384) -> tuple[Optional[str], Optional[str]]:
    """(payload, payload_encoding) of a dead letter, as the README states them: the payload's first `limit` bytes
    (less a character the cut would split) as text when they are UTF-8, else its first `limit` bytes in base64."""
    if payload is None:
        return None, None
    cut = limit
    while len(payload) > limit and cut > limit - 3 and payload[cut] & 0xC0 == 0x80:
        cut -= 1
    try:
        return payload[:cut].decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(payload[:limit]).decode(), "base64"


def served(project: str, view: FeatureView, keys: list[str], redis_port: int = REDIS_PORT) -> dict[str, dict[str, Any]]:
    """Values in Redis per entity (join key value), decoded with the layout module, plus `_ts` in ms."""
    client = redis.Redis(port=redis_port)
    encoder = redis_layout.KeyEncoder(project, view.entity.join_keys)
    names = view.feature_names
    fields = redis_layout.hash_fields(view.name, names)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(encoder.key([key]), fields)
    out = {}
    for key, raw in zip(keys, pipe.execute()):
        values = {n: redis_layout.decode_value(v) for n, v in zip(names, raw[:-1])}
        values["_ts"] = redis_layout.decode_timestamp_ms(raw[-1])
        out[key] = values
    return out


def boundary(view: FeatureView, events: list[dict]) -> int:
    """Where the served values stand: the end of the tile of the greatest on-time event time."""
    tile = window_oracle.tile_ms(view)
    return max(e["event_time"] for e in events) // tile * tile + tile


def expected(view: FeatureView, events: list[dict]) -> dict[str, dict[str, Any]]:
    """The oracle: every entity's values at the boundary, from the on-time events themselves."""
    b = boundary(view, events)
    return {k[0]: window_oracle.values_at(view, rows, b) for k, rows in window_oracle.by_entity(view, events).items()}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9)
    return a == b


def mismatches(want: dict[str, dict], got: dict[str, dict], names: list[str]) -> list:
    return [(k, n, want[k][n], got.get(k, {}).get(n)) for k in want for n in names
            if not same(want[k][n], got.get(k, {}).get(n))]


def sample_events(spec: SampleSpec, n: int, start: int, end: int, part: int, null_dwell: bool = False) -> list[dict]:
    """`n` of the example's interactions in [start, end), in time order; a sampled negative `dwell_ms` is left out
    of its event, or sent as NULL with `null_dwell` (both mean no value for the views)."""
    cols = interaction_columns(spec, start, end, n, part)
    out = [{c: (int(cols[c][i]) if c in ("dwell_ms", "event_time") else str(cols[c][i])) for c in COLUMNS}
           for i in range(n)]
    for event in out:
        if event["dwell_ms"] < 0:
            if null_dwell:
                event["dwell_ms"] = None
            else:
                del event["dwell_ms"]
    return sorted(out, key=lambda e: e["event_time"])

