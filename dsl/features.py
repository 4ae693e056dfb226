"""Features of a view: windowed aggregations and plain attributes. Output names are made here and only here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional, Sequence

from dsl.aggregates import OPS
from dsl.duration import format_duration, parse_duration
from dsl.errors import DefinitionError, DuplicateNameError, backticked
from dsl.expr import Expr
from dsl.names import check_name


@dataclass(frozen=True)
class Window:
    """A sliding window ending at the serving instant; `label` is how it reads in feature names."""

    label: str
    length: timedelta

    @classmethod
    def parse(cls, text: str | timedelta, where: str) -> "Window":
        length = parse_duration(text, where)
        label = text.strip() if isinstance(text, str) else format_duration(length)
        return cls(label, length)


@dataclass(frozen=True)
class Aggregation:
    """`op` over `column` (or over rows, for `count`) in each of `windows`, optionally on filtered rows.

    Feature names are `{name}_{window}`; `name` defaults to `{column}_{op}` (`count` for a plain row count).
    Two aggregations compare by their filters' SQL: an expression has no truth value for `==` to return.
    """

    op: str
    column: Optional[str] = None
    windows: Sequence[str | timedelta] = ("1h",)
    filter: Optional[Expr] = field(default=None, compare=False)
    name: Optional[str] = None
    description: str = ""
    parsed_windows: tuple[Window, ...] = field(init=False, repr=False, compare=False)
    filter_sql: Optional[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"aggregation {backticked(self.base_name)}"
        if self.op not in OPS:
            raise DefinitionError(where, f"unknown op `{self.op}`", f"use one of: {', '.join(OPS)}")
        if OPS[self.op].needs_column and not self.column:
            raise DefinitionError(where, f"`{self.op}` needs a column", f"pass column=\"...\" to {self.op}")
        if self.filter is not None and not isinstance(self.filter, Expr):
            raise DefinitionError(where, f"filter must be an expression, got {type(self.filter).__name__}",
                                  "build it with col(...), e.g. col(\"event_type\") == \"view\"")
        if isinstance(self.windows, (str, timedelta)) or not self.windows:
            raise DefinitionError(where, "windows must be a non-empty list", "e.g. windows=[\"1h\", \"24h\"]")
        parsed = tuple(Window.parse(w, f"{where} window") for w in self.windows)
        seen: dict[timedelta, str] = {}
        for window in parsed:
            if window.length in seen:
                raise DuplicateNameError(where, f"windows `{seen[window.length]}` and `{window.label}` are the "
                                         "same length", "list each window once")
            seen[window.length] = window.label
        object.__setattr__(self, "parsed_windows", parsed)
        object.__setattr__(self, "filter_sql", None if self.filter is None else self.filter.to_sql())
        _check_feature_names(where, self.name, self.feature_names)

    @property
    def base_name(self) -> str:
        if self.name is not None:
            return self.name
        return f"{self.column}_{self.op}" if self.column else "count"

    def feature_name(self, window: Window) -> str:
        return f"{self.base_name}_{window.label}"

    @property
    def feature_names(self) -> list[str]:
        return [self.feature_name(w) for w in self.parsed_windows]


@dataclass(frozen=True)
class Attribute:
    """A plain (non-aggregated) feature: the entity's latest value of `column`, e.g. a bounding box side."""

    column: str
    name: Optional[str] = None
    description: str = ""

    def __post_init__(self) -> None:
        _check_feature_names(f"attribute {backticked(self.column)}", self.name, self.feature_names)

    @property
    def feature_names(self) -> list[str]:
        return [self.column if self.name is None else self.name]


def _check_feature_names(where: str, name: Optional[str], feature_names: list[str]) -> None:
    """Feature names follow the naming rule; a name made from the column says how to give another one."""
    if name is not None:
        check_name(where, "name", name)
    other_fix = "" if name is not None else ", or give the feature a name=\"...\" that does"
    for feature_name in feature_names:
        check_name(where, "feature name", feature_name, other_fix)


Feature = Aggregation | Attribute

