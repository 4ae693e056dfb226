"""What a Milvus server's metrics say of the searches between two snapshots: Milvus observes whole milliseconds,
truncated, so a bucket edge `e` holds times below `e + 1` ms (the search-server tests read a real server's)."""

from __future__ import annotations

import math

from bench._milvus_metrics import ServerSnapshot, server_figures


def snapshot_of(counts: dict[float, float], cpu_s: float) -> ServerSnapshot:
    return ServerSnapshot({edge: float(count) for edge, count in counts.items()}, cpu_s)


def test_figures_of_the_searches_between_two_snapshots():
    before = snapshot_of({1: 500, 2: 500, 4: 500, 8: 500, math.inf: 500}, 10.0)
    after = snapshot_of({1: 590, 2: 598, 4: 599, 8: 600, math.inf: 600}, 10.2)
    assert server_figures(before, after) == {"server_searches": 100, "server_over_2ms_pct": 10.0,
                                             "server_p99_ms": [3.0, 5.0], "server_cpu_ms_per_search": 2.0}


def test_p99_in_the_first_bucket_starts_at_zero_and_past_the_last_edge_has_no_end():
    few_slow = snapshot_of({1: 100, 2: 100, math.inf: 100}, 1.0)
    assert server_figures(snapshot_of({}, 0.0), few_slow)["server_p99_ms"] == [0.0, 2.0]
    all_slow = snapshot_of({1: 0, 2: 0, math.inf: 10}, 1.0)
    assert server_figures(snapshot_of({}, 0.0), all_slow)["server_p99_ms"] == [3.0, None]


def test_no_searches_between_the_snapshots_give_no_figures():
    same = snapshot_of({1: 7, math.inf: 7}, 3.0)
    assert server_figures(same, same) == {}
