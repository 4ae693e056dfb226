"""Row filters: `col("event_type") == "view"`, combined with `&`, `|`, `~`.

A filter is checked against the source schema when its feature view is built, compiles to a Flink SQL
predicate, and evaluates on plain Python rows (the oracle of the tests uses the same object, so the two can
never disagree about what a filter means). NULL follows SQL's three-valued logic: `evaluate` returns True,
False or None (unknown), and a row passes a filter only when it evaluates to True.

Literals are refused when SQL cannot hold them as Python means them: NaN and infinities (`x > nan` is no SQL),
integers beyond BIGINT, strings that are not valid Unicode. An expression has no truth value: Python's `and`,
`or`, `not`, `if` and chained comparisons would silently keep one side, so they raise instead.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Iterable, Mapping

from dsl.errors import DefinitionError, TypeMismatchError, UnknownColumnError, backticked
from dsl.sql import identifier_problem, quote_ident, quote_string
from dsl.types import ValueType

_COMPARISONS: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "eq": ("=", operator.eq), "ne": ("<>", operator.ne), "lt": ("<", operator.lt),
    "le": ("<=", operator.le), "gt": (">", operator.gt), "ge": (">=", operator.ge),
}


_BIGINT = range(-2**63, 2**63)


def check_literal(value: Any) -> None:
    """Refuse a filter literal that SQL cannot hold as Python means it."""
    where = f"filter literal {backticked(repr(value))}"
    if isinstance(value, float) and not math.isfinite(value):
        raise DefinitionError(where, "NaN and infinities cannot be compared in SQL",
                              "compare with a finite number, or use .is_null() for a missing value")
    if isinstance(value, int) and not isinstance(value, bool) and value not in _BIGINT:
        raise DefinitionError(where, "is beyond the range of a 64-bit integer", "compare with a smaller number")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise DefinitionError(where, "is not valid Unicode (a lone surrogate)", "use a valid str") from None
    if not isinstance(value, (bool, int, float, str)):
        raise DefinitionError(where, f"has type {type(value).__name__}, which a filter cannot compare",
                              "use a str, int, float or bool; .is_null() for a missing value")


def sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    return quote_string(value)


class Expr:
    """Base of filter expressions; subclasses implement the four methods below."""

    def columns(self) -> set[str]:
        raise NotImplementedError

    def to_sql(self) -> str:
        raise NotImplementedError

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType | None:
        """Validate against `schema`; return the expression's type (None for a literal)."""
        raise NotImplementedError

    def __and__(self, other: "Expr") -> "Expr":
        return BoolOp("AND", self, other)

    def __or__(self, other: "Expr") -> "Expr":
        return BoolOp("OR", self, other)

    def __invert__(self) -> "Expr":
        return Not(self)

    def __bool__(self) -> bool:
        raise DefinitionError(f"filter {self.to_sql()}", "has no truth value: Python's `and`, `or`, `not`, "
                              "`if` and chained comparisons would silently keep only one side",
                              "combine conditions with `&`, `|` and `~`, each in parentheses, e.g. "
                              "(col(\"a\") == 1) & (col(\"b\") > 2)")

    def __repr__(self) -> str:
        return self.to_sql()


class Col(Expr):
    def __init__(self, name: str):
        problem = identifier_problem(name)
        if problem:
            raise DefinitionError(f"col({backticked(name)})", f"is not a column name: {problem}",
                                  "name a column of the source")
        self.name = name

    def columns(self) -> set[str]:
        return {self.name}

    def to_sql(self) -> str:
        return quote_ident(self.name)

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        return row.get(self.name)

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        if self.name not in schema:
            raise UnknownColumnError(where, f"filter uses unknown column `{self.name}`",
                                     f"use one of the source's columns: {', '.join(sorted(schema))}")
        return schema[self.name]

    def _compare(self, op: str, other: Any) -> "Expr":
        return Compare(op, self, other if isinstance(other, Expr) else Lit(other))

    def __eq__(self, other: Any) -> "Expr":  # type: ignore[override]
        return self._compare("eq", other)

    def __ne__(self, other: Any) -> "Expr":  # type: ignore[override]
        return self._compare("ne", other)

    def __lt__(self, other: Any) -> "Expr":
        return self._compare("lt", other)

    def __le__(self, other: Any) -> "Expr":
        return self._compare("le", other)

    def __gt__(self, other: Any) -> "Expr":
        return self._compare("gt", other)

    def __ge__(self, other: Any) -> "Expr":
        return self._compare("ge", other)

    __hash__ = object.__hash__

    def isin(self, values: Iterable[Any]) -> "Expr":
        return IsIn(self, [Lit(v) for v in values])

    def is_null(self) -> "Expr":
        return IsNull(self)

    def not_null(self) -> "Expr":
        return Not(IsNull(self))


