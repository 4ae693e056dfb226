"""Time spans recorded one after another over the same table, where a newer span holds the rows it covers."""

from __future__ import annotations

import datetime as dt
from typing import Sequence, TypeVar

T = TypeVar("T")


def newest_per_part(spans: Sequence[tuple[dt.datetime, dt.datetime, T]]) -> list[tuple[dt.datetime, dt.datetime, T]]:
    """Cut the union of `spans` ([start, end) each, given oldest first) where any span starts or ends; each part,
    in time order, with the item of the newest span that covers it."""
    cuts = sorted({t for start, end, _ in spans for t in (start, end)})
    parts = []
    for lo, hi in zip(cuts, cuts[1:]):
        covering = [item for start, end, item in spans if start <= lo and hi <= end]
        if covering:
            parts.append((lo, hi, covering[-1]))
    return parts
