"""Drift of served values from the training-set profile, per feature, for `/metrics`.

The request path only hands a sample of its responses over: one request in `stride`, while this second's budget of
entity rows (`rows_per_second`) lasts, where the stride is last second's rows over the budget, so that the sample
spreads over the second rather than taking its first requests. A one-row answer is kept as one flat tuple of its
Redis replies (references, nothing decoded) and which of its views served a value: a tuple of bytes and an int,
which the garbage collector stops tracking at its first look, so the sample adds no objects to its later
collections (kept as lists and dicts, a second's sample made each collection of generation 1 about four times as
long, and brought full collections).
A larger answer is kept as the response already built. Once a second a background task takes the sample and
works through it in steps of at most `STEP_ROWS` rows gathered or `STEP_VALUES` values decoded and binned,
handing the event loop back after each step, so that no request waits behind it for more than one step: it
gathers the values of each profiled feature across the sample, then per feature decodes the kept replies' values,
puts them in the profile's bins (one numpy call a step) and keeps the bins of the last `window` values served (a
ring buffer with running counts). At scrape time each feature's PSI against its profile is a sum over about ten
bins.

Profiles are the latest backfill's of each view (`common.quality_log`), read from the registry database at start
and every `refresh_s` on a worker thread; when a newer backfill brings new bins, that feature's window starts
afresh. With several workers, each reports the values it served (its share of the traffic, a sample as good).
"""

from __future__ import annotations

import asyncio
import logging
import math
from itertools import accumulate, chain
from typing import Any, Callable, Iterator, Optional

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from common.feature_profile import FeatureProfile
from serving.catalog import Catalog
from serving.plan import resolve
from serving.result import OnlineFeatures
from serving.served_rows import RowOutcome
from serving.row_answer import RowAnswer

logger = logging.getLogger(__name__)

ROWS_PER_SECOND = 256
WINDOW = 10_000
REFRESH_S = 60.0
STEP_ROWS = 16  # sampled rows gathered in one step of the drain
STEP_VALUES = 128  # values decoded and binned in one step of the drain

Kept = dict[tuple[str, str], tuple[Callable, list]]  # (view, feature) -> its decoder, raw values of kept replies
Shape = tuple[Any, RowAnswer]  # the features asked (a service name or a tuple of refs) and the plan's writer


class KeptRows:
    """The one-row answers of one request shape kept this second: where each group of replies starts in a kept
    row, each view's bit, and the rows, each `(*replies, served)` where a view's bit is set in `served` when it
    served a value (its row neither missing nor stale)."""

    def __init__(self, replies: list, outcome: RowOutcome):
        self.starts = list(accumulate((len(group) for group in replies[:-1]), initial=0))
        self.bits = {view: bit for bit, (view, _) in enumerate(outcome)}
        self.rows: list[tuple] = []


def _rows(response: OnlineFeatures) -> int:
    return len(next(iter(response.entities.values()), ()))


class ServedWindow:
    """The bins of the last `size` values served of one feature, and how many fall in each bin."""

    def __init__(self, profile: FeatureProfile, size: int = WINDOW):
        self.profile = profile
        self.ring = np.zeros(size, dtype=np.int64)
        self.counts = np.zeros(len(profile.shares), dtype=np.int64)
        self.filled = 0
        self.next = 0

    def add(self, values: list) -> None:
        """Values served (None and NaN are no value and left out), oldest first."""
        present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not present:
            return
        bins = self.profile.bins(present)[-len(self.ring):]
        slots = (self.next + np.arange(len(bins))) % len(self.ring)
        replaced = slots[slots < self.filled]
        self.counts -= np.bincount(self.ring[replaced], minlength=len(self.counts))
        self.ring[slots] = bins
        self.counts += np.bincount(bins, minlength=len(self.counts))
        self.filled = min(len(self.ring), self.filled + len(bins))
        self.next = (self.next + len(bins)) % len(self.ring)

    def psi(self) -> Optional[float]:
        return self.profile.psi(self.counts) if self.filled else None