class Lit(Expr):
    def __init__(self, value: Any):
        check_literal(value)
        self.value = value

    def columns(self) -> set[str]:
        return set()

    def to_sql(self) -> str:
        return sql_literal(self.value)

    def evaluate(self, row: Mapping[str, Any]) -> Any:
        return self.value

    def check(self, schema: Mapping[str, ValueType], where: str) -> None:
        return None


def _check_literal_fits(col_type: ValueType | None, lit: Expr, where: str, col: Expr) -> None:
    if col_type is None or not isinstance(lit, Lit):
        return
    if isinstance(lit.value, bool) and col_type is not ValueType.BOOL or not isinstance(lit.value,
                                                                                          col_type.python_types):
        raise TypeMismatchError(where, f"filter compares {col_type.value} column {col!r} with "
                                f"{type(lit.value).__name__} {lit.value!r}",
                                f"compare it with a value of type {col_type.value}")


class Compare(Expr):
    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def to_sql(self) -> str:
        return f"{self.left.to_sql()} {_COMPARISONS[self.op][0]} {self.right.to_sql()}"

    def evaluate(self, row: Mapping[str, Any]) -> bool | None:
        left, right = self.left.evaluate(row), self.right.evaluate(row)
        if left is None or right is None:
            return None
        return bool(_COMPARISONS[self.op][1](left, right))

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        left_type = self.left.check(schema, where)
        right_type = self.right.check(schema, where)
        _check_literal_fits(left_type, self.right, where, self.left)
        _check_literal_fits(right_type, self.left, where, self.right)
        if left_type and right_type and left_type != right_type and not (left_type.is_numeric
                                                                          and right_type.is_numeric):
            raise TypeMismatchError(where, f"filter compares {left_type.value} {self.left!r} with "
                                    f"{right_type.value} {self.right!r}", "compare columns of the same type")
        return ValueType.BOOL


class IsIn(Expr):
    def __init__(self, col: Col, values: list[Lit]):
        self.col, self.values = col, values

    def columns(self) -> set[str]:
        return self.col.columns()

    def to_sql(self) -> str:
        return f"{self.col.to_sql()} IN ({', '.join(v.to_sql() for v in self.values)})"

    def evaluate(self, row: Mapping[str, Any]) -> bool | None:
        value = self.col.evaluate(row)
        return None if value is None else value in {v.value for v in self.values}

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        col_type = self.col.check(schema, where)
        for lit in self.values:
            _check_literal_fits(col_type, lit, where, self.col)
        return ValueType.BOOL


class IsNull(Expr):
    def __init__(self, inner: Expr):
        self.inner = inner

    def columns(self) -> set[str]:
        return self.inner.columns()

    def to_sql(self) -> str:
        return f"{self.inner.to_sql()} IS NULL"

    def evaluate(self, row: Mapping[str, Any]) -> bool:
        return self.inner.evaluate(row) is None

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        self.inner.check(schema, where)
        return ValueType.BOOL


def _require_bool(expr: Expr, schema: Mapping[str, ValueType], where: str) -> None:
    kind = expr.check(schema, where)
    if kind is not ValueType.BOOL:
        raise TypeMismatchError(where, f"filter part {expr!r} is not a condition",
                                "write a comparison such as col(\"event_type\") == \"view\"")


class BoolOp(Expr):
    def __init__(self, op: str, left: Expr, right: Expr):
        self.op, self.left, self.right = op, left, right

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def to_sql(self) -> str:
        return f"({self.left.to_sql()} {self.op} {self.right.to_sql()})"

    def evaluate(self, row: Mapping[str, Any]) -> bool | None:
        values = (self.left.evaluate(row), self.right.evaluate(row))
        decisive = self.op == "OR"
        if decisive in values:
            return decisive
        return None if None in values else not decisive

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        _require_bool(self.left, schema, where)
        _require_bool(self.right, schema, where)
        return ValueType.BOOL


class Not(Expr):
    def __init__(self, inner: Expr):
        self.inner = inner

    def columns(self) -> set[str]:
        return self.inner.columns()

    def to_sql(self) -> str:
        return f"NOT ({self.inner.to_sql()})"

    def evaluate(self, row: Mapping[str, Any]) -> bool | None:
        value = self.inner.evaluate(row)
        return None if value is None else not value

    def check(self, schema: Mapping[str, ValueType], where: str) -> ValueType:
        _require_bool(self.inner, schema, where)
        return ValueType.BOOL


def passes(expr: Expr | None, row: Mapping[str, Any]) -> bool:
    """Whether a row passes an optional filter, with SQL's WHERE semantics."""
    return expr is None or expr.evaluate(row) is True


def col(name: str) -> Col:
    """A reference to a source column, the start of every filter."""
    return Col(name)
