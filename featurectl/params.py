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
            return parse_instant(value, param.get_error_hint(ctx) if param is not None else "time")
        except InstantError as exc:
            self.fail(str(exc).split(": ", 1)[1], param, ctx)


INSTANT = Instant()