class DriftMonitor:
    """Sampled served values against each view's latest offline profile; a Prometheus collector."""

    def __init__(self, load_profiles: Callable[[], dict[str, dict[str, FeatureProfile]]],
                 rows_per_second: int = ROWS_PER_SECOND, window: int = WINDOW, refresh_s: float = REFRESH_S):
        """`load_profiles`: view -> feature -> profile, e.g. `QualityLog.latest_profiles` of the project; it runs
        on a worker thread."""
        self.load_profiles = load_profiles
        self.rows_per_second, self.window, self.refresh_s = rows_per_second, window, refresh_s
        self.profiles: dict[str, dict[str, FeatureProfile]] = {}
        self.windows: dict[tuple[str, str], ServedWindow] = {}
        self.pending: list[tuple[Any, OnlineFeatures]] = []  # larger answers, as built
        self.kept: dict[Shape, KeptRows] = {}  # one-row answers, by request shape
        self.ungathered = 0  # rows of the drain under way not gathered yet
        self.budget = rows_per_second
        self.stride = 1  # rows seen between two samples
        self.seen = 0  # rows seen this second
        self.due = 0  # `seen` at which the next sample is due

    def sampling(self, rows: int = 1) -> bool:
        """Whether to sample a response of `rows` rows now (then `offer` it): one in `stride` rows, while the budget
        lasts; while it is not, the server need not keep anything."""
        self.seen += rows
        if self.seen < self.due or self.budget <= 0:
            return False
        self.due = self.seen + self.stride
        return True

    def offer(self, features: Any, response: OnlineFeatures) -> None:
        """On the request path: keep the response for the next drain while this second's budget lasts."""
        if self.budget > 0:
            self.budget -= _rows(response)
            self.pending.append((features, response))

    def offer_row(self, features: Any, answer: RowAnswer, replies: list, outcome: RowOutcome) -> None:
        """`offer` for a one-row answer written by `answer` (`outcome`: its views' statuses): its replies are decoded
        by the drain, not here."""
        if self.budget > 0:
            self.budget -= 1
            shape = (features if isinstance(features, str) else tuple(features), answer)
            kept = self.kept.get(shape)
            if kept is None:
                kept = self.kept[shape] = KeptRows(replies, outcome)
            served = 0
            for bit, (_, status) in enumerate(outcome):
                if not status:
                    served |= 1 << bit
            kept.rows.append((*chain.from_iterable(replies), served))

    def drain(self, catalog: Catalog) -> None:
        """Bin what was sampled since the last drain and renew the budget (at once; `run` does it in steps)."""
        for _ in self.drain_steps(catalog):
            pass

    def take(self) -> tuple[list[tuple[Any, OnlineFeatures]], dict[Shape, KeptRows]]:
        """The answers sampled since the last call; the budget starts again, the stride follows the rows seen."""
        taken = self.pending, self.kept
        self.pending, self.kept, self.budget = [], {}, self.rows_per_second
        self.stride, self.seen, self.due = max(1, self.seen // self.rows_per_second), 0, 0
        return taken

    def drain_steps(self, catalog: Catalog) -> Iterator[None]:
        """`drain` in steps, yielding after each: at most `STEP_ROWS` rows gathered, or `STEP_VALUES` values of one
        feature decoded and binned."""
        responses, kept_rows = self.take()
        gathered: dict[tuple[str, str], list] = {}
        kept: Kept = {}
        self.ungathered = sum(_rows(r) for _, r in responses) + sum(len(k.rows) for k in kept_rows.values())
        targets: dict[tuple, list] = {}  # per request shape of built responses: what to pick, where to put it
        for features, response in responses:
            asked = (features if isinstance(features, str) else tuple(features), tuple(response.names))
            picks = targets.get(asked)
            if picks is None:
                picks = targets[asked] = self._picks(catalog, features, response.names, gathered)
            values, rows = response.values, _rows(response)
            for lo in range(0, rows, STEP_ROWS):
                for name, target in picks:
                    target.extend(values[name][lo:lo + STEP_ROWS])
                self.ungathered -= min(STEP_ROWS, rows - lo)
                yield
        for (features, answer), shape in kept_rows.items():
            picks = self._row_picks(catalog, features, answer, shape, kept)
            for lo in range(0, len(shape.rows), STEP_ROWS):
                step = shape.rows[lo:lo + STEP_ROWS]
                for bit, fields in picks:
                    for row in step:
                        if row[-1] >> bit & 1:
                            for at, raws in fields:
                                raws.append(row[at])
                self.ungathered -= len(step)
                yield
        for key in dict.fromkeys([*gathered, *kept]):
            window = self._window(*key)
            values = gathered.get(key, [])
            for lo in range(0, len(values), STEP_VALUES):
                window.add(values[lo:lo + STEP_VALUES])
                yield
            if key in kept:
                decode, raws = kept[key]
                for lo in range(0, len(raws), STEP_VALUES):
                    window.add(decode(raws[lo:lo + STEP_VALUES]))
                    yield

    def _picks(self, catalog: Catalog, features: Any, names: list[str],
               into: dict[tuple[str, str], list]) -> list[tuple[str, list]]:
        refs, _ = resolve(catalog, features)  # request order: the output names follow the refs one to one
        picks = []
        for ref, name in zip(refs, names):
            view, feature = ref.split(":", 1)
            if feature in self.profiles.get(view, ()):
                picks.append((name, into.setdefault((view, feature), [])))
        return picks

    def _row_picks(self, catalog: Catalog, features: Any, answer: RowAnswer, shape: KeptRows,
                   kept: Kept) -> list[tuple[int, list[tuple[int, list]]]]:
        """Per view (its bit in a kept row's `served`), where each profiled feature's value lies in a kept row
        and the list its raw values go to."""
        refs, _ = resolve(catalog, list(features) if isinstance(features, tuple) else features)  # request order
        per_view: dict[int, list[tuple[int, list]]] = {}
        for ref, (view, group, position, decode) in zip(refs, answer.sources()):
            feature = ref.split(":", 1)[1]
            if feature in self.profiles.get(view, ()):
                raws = kept.setdefault((view, feature), (decode, []))[1]
                per_view.setdefault(shape.bits[view], []).append((shape.starts[group] + position, raws))
        return list(per_view.items())

    def _window(self, view: str, feature: str) -> ServedWindow:
        profile = self.profiles[view][feature]
        window = self.windows.get((view, feature))
        if window is None or window.profile != profile:
            window = self.windows[(view, feature)] = ServedWindow(profile, self.window)
        return window

    def refresh(self) -> None:
        """Read the profiles again (on a worker thread); an unreachable registry keeps the last ones."""
        try:
            self.profiles = self.load_profiles()
        except Exception as exc:  # noqa: BLE001 - the registry database away: keep serving, say so
            logger.warning("cannot read the feature profiles (%s); drift is computed against the last ones read",
                           exc)

    async def run(self, catalog: Callable[[], Optional[Catalog]]) -> None:
        """Drain every second, read the profiles every `refresh_s`; `catalog` gives the client's current one."""
        loop = asyncio.get_running_loop()
        since_refresh = math.inf
        while True:
            if since_refresh >= self.refresh_s:
                await loop.run_in_executor(None, self.refresh)
                since_refresh = 0.0
            await asyncio.sleep(1.0)
            since_refresh += 1.0
            current = catalog()
            try:
                if current is not None:
                    await self._drain_in_steps(current)
            except Exception:  # a bug here must not stop the server: log it, drop the sample
                logger.exception("drift sampling failed")

    async def _drain_in_steps(self, catalog: Catalog) -> None:
        """`drain`, handing the event loop back after each of its steps, so that no request waits behind it for
        more than a step."""
        for _ in self.drain_steps(catalog):
            await asyncio.sleep(0)

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """View -> feature -> the profile served values are compared with, how many of this worker's last sampled
        values fall in each of its bins, and their PSI: what `/stats` shows under `drift`, for `featurectl report`
        to draw the served distribution beside the offline one."""
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (view, feature), window in sorted(self.windows.items()):
            if window.filled:
                out.setdefault(view, {})[feature] = {"psi": window.psi(), "values": window.filled,
                                                     "counts": window.counts.tolist(),
                                                     "profile": window.profile.to_json()}
        return out

    def collect(self) -> Iterator[Metric]:
        drift = GaugeMetricFamily("featurectl_feature_drift", "drift of served values from the latest backfill's "
                                  "profile (PSI over its bins)", labels=["view", "feature", "statistic"])
        values = GaugeMetricFamily("featurectl_feature_drift_values", "served values the drift is computed over "
                                   "(the last ones sampled, per worker)", labels=["view", "feature"])
        for (view, feature), window in sorted(self.windows.items()):
            psi = window.psi()
            if psi is not None:
                drift.add_metric([view, feature, "psi"], psi)
                values.add_metric([view, feature], window.filled)
        yield drift
        yield values

