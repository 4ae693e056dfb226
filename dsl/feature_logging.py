"""Feature logging of a feature service: which share of its served requests `featurectl serve` writes to Parquet.

Declared next to the service (`FeatureService(..., logging=FeatureLogging(sample_rate=0.1))`) and compiled to
Feast's own `LoggingConfig` with a `FileLoggingDestination` under the data folder (`dsl.compile_feast`), so the
registry says where the logs are and Feast's offline store reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsl.errors import DefinitionError, backticked


@dataclass(frozen=True)
class FeatureLogging:
    """`sample_rate`: the fraction of requests logged, in (0, 1]; each logged request writes one row per entity."""

    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        rate = self.sample_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) \
                or not 0 < rate <= 1:
            raise DefinitionError("feature logging", f"sample_rate {backticked(repr(rate))} is not a fraction of "
                                  "requests", "give a number in (0, 1], e.g. sample_rate=0.1 logs one request in ten")
        object.__setattr__(self, "sample_rate", float(rate))
