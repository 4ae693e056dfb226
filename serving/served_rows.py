"""Rows served per view, and how many of them were missing (`NOT_FOUND`) or older than the view's ttl
(`OUTSIDE_MAX_AGE`): what tells a model's owner that its features go stale before the model does.

Counted by the feature server for every answer of `/get-online-features`, from the statuses the answer already
holds (`serving.result.ViewRows`): per view, a dict lookup and three additions. Shared across workers with the rest
of `serving.stats.ServerStats`.
"""

from __future__ import annotations

from typing import Any, Mapping

from serving.result import NOT_FOUND, OUTSIDE_MAX_AGE, PRESENT, ViewRows


class ServedRows:
    """Per view: [rows served, NOT_FOUND, OUTSIDE_MAX_AGE]. A row is one entity row of one view in one answer."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def count(self, views: Mapping[str, ViewRows]) -> None:
        counts = self.counts
        for name, rows in views.items():
            counted = counts.get(name)
            if counted is None:
                counted = counts[name] = [0, 0, 0]
            counted[0] += len(rows.ts_raw)
            counted[1] += len(rows.missing)
            counted[2] += len(rows.stale)

    def by_status(self) -> dict[str, dict[str, int]]:
        """Per view, rows per status; `PRESENT` here: the view's row was found within its ttl (single features
        of it may still be NULL_VALUE)."""
        return {view: {PRESENT: rows - missing - stale, NOT_FOUND: missing, OUTSIDE_MAX_AGE: stale}
                for view, (rows, missing, stale) in sorted(self.counts.items())}

    def to_json(self) -> dict[str, list[int]]:
        return {view: list(counted) for view, counted in self.counts.items()}

    def add(self, part: Mapping[str, list[int]]) -> None:
        for view, counted in part.items():
            mine = self.counts.setdefault(view, [0, 0, 0])
            for i, n in enumerate(counted):
                mine[i] += n

    def summary(self) -> dict[str, dict[str, Any]]:
        """What `/stats` reports per view: rows, both kinds of miss, and their share of the rows."""
        return {view: {"rows": rows, "not_found": missing, "outside_max_age": stale,
                       "missing_rate": round((missing + stale) / rows, 6) if rows else None}
                for view, (rows, missing, stale) in sorted(self.counts.items())}
