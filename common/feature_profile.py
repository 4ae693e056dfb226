"""A feature's profile (the share of its values in each of a few bins) and the drift between two of them.

Profiles are made offline, from the rows a backfill wrote (`batch.quality`), and compared online with the
values the feature server sampled (`serving.drift`); both sides put a value in a bin with `FeatureProfile.bins`.
- Numbers: the bins are cut at the deciles of the offline values (cuts that coincide are merged, so a feature
  that is mostly 0 gets one bin for 0); a value equal to a cut falls in the lower bin, and values below the
  first cut or above the last fall in the end bins, so the bins cover every number.
- Strings and booleans: one bin per value among the `TOP_CATEGORIES` most frequent, one bin for all others
  (values never seen offline land there).

The drift statistic is the population stability index, PSI = sum over bins of (a - e) * ln(a / e), where e and a
are the offline and the served shares of the bin, each floored at `FLOOR` so that an empty bin counts as a small
share rather than making it infinite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

QUANTILES = np.linspace(0.1, 0.9, 9)
TOP_CATEGORIES = 20
FLOOR = 1e-4
NUMERIC, CATEGORICAL = "numeric", "categorical"


@dataclass(frozen=True)
class FeatureProfile:
    """`kind` numeric: `cuts` between the bins; categorical: `categories`, each a bin, and the last bin for
    the rest. `shares`: the offline share of each bin (summing to 1)."""

    kind: str
    shares: tuple[float, ...]
    cuts: tuple[float, ...] = ()
    categories: tuple[Any, ...] = ()

    def bins(self, values: Sequence[Any]) -> np.ndarray:
        """The bin of each value (values must not be null; NaN counts as no value and must be left out too)."""
        if self.kind == NUMERIC:
            return np.searchsorted(np.asarray(self.cuts), np.asarray(values, dtype=np.float64), side="left")
        index = {category: i for i, category in enumerate(self.categories)}
        other = len(self.categories)
        return np.fromiter((index.get(v, other) for v in values), dtype=np.int64, count=len(values))

    def psi(self, counts: np.ndarray) -> float:
        """PSI of served values, given as counts per bin, against this profile."""
        expected = np.maximum(np.asarray(self.shares), FLOOR)
        actual = np.maximum(counts / counts.sum(), FLOOR)
        return float(np.sum((actual - expected) * np.log(actual / expected)))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shares": list(self.shares), "cuts": list(self.cuts),
                "categories": list(self.categories)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "FeatureProfile":
        return cls(data["kind"], tuple(data["shares"]), tuple(data["cuts"]), tuple(data["categories"]))


def _shares(bins: np.ndarray, weights: np.ndarray, n_bins: int) -> tuple[float, ...]:
    totals = np.bincount(bins, weights=weights, minlength=n_bins)
    return tuple((totals / totals.sum()).tolist())


def numeric_profile(values: np.ndarray, weights: np.ndarray) -> FeatureProfile:
    """Bins cut at the weighted deciles of `values` (finite numbers, at least one; weights positive)."""
    cuts = np.unique(np.quantile(values.astype(np.float64), QUANTILES, weights=weights, method="inverted_cdf"))
    profile = FeatureProfile(NUMERIC, (), tuple(cuts.tolist()))
    return FeatureProfile(NUMERIC, _shares(profile.bins(values), weights, len(cuts) + 1), profile.cuts)


def categorical_profile(seen: Sequence[Any], codes: np.ndarray, weights: np.ndarray) -> FeatureProfile:
    """The `TOP_CATEGORIES` values of most weight each a bin (ties in value order), the rest one bin; the values
    are given dictionary-encoded: `seen` the distinct ones, `codes` each row's index into it."""
    totals = np.bincount(codes, weights=weights, minlength=len(seen))
    top = np.array(sorted(range(len(seen)), key=lambda i: (-totals[i], seen[i]))[:TOP_CATEGORIES], dtype=np.int64)
    bin_of_code = np.full(len(seen), len(top), dtype=np.int64)
    bin_of_code[top] = np.arange(len(top))
    shares = _shares(bin_of_code[codes], weights, len(top) + 1)
    return FeatureProfile(CATEGORICAL, shares, (), tuple(seen[i] for i in top.tolist()))
