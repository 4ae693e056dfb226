"""Data-quality expectations: what a view's offline rows must satisfy before `materialize` serves them.

Declared next to the features, `FeatureView(..., expectations=[InRange("views_24h", min=0), ...])`, and checked
with the view when it is built: the feature must be one of the view's, of a type the check can take, and the
bounds must make sense; every error names the view, the expectation and what to write. The DSL only states
them; `batch.quality` evaluates them on every backfill's rows (null and NaN values are left to `NotNullRate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from common.errors import shown
from dsl.errors import DefinitionError, TypeMismatchError, backticked
from dsl.types import ValueType


def _is_number(value: object) -> bool:
    """A finite int or float (not a bool, and not an int too large for a float, which the checks compare with)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


@dataclass(frozen=True)
class Expectation:
    """A check of one feature of the view; subclasses say what holds and validate their own parameters."""

    feature: str

    @property
    def label(self) -> str:
        """How reports and messages name it, e.g. `InRange(views_24h, min=0)`."""
        params = ", ".join(f"{k}={shown(v)}" for k, v in self.params().items())
        return f"{type(self).__name__}({self.feature}{', ' if params else ''}{params})"

    def params(self) -> dict[str, Any]:
        return {}

    def spec(self) -> dict[str, Any]:
        """As JSON data, whole (a view's recorded definition holds it: `dsl.view_version`)."""
        return {"check": type(self).__name__, "feature": self.feature, **self.params()}

    def validate(self, where: str, kind: ValueType) -> None:
        """Raise a DefinitionError when the check cannot apply to a feature of type `kind`."""


def _numeric_only(expectation: Expectation, where: str, kind: ValueType) -> None:
    if not kind.is_numeric:
        raise TypeMismatchError(where, f"`{type(expectation).__name__}` needs a numeric feature, "
                                f"`{expectation.feature}` is {kind.value}",
                                "check strings and booleans with AllowedValues(...) or NotNullRate(...)")


@dataclass(frozen=True)
class InRange(Expectation):
    """Every value lies in [min, max]; either bound may be left out (not both)."""

    min: Optional[float] = None
    max: Optional[float] = None

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in (("min", self.min), ("max", self.max)) if v is not None}

    def validate(self, where: str, kind: ValueType) -> None:
        _numeric_only(self, where, kind)
        if self.min is None and self.max is None:
            raise DefinitionError(where, "has neither `min` nor `max`", "give at least one, e.g. min=0")
        for name, bound in self.params().items():
            if not _is_number(bound):
                raise DefinitionError(where, f"`{name}` {shown(bound)} is not a finite number",
                                      f"write e.g. {name}=0 or {name}=1.5")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise DefinitionError(where, f"`min` {self.min} is above `max` {self.max}", "swap them")


@dataclass(frozen=True)
class NotNullRate(Expectation):
    """At least the share `at_least` of the rows have a value (not null, not NaN)."""

    at_least: float = 1.0

    def params(self) -> dict[str, Any]:
        return {"at_least": self.at_least}

    def validate(self, where: str, kind: ValueType) -> None:
        if not _is_number(self.at_least) or not 0 <= self.at_least <= 1:
            raise DefinitionError(where, f"`at_least` {shown(self.at_least)} is not a share from 0 to 1",
                                  "write e.g. at_least=0.99")


_COUNTABLE = (ValueType.STRING, ValueType.INT32, ValueType.INT64, ValueType.BOOL)


@dataclass(frozen=True)
class AllowedValues(Expectation):
    """Every value is one of `values` (for string, integer and boolean features)."""

    values: Sequence[Any] = ()

    def __post_init__(self) -> None:
        if isinstance(self.values, (list, set, frozenset)):
            object.__setattr__(self, "values", tuple(self.values))

    def params(self) -> dict[str, Any]:
        return {"values": list(self.values) if isinstance(self.values, tuple) else self.values}

    def validate(self, where: str, kind: ValueType) -> None:
        if kind not in _COUNTABLE:
            raise TypeMismatchError(where, f"`AllowedValues` needs a string, integer or boolean feature, "
                                    f"`{self.feature}` is {kind.value}", "bound numbers with InRange(...)")
        if not isinstance(self.values, tuple) or not self.values:
            problem = "is empty" if isinstance(self.values, tuple) else f"{shown(self.values)} is not a list"
            raise DefinitionError(where, f"`values` {problem}",
                                  "write e.g. AllowedValues(\"style\", [\"realistic\", \"cartoon\"])")
        for value in self.values:
            if isinstance(value, bool) != (kind is ValueType.BOOL) or not isinstance(value, kind.python_types):
                raise TypeMismatchError(where, f"value {shown(value)} is not of type {kind.value}, the feature's",
                                        f"list {kind.value} values only")


@dataclass(frozen=True)
class MaxChange(Expectation):
    """The mean of the feature over the range's rows moves by at most `relative` (0.5: 50 %) from the mean the
    previous backfill of the view recorded: of the same range when there is one, else the latest."""

    relative: float = 0.5

    def params(self) -> dict[str, Any]:
        return {"relative": self.relative}

    def validate(self, where: str, kind: ValueType) -> None:
        _numeric_only(self, where, kind)
        if not _is_number(self.relative) or self.relative <= 0:
            raise DefinitionError(where, f"`relative` {shown(self.relative)} is not a positive number",
                                  "write e.g. relative=0.5 for at most 50 %")


KINDS = "InRange(...), NotNullRate(...), AllowedValues(...) or MaxChange(...)"


def check_expectations(view_where: str, expectations: Sequence[object], schema: dict[str, ValueType]) -> None:
    """Validate a view's expectations against its output `schema`; messages name the view and the expectation."""
    seen: set[Expectation] = set()
    for expectation in expectations:
        if not isinstance(expectation, Expectation):
            raise DefinitionError(view_where, f"expectation {shown(expectation)} is not an expectation",
                                  f"use {KINDS} from dsl")
        where = f"{view_where}, expectation `{expectation.label}`"
        if not isinstance(expectation.feature, str) or expectation.feature not in schema:
            raise DefinitionError(where, f"the view has no feature {backticked(expectation.feature)}",
                                  f"name one of: {', '.join(schema)}")
        expectation.validate(where, schema[expectation.feature])
        if expectation in seen:
            raise DefinitionError(where, "is listed twice", "list each expectation once")
        seen.add(expectation)
