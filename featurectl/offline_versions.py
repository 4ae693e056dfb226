"""Before `featurectl materialize` writes a view's offline rows to Redis: are they of the version applied?

A view's rows in [START, END] must come from backfills of the view's applied version (`common.version_log`,
`batch.backfill_log`), and the repo must define that version: otherwise Redis would serve values of one
definition under the name of another. Both are refused, for every view at once and before anything is written,
unless the view is named with `--allow-stale`. Ranges backfilled before versions were recorded, and views applied
before that, are not checked (a warning says so). What passes is recorded as the version of the view's online
values, which the feature server compares with the applied one.

A run that switches a view's online values to another version, or replaces values that `--allow-stale` accepted,
first clears them (`replaced`): Redis keeps a row only when it is newer than the one it holds, so the new rows at
the same instants would be skipped, and entities the range leaves out would go on serving the old values.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Sequence

import click

from batch.backfill_log import BackfillLog, VersionedSpan
from common.config import ProjectConfig
from common.errors import FeaturectlError
from common.version_log import VersionLog
from dsl.compile_flink import SourceSettings, compile_view
from dsl.feature_view import FeatureView
from dsl.view_version import view_version
from featurectl.repo_plan import backfill_command


class StaleOfflineError(FeaturectlError):
    """Offline rows, or the repo's definition, are of another version than the one applied."""


@dataclass(frozen=True)
class Materializing:
    """A view about to be materialized over [start, end]."""

    view: FeatureView
    start: dt.datetime
    end: dt.datetime


def _overlapping(spans: list[VersionedSpan], start: dt.datetime, end: dt.datetime) -> list[VersionedSpan]:
    return [s for s in spans if s.start <= end and s.end > start]


def _problems(job: Materializing, applied: str, repo_version: str, spans: list[VersionedSpan],
              cli: str) -> list[str]:
    name = job.view.name
    out = []
    if repo_version != applied:
        out.append(f"the repo defines version {repo_version} of `{name}` but version {applied} is applied: run "
                   f"`{cli} plan` and `{cli} apply` first")
    stale = [s for s in spans if s.version is not None and s.version != applied]
    if stale:
        commands = "; ".join(f"`{backfill_command(s.start, s.end, name, cli)}` (version {s.version})" for s in stale)
        out.append(f"offline rows of `{name}` in the range were backfilled by another version than the applied "
                   f"{applied}: re-backfill them: {commands}")
    return out


@dataclass
class Checked:
    """What passed: the applied version of each view with one recorded, and the views whose problems
    `--allow-stale` waived (their online values will be offline rows of another version)."""

    versions: dict[str, str] = field(default_factory=dict)
    waived: set[str] = field(default_factory=set)


def check_offline_versions(cfg: ProjectConfig, version_log: VersionLog, jobs: Sequence[Materializing],
                           allow_stale: Sequence[str], cli: str = "featurectl") -> Checked:
    """Check every job; raises `StaleOfflineError` listing every problem of the views not in `allow_stale`, and
    warns of those it waives (`cli` starts the commands the messages name)."""
    unknown = set(allow_stale) - {job.view.name for job in jobs}
    if unknown:
        raise click.BadParameter(f"{', '.join(sorted(unknown))}: not a view this run materializes",
                                 param_hint="--allow-stale")
    settings = SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_storage)
    applied = version_log.applied(cfg.project)
    checked, problems, refused = Checked(), [], []
    backfill_log = BackfillLog(cfg.registry_url)
    try:
        for job in jobs:
            name = job.view.name
            if name not in applied:
                click.secho(f"warning: no version of `{name}` is recorded (applied before featurectl recorded "
                            "versions): its offline rows are not checked; `featurectl apply` records it",
                            fg="yellow", err=True)
                continue
            spans = _overlapping(backfill_log.versions(cfg.project, name), job.start, job.end)
            if any(s.version is None for s in spans):
                click.secho(f"warning: part of `{name}`'s offline rows in the range was backfilled before versions "
                            "were recorded: not checked", fg="yellow", err=True)
            checked.versions[name] = applied[name].version
            found = _problems(job, applied[name].version, view_version(job.view, compile_view(job.view, settings)),
                              spans, cli)
            if found and name in allow_stale:
                checked.waived.add(name)
                click.secho(f"warning: --allow-stale {name}: materializing although " + "; ".join(found),
                            fg="yellow", err=True)
            elif found:
                problems += found
                refused.append(name)
    finally:
        backfill_log.close()
    if problems:
        flags = " ".join(f"--allow-stale {name}" for name in refused)
        raise StaleOfflineError("; ".join(problems) + f"; or pass {flags} to materialize them anyway")
    return checked


def replaced(version_log: VersionLog, project: str) -> dict[str, str]:
    """View -> why, for each view whose online values a materialize replaces whole: they are of another version
    than the applied one, or offline rows of another version accepted with `--allow-stale` (replaced unless the
    run accepts stale rows of the view again)."""
    out = {view: f"its online values are of version {written.version}, version {applied.version} is applied"
           for view, (written, applied) in version_log.conflicts(project).items()}
    for view, written in version_log.online(project).items():
        if written.stale_accepted:
            out.setdefault(view, f"its online values are offline rows of another version accepted with "
                                 f"--allow-stale at {written.written_at:%Y-%m-%d %H:%M}Z")
    return out


def clear_online_values(store, feast_view, why: str) -> None:
    """Delete the view's values from Redis (Feast's own `delete_table`) before a materialize writes them anew, and
    its newest event time with them."""
    from feast.infra.online_stores.redis import RedisOnlineStore

    from redis_store.freshness import forget_newest
    from redis_store.settings import RedisSettings

    RedisOnlineStore().delete_table(store.config, feast_view)
    forget_newest(RedisSettings.from_feast(store.config.online_store), store.config.project, [feast_view.name])
    click.echo(f"{feast_view.name}: {why}: cleared them first; entities without a row in the range read as not "
               "found until materialized")
