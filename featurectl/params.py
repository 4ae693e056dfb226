"""Parameter types the commands share, so that every command reads a value the same way."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import click

from common.errors import FeaturectlError
from common.instants import InstantError, parse_instant
from dsl.types import INT_RANGES, ValueType


class Instant(click.ParamType):
    """An ISO date or date-time (`common.instants.parse_instant`: UTC unless an offset is given)."""

    name = "instant"

    def convert(self, value, param: Optional[click.Parameter], ctx: Optional[click.Context]) -> dt.datetime:
        if isinstance(value, dt.datetime):
            return value
        try:
            return parse_instant(value)
        except InstantError as exc:  # click names the option or argument itself
            self.fail(exc.reason, param, ctx)


INSTANT = Instant()


def join_key_value(value: str, kind: ValueType, name: str) -> Any:
    """A join key's value as the command line gives it (text), typed as the key: a whole number for an integer
    key."""
    if kind is ValueType.STRING:
        return value
    try:
        number = int(value)
    except ValueError:
        raise FeaturectlError(f"join key `{name}` is {kind.name}: `{value}` is not a whole number") from None
    low, high = INT_RANGES[kind]
    if not low <= number <= high:
        raise FeaturectlError(f"join key `{name}` is {kind.name}: `{value}` is out of its range [{low}, {high}]")
    return number
