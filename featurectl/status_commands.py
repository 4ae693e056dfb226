"""`featurectl status [--server URL] [--json]`: one table of the project's feature views and how fresh they are.

Per view: the last interval `materialize` recorded (Feast's materialization intervals, in the registry), the stream
writing it and its event-to-Redis lag (the stream's status file, `streaming.status`), the newest event time
written to Redis and its age (`redis_store.freshness`), and, from a running feature server's `/stats`, the share of
rows it served missing (NOT_FOUND) or older than the view's ttl (OUTSIDE_MAX_AGE).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from typing import Any, Optional

import click


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def duration(seconds: float) -> str:
    """A short human duration: `4.2s`, `12m05s`, `3h07m`, `2d04h` (negative: the value is ahead of the clock)."""
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 60:
        return f"{sign}{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3_600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86_400:
        return f"{sign}{whole // 3_600}h{whole % 3_600 // 60:02d}m"
    return f"{sign}{whole // 86_400}d{whole % 86_400 // 3_600:02d}h"


def _served(server: Optional[str]) -> Optional[dict[str, dict]]:
    """Rows served per view by the feature server at `server` (its `/stats`); None when none was given or it
    cannot be read (then a warning says why)."""
    if server is None:
        return None
    target = server.rstrip("/") + "/stats"
    try:
        with urllib.request.urlopen(target, timeout=5) as reply:
            return json.loads(reply.read()).get("served_rows", {})
    except (urllib.error.URLError, OSError, ValueError) as exc:
        click.secho(f"warning: cannot read {target} ({exc}); is `featurectl serve` running there? The served-missing "
                    "rate is left out", fg="yellow", err=True)
        return None


def _newest(cfg) -> Optional[dict[str, int]]:
    from redis_store.errors import RedisStoreError
    from redis_store.freshness import read_newest
    from redis_store.settings import RedisSettings

    try:
        return read_newest(RedisSettings.from_config(cfg), cfg.project)
    except RedisStoreError as exc:
        click.secho(f"warning: {exc}; the newest values' ages are left out", fg="yellow", err=True)
        return None


def view_rows(cfg, server: Optional[str]) -> list[dict[str, Any]]:
    """One dict per feature view in the registry: what `status` prints (`--json` prints these)."""
    from feast import FeatureStore

    from streaming.status import view_lags

    views = sorted(FeatureStore(config=cfg.feast_repo_config()).list_feature_views(), key=lambda v: v.name)
    lags, newest, served = view_lags(cfg.state_dir, cfg.project), _newest(cfg), _served(server)
    now = dt.datetime.now(dt.timezone.utc)
    rows = []
    for view in views:
        row: dict[str, Any] = {"view": view.name, "materialized": None, "stream": None, "newest_event_ms": None,
                               "newest_event_time": None, "newest_value_age_s": None, "served": None}
        if view.materialization_intervals:
            start, end = view.materialization_intervals[-1]
            row["materialized"] = [_utc(start).isoformat(), _utc(end).isoformat()]
        lag = lags.get(view.name)
        if lag is not None:
            row["stream"] = {"job": lag.job, "running": lag.running, "state": lag.state, "lag_p50_ms": lag.p50_ms,
                             "lag_p99_ms": lag.p99_ms}
        if newest is not None and view.name in newest:
            row["newest_event_ms"] = newest[view.name]
            row["newest_event_time"] = _iso(newest[view.name])
            row["newest_value_age_s"] = round(now.timestamp() - newest[view.name] / 1000, 3)
        if served is not None:
            row["served"] = served.get(view.name, {"rows": 0, "not_found": 0, "outside_max_age": 0,
                                                   "missing_rate": None})
        rows.append(row)
    return rows


def _cells(row: dict[str, Any], asked_server: bool) -> list[str]:
    materialized = "never"
    if row["materialized"]:
        start, end = (dt.datetime.fromisoformat(t) for t in row["materialized"])
        materialized = f"{start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}"
    stream, lag = "-", "-"
    if row["stream"]:
        stream = row["stream"]["state"]
        p50, p99 = row["stream"]["lag_p50_ms"], row["stream"]["lag_p99_ms"]
        if p50 is not None:
            lag = f"p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"
    newest = "-"
    if row["newest_event_time"]:
        newest = f"{row['newest_event_time']} ({duration(row['newest_value_age_s'])})"
    missing = "-"
    if row["served"] is not None:
        served = row["served"]
        missing = "no rows served" if not served["rows"] else (
            f"{100 * served['missing_rate']:.2f} % of {served['rows']:,} ({served['not_found']:,} not found, "
            f"{served['outside_max_age']:,} past ttl)")
    elif asked_server:
        missing = "?"
    return [row["view"], materialized, stream, lag, newest, missing]


HEADERS = ["view", "last materialized (UTC)", "stream", "stream lag (last min)", "newest value (age)",
           "served missing"]


def render(rows: list[dict[str, Any]], asked_server: bool) -> list[str]:
    table = [HEADERS] + [_cells(row, asked_server) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]


@click.command()
@click.option("--server", default=None, metavar="URL", help="a running `featurectl serve` (e.g. "
              "http://127.0.0.1:6566), whose /stats gives the share of rows served missing or past the ttl")
@click.option("--json", "as_json", is_flag=True, help="print the rows as JSON instead of a table")
@click.pass_obj
def status(ctx, server: Optional[str], as_json: bool) -> None:
    """How fresh each feature view is: last materialized interval, stream and lag, newest value's age, and the
    rows a feature server served missing."""
    cfg = ctx.config()
    rows = view_rows(cfg, server)
    if as_json:
        click.echo(json.dumps({"project": cfg.project, "views": rows}, indent=1))
        return
    click.secho(f"project `{cfg.project}`, registry {cfg.registry_url}", bold=True)
    if not rows:
        click.echo("no feature view registered: run `featurectl apply`")
        return
    header, *body = render(rows, server is not None)
    click.secho(header, bold=True)
    click.echo("\n".join(body))


COMMANDS = [status]
