"""Latency per stage of every generation request, outcomes and fallbacks: for /metrics, /stats and benchmarks.

Stages: `queue` (waiting for a batch), `fetch` (asset features through the SDK, requests with an asset only),
`text`, `prefill`, `decode`, `shape_decode` (latents + occupancy grid), `meshing` (to host + marching cubes),
`export` (GLB) and `total` (arrival to result). Log-linear histograms (`serving.stats.LatencyHistogram`): fixed
memory, percentiles within 1.6 %.
"""

from __future__ import annotations

import threading
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from serving.stats import POINTS, LatencyHistogram

STAGES = ("queue", "fetch", "text", "prefill", "decode", "shape_decode", "marching_cubes", "to_host", "meshing",
          "export", "total")
OUTCOMES = ("ok", "rejected", "timeout", "failed")
BOUNDS_US = [1 << k for k in range(6, 27)]            # 64 us .. 67 s: powers of two are exact bucket edges


class ServiceStats:
    """Thread-safe: the worker, the mesh threads and the HTTP loop all record here."""

    def __init__(self) -> None:
        self.stages = {name: LatencyHistogram() for name in STAGES}
        self.outcomes = {name: 0 for name in OUTCOMES}
        self.batch_sizes: dict[int, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.queue_depth = 0
        self._lock = threading.Lock()

    def record(self, stages: dict[str, float]) -> None:
        with self._lock:
            for name, seconds in stages.items():
                if name in self.stages:
                    self.stages[name].record_ns(int(seconds * 1e9))
            self.outcomes["ok"] += 1

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.outcomes[outcome] += n

    def batch(self, size: int) -> None:
        with self._lock:
            self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1

    def summary(self) -> dict:
        """{stage: {count, p50_ms, p90_ms, p99_ms, p99.9_ms}}, outcomes, batch sizes, fallbacks, queue depth."""
        with self._lock:
            stages = {name: {"count": h.total, **{f"{k}_ms": v for k, v in h.percentiles_ms().items()}}
                      for name, h in self.stages.items() if h.total}
            return {"stages": stages, "outcomes": dict(self.outcomes), "batch_sizes": dict(self.batch_sizes),
                    "fallbacks": dict(self.fallbacks), "queue_depth": self.queue_depth}

    def exposition(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return generate_latest(registry)


class _Collector:
    def __init__(self, stats: ServiceStats):
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        hist = HistogramMetricFamily("cube3d_stage_duration_seconds", "generation latency per stage", labels=["stage"])
        quant = GaugeMetricFamily("cube3d_stage_quantile_seconds", "generation latency percentiles per stage",
                                  labels=["stage", "quantile"])
        with s._lock:
            for name, h in s.stages.items():
                buckets = [(f"{b / 1e6:.6f}", h.count_below_us(b)) for b in BOUNDS_US] + [("+Inf", h.total)]
                hist.add_metric([name], buckets, h.sum_us / 1e6)
                for p in POINTS:
                    quant.add_metric([name, f"{p / 100:g}"], h.percentile_us(p) / 1e6)
            outcomes = CounterMetricFamily("cube3d_requests", "generation requests by outcome", labels=["outcome"])
            for name, n in s.outcomes.items():
                outcomes.add_metric([name], n)
            fallbacks = CounterMetricFamily("cube3d_feature_fallbacks", "asset requests conditioned without "
                                            "their features, by reason", labels=["reason"])
            for name, n in s.fallbacks.items():
                fallbacks.add_metric([name], n)
            batches = CounterMetricFamily("cube3d_batches", "engine batches by number of requests", labels=["size"])
            for size, n in sorted(s.batch_sizes.items()):
                batches.add_metric([str(size)], n)
            depth = GaugeMetricFamily("cube3d_queue_depth", "requests waiting for a batch", value=s.queue_depth)
        yield from (hist, quant, outcomes, fallbacks, batches, depth)
