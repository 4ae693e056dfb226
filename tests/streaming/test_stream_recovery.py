"""Fault tolerance: `featurectl stream` killed with SIGKILL and started again resumes from its latest checkpoint
(state and Kafka offsets), never moves a served value back while it replays, and ends exactly where a run that
never stopped would: every value equal to the oracle, every dead letter written once."""

from __future__ import annotations

import random
import threading
import time

import psutil
import pytest
import redis

from redis_store import layout as redis_layout
from stream_env import (REDIS_PORT, EventLog, StreamProcess, StreamRepo, dead_letters, expected, mismatches, produce,
                        served)
from test_stream_exactness import HOUR, MINUTE, T0, interactions

pytestmark = pytest.mark.integration


class Watch(threading.Thread):
    """Reads some entities' `_ts` and 24 h counts from Redis over and over; both may only grow (no event of the
    log is older than a day, so nothing leaves the 24 h window)."""

    def __init__(self, project: str, view, keys: list[str]):
        super().__init__(daemon=True)
        encoder = redis_layout.KeyEncoder(project, view.entity.join_keys)
        self.keys = [encoder.key([k]) for k in keys]
        self.fields = redis_layout.hash_fields(view.name, ["views_24h"])
        self.stop = threading.Event()
        self.reads = 0
        self.backwards: list = []

    def run(self) -> None:
        client = redis.Redis(port=REDIS_PORT)
        last: dict[bytes, tuple] = {}
        while not self.stop.is_set():
            pipe = client.pipeline(transaction=False)
            for key in self.keys:
                pipe.hmget(key, self.fields)
            for key, (views, ts) in zip(self.keys, pipe.execute()):
                if ts is None:
                    continue
                now = (redis_layout.decode_timestamp_ms(ts), redis_layout.decode_value(views))
                if key in last and (now[0] < last[key][0] or now[1] < last[key][1]):
                    self.backwards.append((key, last[key], now))
                last[key] = now
            self.reads += 1
            time.sleep(0.02)


def jvm_children(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children(recursive=True) if "java" in c.name()]


def test_killed_stream_resumes_from_its_checkpoint_and_ends_exact(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("stream_recovery")
    repo = StreamRepo.create(folder / "repo", ("asset_activity",))
    view = repo.views()[0]
    rng, log = random.Random(9), EventLog()
    parts = []
    for i in range(3):
        sent = len(log.payloads)
        for event in interactions(rng, 2_000, T0 + i * 40 * MINUTE, T0 + (i + 1) * 40 * MINUTE, part=10 + i):
            log.event(event)
            if rng.random() < 0.01:
                log.event({**event, "event_time": event["event_time"] - HOUR})  # late: a dead letter
        parts.append(log.payloads[sent:])
    on_time_after = [len([e for e in log.on_time if e["event_time"] < T0 + (i + 1) * 40 * MINUTE]) for i in range(3)]
    stream = StreamProcess(repo, folder / "stream-1.log", "--checkpoint-interval", "5")
    try:
        stream.wait_running()
        produce(repo.topic, parts[0])
        applied = stream.wait_events({"asset_activity": on_time_after[0]})
        stream.wait(lambda s: (s.get("checkpoint") or {}).get("at", "") > applied["updated_at"],
                    "a checkpoint after the first part")
        watch = Watch(repo.project, view, sorted({e["asset_id"] for e in log.on_time})[:20])
        watch.start()
        produce(repo.topic, parts[1])
        stream.wait_events({"asset_activity": on_time_after[1]})
        jvms = jvm_children(stream.proc.pid)
        assert jvms, "the local Flink cluster should run in a child JVM of `featurectl stream`"
        stream.kill()
        gone, alive = psutil.wait_procs(jvms, timeout=30)
        assert not alive, "the Flink JVM outlived its killed parent"

        produce(repo.topic, parts[2])
        stream = StreamProcess(repo, folder / "stream-2.log")
        status = stream.wait_running()
        assert status["restored_from"] and "/chk-" in status["restored_from"]
        status = stream.wait_events({"asset_activity": len(log.on_time)})
        watch.stop.set()
        watch.join()
        assert watch.reads > 10 and not watch.backwards, watch.backwards[:5]

        keys = sorted({e["asset_id"] for e in log.on_time})
        assert not mismatches(expected(view, log.on_time), served(repo.project, view, keys), view.feature_names)
        letters = dead_letters(repo.topic, len(log.dead))
        assert sorted(d["kafka_offset"] for d in letters) == sorted(log.dead), "dead letters lost or duplicated"
        assert stream.stop() == 0
        assert stream.status()["state"] == "stopped"
    finally:
        stream.stop()
        repo.cleanup()
