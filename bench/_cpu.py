"""CPU time of what a benchmark drives, so that figures come with their per-core cost: a process with its
children (server workers), and redis-servers (`INFO cpu`, which counts the server's own threads)."""

from __future__ import annotations

from typing import Iterable


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its children."""
    import psutil

    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def redis_cpu_s(addresses: Iterable[tuple[str, int]]) -> float:
    """User + system CPU seconds the redis-servers at `addresses` have used since they started."""
    import redis

    total = 0.0
    for host, port in addresses:
        info = redis.Redis(host, port).info("cpu")
        total += info["used_cpu_user"] + info["used_cpu_sys"]
    return total
