"""Prometheus exposition of `ServerStats`: histograms whose bucket edges are exact HDR edges (powers of two
microseconds), the P50/P90/P99/P99.9 of each, response codes, Redis errors, requests in flight and feature
logging (rows by outcome, files and bytes per service, rows queued and buffered); the drift of served values
per feature (`serving.drift`); and the views' freshness (`serving.freshness`)."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from serving.freshness import FreshnessSnapshot, freshness_metrics, served_metrics
from serving.stats import POINTS, FeatureLogCounts, LatencyHistogram, ServerStats

# 64 us .. 8.4 s: powers of two are bucket edges of the log-linear histogram, so these counts are exact
BOUNDS_US = [1 << k for k in range(6, 24)]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def latency_metrics(name: str, doc: str, label: str, hists: dict[str, LatencyHistogram]) -> Iterator[Metric]:
    """A histogram family with exact bucket edges and a gauge family of its percentiles, one series per label
    value (the feature server's endpoints, the gateway's replicas)."""
    family = HistogramMetricFamily(name, doc, labels=[label])
    quantiles = GaugeMetricFamily(f"{name.removesuffix('_seconds')}_quantile_seconds",
                                  f"{doc}: percentiles from the log-linear histogram", labels=[label, "quantile"])
    for value, hist in sorted(hists.items()):
        buckets = [(f"{b / 1e6:.6f}", hist.count_below_us(b)) for b in BOUNDS_US] + [("+Inf", hist.total)]
        family.add_metric([value], buckets, hist.sum_us / 1e6)
        for p in POINTS:
            quantiles.add_metric([value, f"{p / 100:g}"], hist.percentile_us(p) / 1e6)
    yield family
    yield quantiles


class StatsCollector:
    """Reads the (merged) server stats and the last freshness snapshot at scrape time; nothing is observed twice.
    `served`: whether the rows served per view are counted (`platform.serving.monitoring`), else left out."""

    def __init__(self, stats: ServerStats, freshness: Optional[FreshnessSnapshot] = None, served: bool = True):
        self.stats = stats
        self.freshness = freshness
        self.served = served

    def collect(self) -> Iterator[Metric]:
        stats = self.stats.merged()
        yield from latency_metrics("featurectl_request_duration_seconds", "request latency per endpoint", "endpoint",
                              stats.endpoints)
        yield from latency_metrics("featurectl_feature_service_request_duration_seconds",
                              "get-online-features latency per feature service (`-` for feature lists)",
                              "feature_service", stats.services)
        responses = CounterMetricFamily("featurectl_responses", "responses per endpoint and HTTP status",
                                        labels=["endpoint", "status"])
        for (endpoint, status), count in sorted(stats.responses.items()):
            responses.add_metric([endpoint, str(status)], count)
        yield responses
        yield CounterMetricFamily("featurectl_redis_errors", "requests that failed on Redis (503)",
                                  value=stats.redis_errors)
        yield GaugeMetricFamily("featurectl_requests_in_flight", "requests being served now", value=stats.in_flight)
        yield from _feature_log(stats.feature_log)
        yield GaugeMetricFamily("featurectl_feature_log_queued_rows", "rows served for logging, not yet in Arrow",
                                value=stats.log_queued)
        yield GaugeMetricFamily("featurectl_feature_log_buffered_rows", "logged rows in Arrow, not yet written",
                                value=stats.log_buffered)
        if self.served:
            yield from served_metrics(stats.served)
        if self.freshness is not None:
            yield from freshness_metrics(self.freshness)


def _feature_log(counts: dict[str, FeatureLogCounts]) -> Iterator[Metric]:
    rows = CounterMetricFamily("featurectl_feature_log_rows", "logged rows per feature service: logged (queued), "
                               "dropped (queue full), written, failed", labels=["feature_service", "outcome"])
    files = CounterMetricFamily("featurectl_feature_log_files", "Parquet files written per feature service",
                                labels=["feature_service"])
    size = CounterMetricFamily("featurectl_feature_log_bytes", "bytes of Parquet written per feature service",
                               labels=["feature_service"])
    for service, count in sorted(counts.items()):
        for outcome in ("logged", "dropped", "written", "failed"):
            rows.add_metric([service, outcome], getattr(count, outcome))
        files.add_metric([service], count.files)
        size.add_metric([service], count.bytes)
    yield rows
    yield files
    yield size


def exposition(stats: ServerStats, drift: Optional[Any] = None,
               freshness: Optional[FreshnessSnapshot] = None, served: bool = True) -> bytes:
    """The scrape; `drift`: a collector of drift metrics (`serving.drift.DriftMonitor`), when sampling is on;
    `freshness`: the last snapshot of the views' newest event times and stream lags; `served`: whether rows served
    per view are counted."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats, freshness, served))
    if drift is not None:
        registry.register(drift)
    return generate_latest(registry)
