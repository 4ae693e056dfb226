"""`featurectl report [--server URL] [--out PATH]`: one HTML page of plots about the project's views
(`featurectl.report_page`): freshness over time, null rates, distributions offline and online, drift, serving
latency.

It reads the registry (the views and their ttl; the quality log: per backfill, the null rates and the profiles),
Redis (the freshness record and its history, `redis_store.freshness_history`) and, with `--server`, a running
feature server's `/stats` (latency percentiles, rows served, the sampled served values and their drift). What
cannot be read is named on the page and in a warning; the page is written all the same.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

import click


def _warn(notes: list[str], note: str) -> None:
    notes.append(note)
    click.secho(f"warning: {note}", fg="yellow", err=True)


def server_stats(server: str, notes: list[str]) -> Optional[dict[str, Any]]:
    target = server.rstrip("/") + "/stats"
    try:
        with urllib.request.urlopen(target, timeout=10) as reply:
            return json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        _warn(notes, f"cannot read {target} ({exc}); is `featurectl serve` running there? The serving and drift "
                     "plots are left out")
        return None


def _redis_state(cfg, notes: list[str]) -> Optional[tuple[dict[str, int], list]]:
    """The freshness record and its history; None when Redis does not answer (noted)."""
    from redis_store.errors import RedisStoreError
    from redis_store.freshness import read_newest
    from redis_store.freshness_history import read_history
    from redis_store.settings import RedisSettings

    settings = RedisSettings.from_config(cfg)
    try:
        return read_newest(settings, cfg.project), read_history(settings, cfg.project)
    except RedisStoreError as exc:
        _warn(notes, f"{exc}; the freshness plot is left out")
        return None


def gather(cfg, server: Optional[str]):
    """Everything the page shows, as `featurectl.report_page.ReportData`."""
    from feast import FeatureStore

    from common.quality_log import QualityLog
    from featurectl.report_page import ReportData, ViewData

    notes: list[str] = []
    feast_views = sorted(FeatureStore(config=cfg.feast_repo_config()).list_feature_views(), key=lambda v: v.name)
    quality_log = QualityLog(cfg.registry_url)
    try:
        views = [ViewData(v.name, v.ttl.total_seconds() if v.ttl else None,
                          quality_log.records(cfg.project, v.name)) for v in feast_views]
    finally:
        quality_log.close()
    redis_state = _redis_state(cfg, notes)
    newest, history = redis_state or ({}, [])
    stats = server_stats(server, notes) if server else None
    return ReportData(cfg.project, dt.datetime.now(dt.timezone.utc), views, history, newest, server, stats, notes,
                      redis_read=redis_state is not None)


@click.command()
@click.option("--server", default=None, metavar="URL", help="a running `featurectl serve` (e.g. "
              "http://127.0.0.1:6566): its /stats gives latency percentiles, rows served and the served values' "
              "distributions and drift")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the HTML file to write  [default: featurectl-report-PROJECT.html in the current folder]")
@click.pass_obj
def report(ctx, server: Optional[str], out: Optional[Path]) -> None:
    """One self-contained HTML page of plots: each view's freshness over time, null rates, distributions offline
    and online, drift scores, serving latency percentiles."""
    from featurectl.report_page import render

    cfg = ctx.config()
    data = gather(cfg, server)
    if not data.views:
        click.secho(f"warning: project `{cfg.project}` has no feature view: run `featurectl apply`", fg="yellow",
                    err=True)
    out = out or Path(f"featurectl-report-{cfg.project}.html")
    try:
        out.write_text(render(data), encoding="utf-8")
    except OSError as exc:
        raise click.ClickException(f"cannot write the report to {out} ({exc}); pass another `--out`") from exc
    click.echo(f"report of project `{cfg.project}` written to {out.resolve()}")


COMMANDS = [report]
