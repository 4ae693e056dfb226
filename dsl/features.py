"""Features of a view: windowed aggregations and plain attributes. Output names are made here and only here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Optional, Sequence

from dsl.aggregates import OPS
from dsl.duration import format_duration, parse_duration
from dsl.errors import DefinitionError, DuplicateNameError
from dsl.expr import Expr


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
    """

    op: str
    column: Optional[str] = None
    windows: Sequence[str | timedelta] = ("1h",)
    filter: Optional[Expr] = None
    name: Optional[str] = None
    description: str = ""
    parsed_windows: tuple[Window, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"aggregation `{self.name or self.column or self.op}`"
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

    @property
    def base_name(self) -> str:
        if self.name:
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

    @property
    def feature_names(self) -> list[str]:
        return [self.name or self.column]


Feature = Aggregation | Attribute

