"""What the gateway knows of one replica: its latency estimate, requests in flight, failures and ejection.

The latency estimate is an exponentially weighted moving average of the replica's `/generate` answers, per
sample (`alpha`). Read for routing it decays with the time since the last sample (`decay_s`): a replica that got
no traffic for a while looks cheaper and is tried again, so a replica that recovered wins its share back.

Ejection (draining): a replica is taken out of rotation for a back-off that doubles with each ejection in a row
(`eject_s` up to `max_eject_s`) when it refuses connections, breaks one mid-answer, times out, answers 503, answers
`failures_to_eject` other 5xx in a row, or answers `slow_samples` requests in a row each `slow_factor` times slower
than the fastest other replica's estimate (and slower than `slow_floor_s`): one slow answer (a pause, a big batch)
is not enough. Slowness never ejects more than `max_slow_share` of the replicas. Once its back-off has passed,
the health probe (`GET /ready`) decides whether it comes back.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Optional

from serving.routing.upstream import ReplicaClient
from serving.stats import LatencyHistogram

ERROR_KINDS = ("connect", "broken", "5xx")


@dataclass(frozen=True)
class RoutingSettings:
    """How the gateway routes, retries and drains."""

    balance: str = "latency"        # `latency`: power of two choices on EWMA x (in flight + 1); `round-robin`
    timeout_s: float = 90.0         # a replica's whole answer (a /generate waits up to its `timeout_s`, 60 s)
    connect_timeout_s: float = 1.0
    attempts: int = 3               # replicas tried per request at most (retries are attempts - 1)
    alpha: float = 0.3              # weight of a new sample
    decay_s: float = 2.0            # how fast an unused replica's estimate fades, for routing
    floor_s: float = 1e-4           # the least estimate: a faded one still pays for its queue
    eject_s: float = 1.0            # the first ejection's back-off; doubled each ejection in a row
    max_eject_s: float = 30.0
    failures_to_eject: int = 3      # 5xx answers in a row (503s eject at once)
    slow_factor: float = 5.0        # slower than this times the fastest other replica: ejected (latency only)
    slow_floor_s: float = 0.005     # ... and slower than this: sub-millisecond jitter is not slowness
    slow_samples: int = 3           # slow answers in a row that eject (latency only)
    max_slow_share: float = 0.5     # slowness ejects at most this share of the replicas
    probe_s: float = 1.0            # health probe period


def replica_tag(url: str) -> str:
    """A short, stable name of a replica: the prefix of the job ids it owns, the same in every gateway."""
    return hashlib.blake2b(url.encode(), digest_size=3).hexdigest()


@dataclass
class Replica:
    url: str
    client: ReplicaClient
    settings: RoutingSettings
    tag: str = ""
    ewma_s: float = 0.0
    samples: int = 0
    last_sample: float = 0.0        # loop time
    in_flight: int = 0
    ejected_until: float = 0.0      # loop time; 0: in rotation
    ejections_in_a_row: int = 0
    ejections: int = 0
    failures_in_a_row: int = 0
    slow_in_a_row: int = 0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ERROR_KINDS, 0))
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    why_ejected: Optional[str] = None

    def __post_init__(self) -> None:
        self.tag = self.tag or replica_tag(self.url)

    def cost(self, now: float) -> float:
        """What a request sent here is expected to cost: the decayed estimate times the queue it joins. A replica
        not yet measured takes one request at a time until its first answer (it may be the slow one)."""
        if not self.samples:
            return 0.0 if self.in_flight == 0 else math.inf
        estimate = self.ewma_s * math.exp(-(now - self.last_sample) / self.settings.decay_s)
        return max(estimate, self.settings.floor_s) * (self.in_flight + 1)

    @property
    def in_rotation(self) -> bool:
        return self.ejected_until == 0.0

    def observe(self, seconds: float, now: float) -> None:
        """A latency sample of a routed request."""
        if self.samples == 0:
            self.ewma_s = seconds
        else:
            self.ewma_s += self.settings.alpha * (seconds - self.ewma_s)
        self.samples += 1
        self.last_sample = now

    def failed(self, kind: str) -> None:
        self.errors[kind] += 1
        self.failures_in_a_row += 1

    def eject(self, now: float, why: str) -> None:
        """Out of rotation for the back-off; `readmit` (after a good probe) brings it back."""
        if self.ejected_until:
            return
        back_off = min(self.settings.eject_s * 2 ** self.ejections_in_a_row, self.settings.max_eject_s)
        self.ejected_until = now + back_off
        self.ejections_in_a_row += 1
        self.ejections += 1
        self.why_ejected = why

    def extend(self, now: float, why: str) -> None:
        """A probe found it still unfit: another, longer back-off."""
        self.ejected_until = 0.0
        self.eject(now, why)

    def readmit(self) -> None:
        self.ejected_until, self.failures_in_a_row, self.slow_in_a_row, self.why_ejected = 0.0, 0, 0, None

    def answered(self, slow: bool) -> None:
        """An answer that was no failure: a fast one also resets the back-off to its shortest."""
        self.failures_in_a_row = 0
        self.slow_in_a_row = self.slow_in_a_row + 1 if slow else 0
        if not slow:
            self.ejections_in_a_row = 0
