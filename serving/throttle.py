"""Per-key budgets per minute as token buckets: smooth refill, bursts up to one minute's budget."""

from __future__ import annotations

import math
import threading
import time
from typing import Callable


class TokenBuckets:
    """One bucket per (key, kind); `take` answers (allowed, seconds to wait before retrying)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: str, kind: str, cost: float, per_minute: float) -> tuple[bool, int]:
        """Spend `cost` from the key's `kind` budget of `per_minute`; a cost above the budget never passes."""
        rate = per_minute / 60.0
        now = self.clock()
        with self._lock:
            level, last = self._buckets.get((key_id, kind), (float(per_minute), now))
            level = min(float(per_minute), level + (now - last) * rate)
            if cost <= level:
                self._buckets[(key_id, kind)] = [level - cost, now]
                return True, 0
            self._buckets[(key_id, kind)] = [level, now]
        if cost > per_minute:
            return False, 60
        return False, max(1, math.ceil((cost - level) / rate))

    def give_back(self, key_id: str, kind: str, cost: float, per_minute: float) -> None:
        """Return what `take` spent on work that was then refused (a full queue): the caller was not served."""
        with self._lock:
            bucket = self._buckets.get((key_id, kind))
            if bucket is not None:
                bucket[0] = min(float(per_minute), bucket[0] + cost)
