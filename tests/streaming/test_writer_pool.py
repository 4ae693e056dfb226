"""The writer pool's restart rule, with real processes that die at once: restarted `MAX_RESTARTS` times within
`RESTART_WINDOW_S`, then the stream stops with the last cause; deaths spread over more than the window do not
add up; a writer asked for its figures while the broker is away keeps running. (The stream tests kill a real writer
once and check the values: `test_stream_parallel`.)"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from streaming import writer_pool
from streaming.metrics import StreamMetrics
from streaming.writer_pool import MAX_RESTARTS, WriterError, WriterPool, _Writer


class DyingPool(WriterPool):
    """Each writer process exits with status 3 as soon as it starts."""

    def _spawn(self, index: int) -> _Writer:
        parent, child = self.ctx.Pipe()
        process = self.ctx.Process(target=sys.exit, args=(3,), daemon=True)
        process.start()
        child.close()
        return _Writer(index, process, parent, info={"partitions": ["tiles-0"]})


def _pool() -> DyingPool:
    pool = DyingPool(SimpleNamespace(plan=SimpleNamespace(views=[])), 2, StreamMetrics([], {}))
    pool.writers = [pool._spawn(0), pool._spawn(1)]
    return pool


def _deaths(pool: DyingPool) -> None:
    """Wait until every writer has exited, then let the pool see it."""
    for writer in pool.writers:
        writer.process.join(30)
    pool.check()


def test_a_writer_dying_again_and_again_stops_the_stream_with_its_cause():
    pool = _pool()
    try:
        for restarts in range(1, MAX_RESTARTS + 1):
            _deaths(pool)
            assert [h["restarts"] for h in pool.health()] == [restarts, restarts]
        with pytest.raises(WriterError, match=rf"window writer 0 \(tiles-0\) died {MAX_RESTARTS + 1} times in 10 "
                                              r"minutes, last: exit status 3; the stream stopped"):
            _deaths(pool)
    finally:
        pool.stop(timeout_s=1)


def test_deaths_further_apart_than_the_window_do_not_add_up(monkeypatch):
    clock = [1_000.0]
    monkeypatch.setattr(writer_pool.time, "monotonic", lambda: clock[0])
    pool = _pool()
    try:
        for _ in range(3 * MAX_RESTARTS):
            _deaths(pool)
            clock[0] += writer_pool.RESTART_WINDOW_S / (MAX_RESTARTS - 1) + 1
        assert all(1 <= h["restarts"] <= MAX_RESTARTS - 1 for h in pool.health())
    finally:
        pool.stop(timeout_s=1)


class BrokerAwayWriter:
    """A window writer with nothing to do whose first question to the broker (the tile topics' ends) fails, as
    librdkafka's does while the broker restarts."""

    def __init__(self, *args):
        self.asked = 0

    def tiles_behind(self) -> int:
        self.asked += 1
        if self.asked == 1:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets"))
        return 0

    def load_history(self, history) -> int:
        return 0

    def catch_up(self) -> None:
        pass

    def assignment(self) -> list:
        return []

    def write_all(self) -> None:
        pass

    def step(self) -> None:
        pass

    def held(self) -> dict:
        return {}

    def unwritten(self) -> int:
        return 0

    def close(self) -> None:
        pass


def test_a_report_the_broker_cannot_answer_does_not_kill_the_writer(monkeypatch):
    """A broker restart used to end the writer (and each outage counted towards stopping the stream): now that
    report is skipped, the stream's process sees a writer that did not answer, and the next report comes back."""
    monkeypatch.setattr(writer_pool, "WindowWriter", BrokerAwayWriter)
    monkeypatch.setattr(writer_pool, "RedisSink", lambda *args: None)
    monkeypatch.setattr(writer_pool, "SharedClock", lambda *args: None)
    monkeypatch.setattr(writer_pool.signal, "signal", lambda *args: None)  # a thread here, not a process
    spec = SimpleNamespace(plan=SimpleNamespace(views=[]), settings=None, redis=None, project="p", key_ttl_s=1,
                           history=None)
    parent, child = multiprocessing.Pipe()
    writer = threading.Thread(target=writer_pool.writer_main, args=(spec, 0, 1, None, child), daemon=True)
    writer.start()

    def reply() -> tuple:
        assert parent.poll(10), "the writer did not answer"
        return parent.recv()

    try:
        assert reply()[0] == "read"
        parent.send("write")
        assert reply()[0] == "ready"
        parent.send("report")
        parent.send("report")
        kind, report = reply()
        assert kind == "report" and report["tiles_behind"] == 0, (kind, report)
    finally:
        parent.send("stop")
        writer.join(10)
    assert not writer.is_alive()
