"""Instants as every command reads them: ISO 8601 dates or date-times, in UTC unless they carry an offset."""

from __future__ import annotations

import datetime as dt

from common.errors import FeaturectlError


class InstantError(FeaturectlError, ValueError):
    """Text that is not a date or time; `reason` says so without naming where the text came from."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.reason = reason


def from_epoch_ms(ms: float) -> dt.datetime:
    """An event time (ms since the epoch) as an aware datetime in UTC."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def parse_instant(text: str, name: str = "time") -> dt.datetime:
    """`2026-01-01`, `2026-01-01T06:00`, `2026-01-01T06:00:00.5Z` or with an offset -> an aware datetime in UTC;
    one without an offset is taken as UTC. `name` is the option or argument the text came from."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InstantError(name, f"`{text}` is not a date or time: write e.g. 2026-01-01 or 2026-01-01T06:00 "
                                 "(UTC unless an offset is given)") from None
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)
