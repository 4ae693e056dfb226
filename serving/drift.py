"""Drift of served values from the training-set profile, per feature, for `/metrics`.

The request path only hands a sample of its responses over: one request in `stride`, while this second's budget of
entity rows (`rows_per_second`) lasts, where the stride is last second's rows over the budget, so that the sample
spreads over the second rather than taking its first requests. A one-row answer is kept as its Redis replies
(a tuple of references, nothing decoded); a larger one as the response already built. Once a second a background
task takes the list, gathers the values of each profiled feature across the responses (in slices, handing the
event loop back between them), then per feature decodes the kept replies' values in one call, puts the values in the
profile's bins in one numpy call and keeps the bins of the last `window` values served (a ring buffer with running
counts), handing the event loop back between features. At scrape time each feature's PSI against its profile is a sum
over about ten bins.

Profiles are the latest backfill's of each view (`common.quality_log`), read from the registry database at start
and every `refresh_s` on a worker thread; when a newer backfill brings new bins, that feature's window starts
afresh. With several workers, each reports the values it served (its share of the traffic, a sample as good).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Union

import numpy as np
from prometheus_client.core import GaugeMetricFamily, Metric

from common.feature_profile import FeatureProfile
from serving.catalog import Catalog
from serving.plan import resolve
from serving.result import OnlineFeatures, ViewRows
from serving.row_answer import RowAnswer

logger = logging.getLogger(__name__)

ROWS_PER_SECOND = 256
WINDOW = 10_000
REFRESH_S = 60.0
SLICE = 64  # responses gathered between two returns to the event loop


class SampledRow(NamedTuple):
    """A one-row answer as the request path keeps it: its plan's writer, its Redis replies and each view's row
    (missing or stale rows served no value)."""

    answer: RowAnswer
    replies: list
    views: Mapping[str, ViewRows]


Sampled = Union[OnlineFeatures, SampledRow]
Kept = dict[tuple[str, str], tuple[Callable, list]]  # (view, feature) -> its decoder, raw values of kept replies


def _values(key: tuple[str, str], gathered: dict[tuple[str, str], list], kept: Kept) -> list:
    """The values gathered of one feature: those of built responses, then those of kept replies, decoded here."""
    values = gathered.get(key, [])
    if key in kept:
        decode, raws = kept[key]
        values.extend(decode(raws))
    return values


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
        self.pending: list[tuple[Any, Sampled]] = []
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
            self.budget -= len(next(iter(response.entities.values()), ()))
            self.pending.append((features, response))

    def offer_row(self, features: Any, answer: RowAnswer, replies: list, views: Mapping[str, ViewRows]) -> None:
        """`offer` for a one-row answer written by `answer`: its replies are decoded by the drain, not here."""
        if self.budget > 0:
            self.budget -= 1
            self.pending.append((features, SampledRow(answer, replies, views)))

    def drain(self, catalog: Catalog) -> None:
        """Bin what was sampled since the last drain and renew the budget (at once; `run` does it in slices)."""
        gathered: dict[tuple[str, str], list] = {}
        kept: Kept = {}
        self.gather(catalog, self.take(), gathered, kept)
        for key in dict.fromkeys([*gathered, *kept]):
            self._window(*key).add(_values(key, gathered, kept))

    def take(self) -> list[tuple[Any, Sampled]]:
        """The responses sampled since the last call; the budget starts again, the stride follows the rows seen."""
        taken, self.pending, self.budget = self.pending, [], self.rows_per_second
        self.stride, self.seen, self.due = max(1, self.seen // self.rows_per_second), 0, 0
        return taken

    def gather(self, catalog: Catalog, responses: list[tuple[Any, Sampled]], into: dict[tuple[str, str], list],
               kept: Kept) -> None:
        """Append the values of each profiled feature of `responses` to `into[(view, feature)]`, those of kept
        replies still encoded to `kept[(view, feature)]` (decoded by `_values`, one call per feature)."""
        targets: dict[tuple, list] = {}  # per request shape: what to pick, and where to put it
        for features, response in responses:
            asked = features if isinstance(features, str) else tuple(features)
            if isinstance(response, SampledRow):
                shape = (asked, response.answer)
                picks = targets.get(shape)
                if picks is None:
                    picks = targets[shape] = self._row_picks(catalog, features, response.answer, kept)
                replies, views = response.replies, response.views
                for view, fields in picks:
                    rows = views[view]
                    if not rows.missing and not rows.stale:
                        for group, position, raws in fields:
                            raws.append(replies[group][position])
                continue
            shape = (asked, tuple(response.names))
            picks = targets.get(shape)
            if picks is None:
                picks = targets[shape] = self._picks(catalog, features, response.names, into)
            values = response.values
            for name, target in picks:
                target.extend(values[name])

    def _picks(self, catalog: Catalog, features: Any, names: list[str],
               into: dict[tuple[str, str], list]) -> list[tuple[str, list]]:
        refs, _ = resolve(catalog, features)  # request order: the output names follow the refs one to one
        picks = []
        for ref, name in zip(refs, names):
            view, feature = ref.split(":", 1)
            if feature in self.profiles.get(view, ()):
                picks.append((name, into.setdefault((view, feature), [])))
        return picks

    def _row_picks(self, catalog: Catalog, features: Any, answer: RowAnswer,
                   kept: Kept) -> list[tuple[str, list[tuple[int, int, list]]]]:
        """Per view, where each profiled feature's value lies in the replies and the list its raw values go to."""
        refs, _ = resolve(catalog, features)  # request order, as the writer's sources
        per_view: dict[str, list[tuple[int, int, list]]] = {}
        for ref, (view, group, position, decode) in zip(refs, answer.sources()):
            feature = ref.split(":", 1)[1]
            if feature in self.profiles.get(view, ()):
                raws = kept.setdefault((view, feature), (decode, []))[1]
                per_view.setdefault(view, []).append((group, position, raws))
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
                    await self._drain_in_slices(current)
            except Exception:  # a bug here must not stop the server: log it, drop the sample
                logger.exception("drift sampling failed")

    async def _drain_in_slices(self, catalog: Catalog) -> None:
        """`drain`, handing the event loop back between slices of responses and between features, so that no
        request waits behind it for more than a slice."""
        taken, gathered, kept = self.take(), {}, {}
        for lo in range(0, len(taken), SLICE):
            self.gather(catalog, taken[lo:lo + SLICE], gathered, kept)
            await asyncio.sleep(0)
        for key in dict.fromkeys([*gathered, *kept]):
            self._window(*key).add(_values(key, gathered, kept))
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

