"""Latency per stage of every generation request, outcomes and fallbacks: for /metrics, /stats and benchmarks.

Stages: `queue` (waiting for a batch), `fetch` (asset features through the SDK, requests with an asset only),
`text`, `prefill`, `decode`, `shape_decode` (latents + occupancy grid), `meshing` (to host + marching cubes),
`export` (GLB) and `total` (arrival to result). Log-linear histograms (`serving.stats.LatencyHistogram`): fixed
memory, percentiles within 1.6 %. A server of registered models (`rollout`) exposes one series per model version
it runs, labelled `arm` (`champion`, `challenger`, `retired` while it drains) and `version`.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Sequence

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
        self.tokens = 0
        self.batch_sizes: dict[int, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.queue_depth = 0
        self._lock = threading.Lock()

    def record(self, stages: dict[str, float], tokens: int = 0) -> None:
        with self._lock:
            for name, seconds in stages.items():
                if name in self.stages:
                    self.stages[name].record_ns(int(seconds * 1e9))
            self.outcomes["ok"] += 1
            self.tokens += tokens

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.outcomes[outcome] += n

    def batch(self, size: int) -> None:
        with self._lock:
            self.batch_sizes[size] = self.batch_sizes.get(size, 0) + 1

    def summary(self) -> dict:
        """{stage: {count, p50_ms, p90_ms, p99_ms, p99.9_ms}}, outcomes, tokens, batch sizes, fallbacks, queue."""
        with self._lock:
            stages = {name: {"count": h.total, **{f"{k}_ms": v for k, v in h.percentiles_ms().items()}}
                      for name, h in self.stages.items() if h.total}
            return {"stages": stages, "outcomes": dict(self.outcomes), "tokens": self.tokens,
                    "batch_sizes": dict(self.batch_sizes), "fallbacks": dict(self.fallbacks),
                    "queue_depth": self.queue_depth}

    def exposition(self) -> bytes:
        return exposition(lambda: [({}, self)])


def histogram_buckets(h: LatencyHistogram) -> list[tuple[str, int]]:
    """A latency histogram's cumulative Prometheus buckets, in seconds."""
    return [(f"{b / 1e6:.6f}", h.count_below_us(b)) for b in BOUNDS_US] + [("+Inf", h.total)]


Series = Sequence[tuple[dict[str, str], ServiceStats]]


def exposition(series: Callable[[], Series], *extra: object) -> bytes:
    """Prometheus text of every (labels, stats) pair `series` gives, one family per metric; `extra`: more
    collectors (objects with `collect()`), e.g. the shadow comparisons."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(series))
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry)


class _Collector:
    def __init__(self, series: Callable[[], Series]):
        self.series = series

    def collect(self) -> Iterator[Metric]:
        pairs = list(self.series())
        names = list(pairs[0][0]) if pairs else []
        hist = HistogramMetricFamily("cube3d_stage_duration_seconds", "generation latency per stage",
                                     labels=[*names, "stage"])
        quant = GaugeMetricFamily("cube3d_stage_quantile_seconds", "generation latency percentiles per stage",
                                  labels=[*names, "stage", "quantile"])
        outcomes = CounterMetricFamily("cube3d_requests", "generation requests by outcome", labels=[*names, "outcome"])
        tokens = CounterMetricFamily("cube3d_generated_tokens", "shape tokens of the meshes made", labels=names)
        fallbacks = CounterMetricFamily("cube3d_feature_fallbacks", "asset requests conditioned without "
                                        "their features, by reason", labels=[*names, "reason"])
        batches = CounterMetricFamily("cube3d_batches", "engine batches by number of requests", labels=[*names, "size"])
        depth = GaugeMetricFamily("cube3d_queue_depth", "requests waiting for a batch", labels=names)
        for labels, s in pairs:
            own = list(labels.values())
            with s._lock:
                for name, h in s.stages.items():
                    hist.add_metric([*own, name], histogram_buckets(h), h.sum_us / 1e6)
                    for p in POINTS:
                        quant.add_metric([*own, name, f"{p / 100:g}"], h.percentile_us(p) / 1e6)
                for name, n in s.outcomes.items():
                    outcomes.add_metric([*own, name], n)
                tokens.add_metric(own, s.tokens)
                for name, n in s.fallbacks.items():
                    fallbacks.add_metric([*own, name], n)
                for size, n in sorted(s.batch_sizes.items()):
                    batches.add_metric([*own, str(size)], n)
                depth.add_metric(own, s.queue_depth)
        yield from (hist, quant, outcomes, tokens, fallbacks, batches, depth)
