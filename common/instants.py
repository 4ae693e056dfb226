"""Instants as every command reads them: ISO 8601 dates or date-times, in UTC unless they carry an offset; and the
checks every command makes of them (a range that holds no instant, an instant past the calendar)."""

from __future__ import annotations

import datetime as dt

from common.errors import FeaturectlError


class InstantError(FeaturectlError, ValueError):
    """Text that is not a date or time, or an instant or range that cannot be used; `reason` says so without naming
    where the value came from."""

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.reason = reason


def from_epoch_ms(ms: float, name: str = "event time") -> dt.datetime:
    """An event time (ms since the epoch) as an aware datetime in UTC; one past the calendar (years 1 to 9999),
    often a time in another unit, is an `InstantError` naming `name`."""
    try:
        return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise InstantError(name, f"{ms:.0f} ms since the epoch is outside the calendar (years 1 to 9999): "
                                 "give epoch milliseconds (seconds x 1000, microseconds / 1000)") from None


def as_utc(value: dt.datetime) -> dt.datetime:
    """Aware UTC; a naive value is taken as UTC (SQLite hands back the naive UTC wall time it was given)."""
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def format_epoch_ms(ms: float) -> str:
    """An event time for a message: ISO 8601 in UTC (ms precision), or its number of ms when it is outside the
    calendar, since a message about a bad time must not fail on it."""
    try:
        return from_epoch_ms(ms).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except InstantError:
        return f"{ms:.0f} ms since the epoch"


def parse_instant(text: str, name: str = "time") -> dt.datetime:
    """`2026-01-01`, `2026-01-01T06:00`, `2026-01-01T06:00:00.5Z` or with an offset -> an aware datetime in UTC;
    one without an offset is taken as UTC. `name` is the option or argument the text came from."""
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InstantError(name, f"`{text}` is not a date or time: write e.g. 2026-01-01 or 2026-01-01T06:00 "
                                 "(UTC unless an offset is given; years 1 to 9999)") from None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:  # 9999-12-31T23:00-02:00 is in the year 10000 in UTC
        raise InstantError(name, f"`{text}` is outside the calendar (years 1 to 9999) once in UTC: give a time "
                                 "within it") from None


def shifted(value: dt.datetime, delta: dt.timedelta, name: str) -> dt.datetime:
    """`value + delta`, or an `InstantError` naming `name` when that leaves the calendar (END - ttl from
    0001-01-01, say) rather than Python's bare OverflowError."""
    try:
        return value + delta
    except OverflowError:
        raise InstantError(name, f"{value.isoformat()} {'+' if delta >= dt.timedelta(0) else '-'} {abs(delta)} is "
                                 "outside the calendar (years 1 to 9999): give a time nearer the present") from None


def check_range(start: dt.datetime, end: dt.datetime, names: tuple[str, str] = ("start", "end"), *,
                closed: bool = False) -> None:
    """Refuse a range that holds no instant: `start` after `end`, or equal to it when the range is half-open
    ([start, end), a backfill's) rather than `closed` ([start, end], a materialization's)."""
    if start > end or (start == end and not closed):
        relation = "after" if start > end else "the same instant as"
        wanted = "at or before" if closed else "before"
        raise InstantError("empty range", f"{names[0]} {start.isoformat()} is {relation} {names[1]} "
                                          f"{end.isoformat()}: give a {names[0]} {wanted} the {names[1]}")
