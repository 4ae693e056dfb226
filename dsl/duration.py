"""Durations written as `30s`, `10m`, `1h`, `24h`, `7d`: parsed once, spelled for SQL and for names."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^(\d+)([smhd])$")


def parse_duration(text: str | timedelta, what: str, allow_zero: bool = False) -> timedelta:
    """`what` names the field for the error message, e.g. "feature view `asset_activity` window"."""
    from dsl.errors import WindowError

    if isinstance(text, timedelta):
        return text
    match = _PATTERN.match(str(text).strip()) if isinstance(text, str) else None
    if not match or (int(match.group(1)) == 0 and not allow_zero):
        raise WindowError(what, f"`{text}` is not a duration", "write a positive whole number and a unit "
                          "s, m, h or d, e.g. `10m`, `1h`, `24h`, `7d`")
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def format_duration(delta: timedelta) -> str:
    """The shortest spelling of a duration given as a timedelta: 3600 s -> `1h`."""
    seconds = int(delta.total_seconds())
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def milliseconds(delta: timedelta) -> int:
    """A duration in whole milliseconds, the unit of event times everywhere below the DSL."""
    return int(delta.total_seconds() * 1000)


_SQL_UNITS = (("DAY", 86400), ("HOUR", 3600), ("MINUTE", 60), ("SECOND", 1))


def sql_interval(delta: timedelta) -> str:
    """A Flink SQL interval in the largest whole unit, e.g. `INTERVAL '5' MINUTE` (precision given when > 2
    digits, since Flink's default leading precision is 2)."""
    seconds = int(delta.total_seconds())
    unit, size = next((u, n) for u, n in _SQL_UNITS if seconds % n == 0) if seconds else ("SECOND", 1)
    value = seconds // size
    precision = f"({len(str(value))})" if value >= 100 else ""
    return f"INTERVAL '{value}' {unit}{precision}"
