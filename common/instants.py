"""Instants as every command reads them: ISO 8601 dates or date-times, in UTC unless they carry an offset."""

from __future__ import annotations

import datetime as dt

from common.errors import FeaturectlError


class InstantError(FeaturectlError, ValueError):
    """Text that is not a date or time."""


def parse_instant(text: str, name: str = "time") -> dt.datetime:
    """`2026-01-01`, `2026-01-01T06:00`, `2026-01-01T06:00:00.5Z` or with an offset -> an aware datetime in UTC;
    one without an offset is taken as UTC. `name` is the option or argument the text came from."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InstantError(f"{name}: `{text}` is not a date or time: write e.g. 2026-01-01 or 2026-01-01T06:00 "
                           "(UTC unless an offset is given)") from None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)
