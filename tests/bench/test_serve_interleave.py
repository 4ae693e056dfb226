"""`bench serve`'s SDK phase: the PING floor, ours and Feast's calls take turns block by block over the whole run, so
that all three see the same minutes of the host."""

from __future__ import annotations

from bench.serve import _interleaved


def test_calls_take_turns_block_by_block_over_the_same_arguments():
    log: list[tuple[str, int]] = []
    calls = [lambda a, name=name: log.append((name, a)) for name in ("ping", "ours", "peer")]
    samples = _interleaved(calls, list(range(7)), block=3)
    assert [len(s) for s in samples] == [7, 7, 7]
    turns = [name for i, (name, _) in enumerate(log) if i == 0 or log[i - 1][0] != name]
    assert turns == ["ping", "ours", "peer"] * 4  # a warm-up block of each, then the 3 blocks of 7 arguments
    for name in ("ping", "ours", "peer"):
        assert {a for called, a in log if called == name} == set(range(7))
