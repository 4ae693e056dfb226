"""What the running job measures: events per second, event-to-Redis lag, writes, dead letters.

Each window writer process counts its own (`totals`, lag samples); the stream's process sums them.

Lag is measured per written tile update: the wall-clock time of the Redis round trip that made its values
visible minus the greatest event time in that tile. For live events (event time = the moment they were produced)
that is produced-to-visible freshness; for a replay of old events it is how far behind real time the job is.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

RATE_WINDOW_S = 10.0
LAG_WINDOW_S = 60.0
MAX_LAG_SAMPLES = 200_000


@dataclass
class ViewCounters:
    events: int = 0
    tiles_applied: int = 0
    tiles_stale: int = 0
    writes: int = 0
    refused: int = 0
    history: deque = field(default_factory=deque)  # (monotonic seconds, events so far)

    def rate(self, now: float) -> float:
        self.history.append((now, self.events))
        while len(self.history) > 2 and now - self.history[1][0] >= RATE_WINDOW_S:
            self.history.popleft()
        first_t, first_events = self.history[0]
        return (self.events - first_events) / (now - first_t) if now > first_t else 0.0


class StreamMetrics:
    """Counters per view, lag samples and dead-letter counts; `snapshot` turns them into the status figures."""

    def __init__(self, views: list[str], sources: dict[str, str]):
        self.views = {v: ViewCounters() for v in views}
        self.source_of = sources  # view -> source: events are counted once per source
        self.lags: deque = deque(maxlen=MAX_LAG_SAMPLES)  # (wall seconds, lag ms)
        self.dead_letters: dict[str, int] = {}

    def totals(self) -> dict:
        """The cumulative figures a window writer process reports to the stream's process."""
        return {"views": {name: [c.events, c.tiles_applied, c.tiles_stale, c.writes, c.refused]
                          for name, c in self.views.items()},
                "dead_letters": dict(self.dead_letters)}

    def sum_totals(self, reports: list[dict]) -> None:
        """Set the counters to the sum of the writers' latest `totals` (a restarted writer counts again from the
        tiles it reads back, as a restarted stream does)."""
        for name, c in self.views.items():
            c.events, c.tiles_applied, c.tiles_stale, c.writes, c.refused = (
                sum(r["views"][name][k] for r in reports) for k in range(5))
        self.dead_letters = {}
        for report in reports:
            for reason, n in report["dead_letters"].items():
                self.dead_letters[reason] = self.dead_letters.get(reason, 0) + n

    def record_lags(self, wall_ms: int, clocks: list[int]) -> None:
        now = wall_ms / 1000
        self.lags.extend((now, wall_ms - c) for c in clocks)

    def freshness(self, now: Optional[float] = None) -> dict[str, Optional[float]]:
        now = time.time() if now is None else now
        while self.lags and now - self.lags[0][0] > LAG_WINDOW_S:
            self.lags.popleft()
        if not self.lags:
            return {"p50_ms": None, "p99_ms": None, "samples": 0}
        lags = np.fromiter((lag for _, lag in self.lags), dtype=np.float64, count=len(self.lags))
        p50, p99 = np.percentile(lags, [50, 99])
        return {"p50_ms": round(float(p50), 1), "p99_ms": round(float(p99), 1), "samples": int(lags.size)}

    def snapshot(self) -> dict:
        now = time.monotonic()
        views = {}
        per_source: dict[str, float] = {}
        for name, c in self.views.items():
            rate = c.rate(now)
            source = self.source_of[name]
            per_source[source] = max(per_source.get(source, 0.0), rate)
            views[name] = {"events": c.events, "events_per_s": round(rate, 1), "tiles_applied": c.tiles_applied,
                           "tiles_stale": c.tiles_stale, "redis_writes": c.writes, "redis_refused_older": c.refused}
        return {"events_per_s": round(sum(per_source.values()), 1), "freshness": self.freshness(),
                "views": views, "dead_letters": {"total": sum(self.dead_letters.values()),
                                                 "by_reason": dict(sorted(self.dead_letters.items()))}}
