"""The gateway's `/metrics` (Prometheus) and `/stats` (JSON), per replica: requests, errors by kind, latency
histogram and percentiles, the latency estimate, requests in flight, whether it is ejected and how often it was."""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from serving.metrics import latency_metrics
from serving.routing.router import Router


def summary(router: Router) -> dict:
    """Per replica (in the order given): url, tag, the counters, the estimate and percentiles in ms."""
    now = time.monotonic()
    replicas = []
    for r in router.replicas:
        percentiles = {f"{k}_ms": v for k, v in r.latency.percentiles_ms().items()} if r.latency.total else {}
        replicas.append({"url": r.url, "tag": r.tag, "requests": r.requests, "errors": dict(r.errors),
                         "ewma_ms": r.ewma_s * 1e3, "in_flight": r.in_flight, "ejected": not r.in_rotation,
                         "ejected_for_s": max(0.0, r.ejected_until - now) if not r.in_rotation else 0.0,
                         "why_ejected": r.why_ejected, "ejections": r.ejections, **percentiles})
    return {"balance": router.settings.balance, "retries": router.retries, "replicas": replicas}


class RouterMetrics:
    """The Prometheus families of one router, read at scrape time."""

    def __init__(self, router: Router):
        self.router = router
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def scrape(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        replicas = self.router.replicas
        yield from latency_metrics("gateway_replica_latency_seconds", "time to each replica's whole answer",
                                   "replica", {r.url: r.latency for r in replicas})
        errors = CounterMetricFamily("gateway_replica_errors", "failed requests per replica: connect (refused or "
                                     "timed out), broken (reset or no answer in time), 5xx", labels=["replica", "kind"])
        for r in replicas:
            for kind, n in r.errors.items():
                errors.add_metric([r.url, kind], n)
        yield errors
        for family, name, doc, value in (
                (CounterMetricFamily, "gateway_replica_requests", "requests sent to each replica", "requests"),
                (GaugeMetricFamily, "gateway_replica_ewma_seconds", "latency estimate of /generate (EWMA)", "ewma_s"),
                (GaugeMetricFamily, "gateway_replica_in_flight", "requests waiting for the replica's answer",
                 "in_flight"),
                (CounterMetricFamily, "gateway_replica_ejections", "times taken out of rotation", "ejections")):
            metric = family(name, doc, labels=["replica"])
            for r in replicas:
                metric.add_metric([r.url], getattr(r, value))
            yield metric
        ejected = GaugeMetricFamily("gateway_replica_ejected", "1 while out of rotation", labels=["replica"])
        for r in replicas:
            ejected.add_metric([r.url], 0 if r.in_rotation else 1)
        yield ejected
        yield CounterMetricFamily("gateway_retries", "requests sent again to another replica",
                                  value=self.router.retries)
