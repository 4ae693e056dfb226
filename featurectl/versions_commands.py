"""`featurectl versions [--view V]`: each view's applied versions over time, the version of its online values,
and the version of each backfilled range of its offline table, with the backfills that would bring it level."""

from __future__ import annotations

import datetime as dt
from typing import Optional

import click

from common.errors import FeaturectlError


def _when(value: dt.datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S}Z"


def _history_lines(history: list) -> list[str]:
    from dsl.view_version import changes

    lines, previous = [], None
    for record in history:
        if record.version is None:
            lines.append(f"    {_when(record.applied_at)}  removed")
        else:
            changed = [c.path for c in changes(previous, record.definition)] if previous else []
            lines.append(f"    {_when(record.applied_at)}  {record.version}"
                         + (f"  (changed: {', '.join(changed)})" if changed else ""))
        previous = record.definition
    return lines


def _view_lines(name: str, history: list, online, spans: list, applied: Optional[str], cli: str) -> list[str]:
    from featurectl.repo_plan import backfill_command

    lines = [f"feature view {name}: " + (f"version {applied} applied" if applied else "not applied"), "  applied:"]
    lines += _history_lines(history)
    if online is not None:
        refused = "; the feature server refuses it" if applied and online.version != applied else ""
        lines.append(f"  online values: version {online.version} ({online.written_by} at "
                     f"{_when(online.written_at)}){refused}")
    if spans:
        lines.append("  offline table:")
    for span in spans:
        line = f"    [{_when(span.start)}, {_when(span.end)})  version {span.version or 'not recorded'}"
        if applied and span.version != applied:
            line += f"  re-backfill: {backfill_command(span.start, span.end, name, cli)}"
        lines.append(line)
    return lines


def _defined_views(cfg) -> list[str]:
    from dsl.repo import load_repo

    return sorted(view.name for view in load_repo(cfg.repo_path).views)


@click.command()
@click.option("--view", "view_name", default=None, help="only this feature view")
@click.pass_obj
def versions(ctx, view_name: Optional[str]) -> None:
    """Show the version history of each feature view and which version its online and offline values are of."""
    from batch.backfill_log import BackfillLog
    from common.version_log import VersionLog

    cfg = ctx.config()
    version_log, backfill_log = VersionLog(cfg.registry_url), BackfillLog(cfg.registry_url)
    try:
        history = version_log.history(cfg.project, view_name)
        applied, online = version_log.applied(cfg.project), version_log.online(cfg.project)
        names = list(dict.fromkeys(record.view for record in history))
        if not names and view_name:
            defined = _defined_views(cfg)
            if view_name not in defined:
                raise FeaturectlError(f"no version recorded for view `{view_name}`, and the repo defines no view by "
                                      f"that name: its views are {', '.join(defined) or 'none'}")
        if not names:
            click.echo(f"no version recorded for {f'view `{view_name}`' if view_name else 'any view'} of project "
                       f"`{cfg.project}`: `featurectl apply` records them")
        for name in names:
            current = applied.get(name)
            click.echo("\n".join(_view_lines(name, [r for r in history if r.view == name], online.get(name),
                                             backfill_log.versions(cfg.project, name),
                                             current.version if current else None, ctx.command_prefix())))
    finally:
        version_log.close()
        backfill_log.close()


COMMANDS = [versions]
