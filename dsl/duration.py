"""Durations written as `30s`, `10m`, `1h`, `24h`, `7d` (or as timedeltas of whole seconds): parsed once, bounded,
spelled for SQL and for names.

Every duration (window, tile, ttl, watermark delay, allowed lateness) is at most `MAX_DAYS` days, 100 years: far
beyond any sensible value, and every sum of them still fits Flink's INTERVAL types and an epoch-ms BIGINT.
"""

from __future__ import annotations

import re
from datetime import timedelta

MAX_DAYS = 36_500
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_MAX_SECONDS = MAX_DAYS * _UNITS["d"]
_PATTERN = re.compile(r"^(\d+)([smhd])$")
_HOW = ("write a positive whole number and a unit s, m, h or d, e.g. `10m`, `1h`, `24h`, `7d` (or a timedelta of "
        "whole seconds)")


def parse_duration(text: str | timedelta, what: str, allow_zero: bool = False) -> timedelta:
    """`what` names the object and field for the error message, e.g. "feature view `asset_activity` ttl"."""
    from dsl.errors import WindowError, backticked

    seconds = _whole_seconds(text)
    if seconds is None or seconds < 0 or (seconds == 0 and not allow_zero):
        raise WindowError(what, f"{backticked(str(text))} is not a duration", _HOW)
    if seconds > _MAX_SECONDS:
        raise WindowError(what, f"{backticked(str(text))} is longer than {MAX_DAYS}d (100 years), the longest duration "
                          "allowed", f"write at most `{MAX_DAYS}d`")
    return timedelta(seconds=seconds)


def _whole_seconds(text: str | timedelta) -> int | None:
    """The duration in whole seconds (None when it is not a duration), found without building a timedelta, which
    overflows past 999,999,999 days; a number too long to matter is taken as `_MAX_SECONDS` + 1."""
    if isinstance(text, timedelta):
        return None if text.microseconds else text.days * _UNITS["d"] + text.seconds
    match = _PATTERN.match(text.strip()) if isinstance(text, str) else None
    if not match:
        return None
    digits = match.group(1).lstrip("0") or "0"
    return int(digits) * _UNITS[match.group(2)] if len(digits) <= 12 else _MAX_SECONDS + 1


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
_MAX_SQL_FIELD = 2**31 - 1  # Flink holds an interval's leading field in an INT


def sql_interval(delta: timedelta) -> str:
    """A Flink SQL interval in the largest whole unit, e.g. `INTERVAL '5' MINUTE` (precision given when > 2
    digits, since Flink's default leading precision is 2); beyond an INT of seconds (68 years), DAY TO SECOND."""
    seconds = int(delta.total_seconds())
    unit, size = next((u, n) for u, n in _SQL_UNITS if seconds % n == 0) if seconds else ("SECOND", 1)
    value = seconds // size
    precision = f"({len(str(value))})" if value >= 100 else ""
    if value > _MAX_SQL_FIELD:
        days, rest = divmod(seconds, 86400)
        clock = f"{rest // 3600:02}:{rest // 60 % 60:02}:{rest % 60:02}"
        return f"INTERVAL '{days} {clock}' DAY({len(str(days))}) TO SECOND"
    return f"INTERVAL '{value}' {unit}{precision}"
