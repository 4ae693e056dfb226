"""What a Milvus server says of the searches it answered, read from its Prometheus metrics before and after a run.

Beside the client's own timing this separates the time spent inside Milvus from the rest (our process, the
transport, the host). Milvus 2.3 times its proxy's part of a search (`milvus_proxy_sq_latency`: from the proxy's
`Search` call to its answer, so queueing, the query node's search and the reduce) in whole milliseconds, truncated,
into buckets 1, 2, 4, 8, ...: a search above the bucket `le="1"` took 2 ms or more, exactly, and a percentile is
known only to lie in one bucket, `[low, high)` ms. The server counts every client's searches: the figures are ours
alone only on a server that nobody else searches meanwhile (`featurectl bench search`'s own).
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass

SEARCH_LATENCY = "milvus_proxy_sq_latency"
PROCESS_CPU = "process_cpu_seconds_total"
GOAL_MS = 2  # the search goal's p99 (issue 18); GOAL_MS - 1 is a bucket edge: searches over it count exactly


@dataclass(frozen=True)
class ServerSnapshot:
    searches_at_most: dict[float, float]  # bucket edge (whole ms) -> searches timed at or below it, cumulative
    cpu_s: float  # the server process's CPU time so far


def snapshot(url: str, timeout_s: float = 5.0) -> ServerSnapshot:
    """The server's search-latency histogram and CPU time now, from its metrics endpoint `url`."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        text = answer.read().decode()
    buckets: dict[float, float] = {}
    cpu_s = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{SEARCH_LATENCY}_bucket" and sample.labels.get("query_type") == "search":
                edge = float(sample.labels["le"])
                buckets[edge] = buckets.get(edge, 0.0) + sample.value
            elif sample.name == PROCESS_CPU:
                cpu_s = sample.value
    return ServerSnapshot(buckets, cpu_s)


def server_figures(before: ServerSnapshot, after: ServerSnapshot) -> dict:
    """The searches between two snapshots: how many, the share the server itself took `GOAL_MS` or more on, the
    bucket its p99 lies in and the server's CPU per search (its background work included); empty if none."""
    counts = {edge: after.searches_at_most[edge] - before.searches_at_most.get(edge, 0.0)
              for edge in sorted(after.searches_at_most)}
    total = counts.get(math.inf, 0.0)
    if not total:
        return {}
    return {"server_searches": int(total),
            f"server_over_{GOAL_MS}ms_pct": round(100 * (total - counts[float(GOAL_MS - 1)]) / total, 2),
            "server_p99_ms": _bucket_of(counts, 0.99 * total),
            "server_cpu_ms_per_search": round(1000 * (after.cpu_s - before.cpu_s) / total, 3)}


def _bucket_of(counts: dict[float, float], rank: float) -> list:
    """`[low, high)` in ms of the search at `rank`: a bucket edge `e` holds whole milliseconds up to `e`, that is
    times below `e + 1` ms; `high` is None past the last edge."""
    low = 0.0
    for edge, at_most in counts.items():
        if at_most >= rank:
            return [low, None if math.isinf(edge) else edge + 1]
        low = edge + 1
    return [low, None]
