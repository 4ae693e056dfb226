"""The writer pool's restart rule, with real processes that die at once: restarted `MAX_RESTARTS` times within
`RESTART_WINDOW_S`, then the stream stops with the last cause; deaths spread over more than the window do not
add up. (The stream tests kill a real writer once and check the values: `test_stream_parallel`.)"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

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
