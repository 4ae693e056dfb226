"""The freshness of the views a feature server serves, as Prometheus metrics: rows served per view and status
(counted in the request path, `serving.served_rows`), the age of the newest value written per view
(`redis_store.freshness`) and the event-to-Redis lag of the streams writing them (their status files,
`streaming.status`).

The last two are read in the background every `REFRESH_S` seconds by `FreshnessMonitor`, never while a request
waits (the status files on a worker thread, only when a stream ever ran under the state folder: the thread's
Python holds the GIL the event loop needs); a scrape reads the last snapshot and computes the ages at that
moment. Each worker reads for itself (one
HGETALL and a few small files per second), so whichever worker answers a scrape reports the same gauges, while
the counters add up over the workers with the rest of `ServerStats`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from redis_store.freshness import parse_record, read_command, record_key
from serving.served_rows import ServedRows
from streaming.status import ViewLag, stream_root, view_lags

if TYPE_CHECKING:
    from serving.client import AsyncOnlineClient

log = logging.getLogger(__name__)

REFRESH_S = 1.0


@dataclass(frozen=True)
class FreshnessSnapshot:
    """Per view served: the newest event time written (ms) and the stream writing it, as last read."""

    newest_ms: dict[str, int] = field(default_factory=dict)
    streams: dict[str, ViewLag] = field(default_factory=dict)


class FreshnessMonitor:
    """Reads the project's freshness record and its streams' status files (under `state_dir`) every `refresh_s`;
    `snapshot` is the last read. A failed read keeps the previous snapshot and is logged once until one works."""

    def __init__(self, state_dir: Optional[Path], refresh_s: float = REFRESH_S):
        self.state_dir = state_dir
        self.refresh_s = refresh_s
        self.snapshot = FreshnessSnapshot()
        self._failing = False

    async def run(self, client: AsyncOnlineClient) -> None:
        while True:
            try:
                await self.refresh(client)
                if self._failing:
                    log.info("freshness: reading the newest event times works again")
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away, a bug: never the end of the server, nor of this loop
                if not self._failing:
                    log.warning("freshness: cannot read the newest event times (%s); /metrics keeps the last ones",
                                exc)
                self._failing = True
            await asyncio.sleep(self.refresh_s)

    async def refresh(self, client: AsyncOnlineClient) -> None:
        catalog = client.registry.catalog
        key = record_key(catalog.project)
        [reply] = await client.redis.read([key], [read_command(catalog.project)])
        newest = parse_record(reply)
        streams: dict[str, ViewLag] = {}
        if self.state_dir is not None and stream_root(self.state_dir).is_dir():  # small files, read off the loop
            streams = await asyncio.get_running_loop().run_in_executor(None, view_lags, self.state_dir,
                                                                       catalog.project)
        served = catalog.views
        self.snapshot = FreshnessSnapshot({v: ms for v, ms in newest.items() if v in served},
                                          {v: lag for v, lag in streams.items() if v in served})


def served_metrics(served: ServedRows) -> Iterator[Metric]:
    rows = CounterMetricFamily("featurectl_view_served_rows", "entity rows served per view, by status: PRESENT "
                               "(found within the ttl), NOT_FOUND, OUTSIDE_MAX_AGE (older than the ttl)",
                               labels=["view", "status"])
    for view, counts in served.by_status().items():
        for status, count in counts.items():
            rows.add_metric([view, status], count)
    yield rows


def freshness_metrics(snapshot: FreshnessSnapshot, now_s: Optional[float] = None) -> Iterator[Metric]:
    now_s = time.time() if now_s is None else now_s
    newest = GaugeMetricFamily("featurectl_view_newest_event_timestamp_seconds",
                               "the newest event time written to Redis per view (materialization, stream, push)",
                               labels=["view"])
    age = GaugeMetricFamily("featurectl_view_newest_value_age_seconds",
                            "seconds from the newest event time written per view to now", labels=["view"])
    for view, ms in sorted(snapshot.newest_ms.items()):
        newest.add_metric([view], ms / 1000)
        age.add_metric([view], now_s - ms / 1000)
    running = GaugeMetricFamily("featurectl_stream_running", "1 while the stream writing the view runs, else 0",
                                labels=["view"])
    lag = GaugeMetricFamily("featurectl_stream_lag_seconds", "event-to-Redis lag of the stream writing the view "
                            "(last minute)", labels=["view", "quantile"])
    for view, stream in sorted(snapshot.streams.items()):
        running.add_metric([view], float(stream.running))
        for quantile, ms in (("0.5", stream.p50_ms), ("0.99", stream.p99_ms)):
            if ms is not None:
                lag.add_metric([view, quantile], ms / 1000)
    yield from (newest, age, running, lag)
