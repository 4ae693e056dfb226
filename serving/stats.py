"""Latency accounting in fixed memory: HDR-style log-linear histograms, per endpoint and per feature service.

A value v (microseconds) lands in bucket `shift * 64 + (v >> shift)`, shift = max(0, bit_length(v) - 7): exact
below 128 us, then 64 buckets per power of two (relative error under 1.6 %), up to 2^36 us (19 h) in 2,048
counters. Recording is a few integer operations; percentiles walk the counts. With several server workers each
writes its counters to a file now and then and any worker merges them all when asked.
"""

from __future__ import annotations

import json
import os
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from serving.served_rows import ServedRows

_SUB_BITS = 7
_HALF = 1 << (_SUB_BITS - 1)
_MAX_SHIFT = 36 - _SUB_BITS + 1
BUCKETS = (_MAX_SHIFT + 1) * _HALF + _HALF
_MAX_US = (1 << 36) - 1
POINTS = (50.0, 90.0, 99.0, 99.9)


def bucket_of(us: int) -> int:
    if us < 0:
        us = 0
    elif us > _MAX_US:
        us = _MAX_US
    shift = us.bit_length() - _SUB_BITS
    if shift <= 0:
        return us
    return (shift << (_SUB_BITS - 1)) + (us >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """Lowest and highest microsecond value that land in bucket `index`."""
    shift = max(0, index // _HALF - 1)
    low = (index - shift * _HALF) << shift
    return low, low + (1 << shift) - 1


class LatencyHistogram:
    """Counts of latencies in log-linear buckets; fixed memory whatever the number of samples."""

    __slots__ = ("counts", "total", "sum_us", "max_us")

    def __init__(self) -> None:
        self.counts = array("q", bytes(8 * BUCKETS))
        self.total = 0
        self.sum_us = 0
        self.max_us = 0

    def record_ns(self, ns: int) -> None:
        us = ns // 1000
        self.add(us, bucket_of(us))

    def add(self, us: int, bucket: int) -> None:
        """Count `us`, whose bucket (`bucket_of(us)`) the caller knows: one reckoning for several histograms."""
        self.counts[bucket] += 1
        self.total += 1
        self.sum_us += us
        if us > self.max_us:
            self.max_us = us

    def percentile_us(self, p: float) -> int:
        """HDR's `valueAtPercentile`: the highest value of the bucket holding the p-th percentile sample."""
        if not self.total:
            return 0
        rank = max(1, -(-self.total * p // 100))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(bucket_bounds(index)[1], self.max_us)
        return self.max_us

    def percentiles_ms(self, points: Iterable[float] = POINTS) -> dict[str, float]:
        return {f"p{p:g}": round(self.percentile_us(p) / 1000, 3) for p in points}

    def count_below_us(self, bound_us: int) -> int:
        """Samples under `bound_us`; exact when `bound_us` is a bucket edge (every power of two is)."""
        return sum(self.counts[:bucket_of(bound_us)])

    def merge(self, other: "LatencyHistogram") -> None:
        for index, count in enumerate(other.counts):
            if count:
                self.counts[index] += count
        self.total += other.total
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)

    def to_json(self) -> dict[str, Any]:
        nonzero = {i: c for i, c in enumerate(self.counts) if c}
        return {"counts": nonzero, "total": self.total, "sum_us": self.sum_us, "max_us": self.max_us}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LatencyHistogram":
        hist = cls()
        for index, count in data["counts"].items():
            hist.counts[int(index)] = count
        hist.total, hist.sum_us, hist.max_us = data["total"], data["sum_us"], data["max_us"]
        return hist


@dataclass
class FeatureLogCounts:
    """Rows (one per entity of a logged request) of one feature service: `logged` queued for writing, `dropped`
    because the queue was full, `written` to Parquet, `failed` lost to a conversion or write error; and the
    files and bytes written."""

    logged: int = 0
    dropped: int = 0
    written: int = 0
    failed: int = 0
    files: int = 0
    bytes: int = 0

    def add(self, other: "FeatureLogCounts") -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


class ServerStats:
    """What /metrics and /stats report: latency per endpoint and per feature service, response codes, Redis
    errors, requests in flight, feature logging, rows served per view. `directory` (several workers) is where each
    worker's counters are shared."""

    def __init__(self, directory: Optional[Path] = None):
        self.endpoints: dict[str, LatencyHistogram] = {}
        self.services: dict[str, LatencyHistogram] = {}
        self.responses: dict[tuple[str, int], int] = {}
        self.redis_errors = 0
        self.in_flight = 0
        self.feature_log: dict[str, FeatureLogCounts] = {}  # per logged feature service
        self.log_queued = 0  # rows in the feature log's queue (served, not yet turned into Arrow)
        self.log_buffered = 0  # rows turned into Arrow, not yet written
        self.served = ServedRows()
        self.directory = directory

    def log_counts(self, service: str) -> FeatureLogCounts:
        counts = self.feature_log.get(service)
        if counts is None:
            counts = self.feature_log[service] = FeatureLogCounts()
        return counts

    def record(self, endpoint: str, status: int, ns: int, service: Optional[str] = None) -> None:
        us = ns // 1000
        bucket = bucket_of(us)
        hist = self.endpoints.get(endpoint)
        if hist is None:
            hist = self.endpoints[endpoint] = LatencyHistogram()
        hist.add(us, bucket)
        if service is not None:
            hist = self.services.get(service)
            if hist is None:
                hist = self.services[service] = LatencyHistogram()
            hist.add(us, bucket)
        key = (endpoint, status)
        self.responses[key] = self.responses.get(key, 0) + 1

    def to_json(self) -> dict[str, Any]:
        return {"endpoints": {k: h.to_json() for k, h in self.endpoints.items()},
                "services": {k: h.to_json() for k, h in self.services.items()},
                "responses": [[e, s, n] for (e, s), n in self.responses.items()],
                "redis_errors": self.redis_errors, "in_flight": self.in_flight,
                "feature_log": {k: asdict(c) for k, c in self.feature_log.items()},
                "log_queued": self.log_queued, "log_buffered": self.log_buffered, "served": self.served.to_json()}

    def dump(self) -> None:
        """Share this worker's counters with the others (atomic rename: readers never see half a file)."""
        if self.directory is None:
            return
        path = self.directory / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(path)

    def merged(self) -> "ServerStats":
        """This worker's live counters plus every other worker's last dump."""
        total = ServerStats()
        parts = [self.to_json()]
        if self.directory is not None:
            own = f"{os.getpid()}.json"
            for path in self.directory.glob("*.json"):
                if path.name != own:
                    try:
                        parts.append(json.loads(path.read_text()))
                    except (OSError, ValueError):  # a worker replacing its file right now
                        continue
        for part in parts:
            total._add(part)
        return total

    def _add(self, part: dict[str, Any]) -> None:
        for target, source in ((self.endpoints, part["endpoints"]), (self.services, part["services"])):
            for name, data in source.items():
                target.setdefault(name, LatencyHistogram()).merge(LatencyHistogram.from_json(data))
        for endpoint, status, count in part["responses"]:
            self.responses[(endpoint, status)] = self.responses.get((endpoint, status), 0) + count
        self.redis_errors += part["redis_errors"]
        self.in_flight += part["in_flight"]
        for service, counts in part["feature_log"].items():
            self.log_counts(service).add(FeatureLogCounts(**counts))
        self.log_queued += part["log_queued"]
        self.log_buffered += part["log_buffered"]
        self.served.add(part["served"])

    def summary(self) -> dict[str, Any]:
        """Percentiles in milliseconds, requests, errors and rows served per view: what `featurectl serve --stats
        URL` and `featurectl status --server URL` print."""
        def table(hists: dict[str, LatencyHistogram]) -> dict[str, Any]:
            return {name: {"count": h.total, **h.percentiles_ms()} for name, h in sorted(hists.items())}

        return {"endpoints": table(self.endpoints), "feature_services": table(self.services),
                "redis_errors": self.redis_errors, "in_flight": self.in_flight,
                "feature_log": {name: asdict(c) for name, c in sorted(self.feature_log.items())},
                "feature_log_queued_rows": self.log_queued, "feature_log_buffered_rows": self.log_buffered,
                "served_rows": self.served.summary()}
