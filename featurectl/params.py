"""Parameter types the commands share, so that every command reads a value the same way."""

from __future__ import annotations

import datetime as dt
from typing import Optional

import click

from common.instants import InstantError, parse_instant


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
