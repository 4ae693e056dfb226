"""Rows served per view, and how many of them were missing (`NOT_FOUND`) or older than the view's ttl
(`OUTSIDE_MAX_AGE`): what tells a model's owner that its features go stale before the model does.

Counted by the feature server for every answer of `/get-online-features`, from the statuses the answer already
holds (`serving.result.ViewRows`): per view, a dict lookup and three additions. A one-row answer, the usual one, is
counted by its outcome instead (`RowOutcome`, each view's status, a constant of its plan): one dict increment per
answer whatever the number of views, folded into the per-view counts when they are read. Shared across workers
with the rest of `serving.stats.ServerStats`.
"""

from __future__ import annotations

from typing import Any, Mapping

from serving.result import NOT_FOUND, OUTSIDE_MAX_AGE, PRESENT, ViewRows

# One entity row's answer: per view read, its name and its status (0 present, 1 NOT_FOUND, 2 OUTSIDE_MAX_AGE, the
# positions of `ServedRows.counts`' misses); hashable, so that equal outcomes count in one place.
RowOutcome = tuple[tuple[str, int], ...]


class ServedRows:
    """Per view: [rows served, NOT_FOUND, OUTSIDE_MAX_AGE]. A row is one entity row of one view in one answer."""

    __slots__ = ("counts", "outcomes")

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.outcomes: dict[RowOutcome, int] = {}  # one-row answers by outcome, not yet folded into `counts`

    def count(self, views: Mapping[str, ViewRows]) -> None:
        counts = self.counts
        for name, rows in views.items():
            counted = counts.get(name)
            if counted is None:
                counted = counts[name] = [0, 0, 0]
            counted[0] += len(rows.ts_raw)
            counted[1] += len(rows.missing)
            counted[2] += len(rows.stale)

    def count_row(self, outcome: RowOutcome) -> None:
        """One one-row answer."""
        outcomes = self.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    def _fold(self) -> dict[str, list[int]]:
        """`counts` with the one-row answers counted so far."""
        counts = self.counts
        for outcome, n in self.outcomes.items():
            for view, status in outcome:
                counted = counts.get(view)
                if counted is None:
                    counted = counts[view] = [0, 0, 0]
                counted[0] += n
                if status:
                    counted[status] += n
        self.outcomes = {}
        return counts

    def by_status(self) -> dict[str, dict[str, int]]:
        """Per view, rows per status; `PRESENT` here: the view's row was found within its ttl (single features
        of it may still be NULL_VALUE)."""
        return {view: {PRESENT: rows - missing - stale, NOT_FOUND: missing, OUTSIDE_MAX_AGE: stale}
                for view, (rows, missing, stale) in sorted(self._fold().items())}

    def to_json(self) -> dict[str, list[int]]:
        return {view: list(counted) for view, counted in self._fold().items()}

    def add(self, part: Mapping[str, list[int]]) -> None:
        for view, counted in part.items():
            mine = self.counts.setdefault(view, [0, 0, 0])
            for i, n in enumerate(counted):
                mine[i] += n

    def summary(self) -> dict[str, dict[str, Any]]:
        """What `/stats` reports per view: rows, both kinds of miss, and their share of the rows."""
        return {view: {"rows": rows, "not_found": missing, "outside_max_age": stale,
                       "missing_rate": round((missing + stale) / rows, 6) if rows else None}
                for view, (rows, missing, stale) in sorted(self._fold().items())}
