"""Data-quality results on the command line: what `featurectl backfill` prints, and the check `materialize` makes
before it writes anything.

`materialize` refuses a view when a record holding its offline rows in the range (`common.quality_log`) has a
failed check, printing each failure (feature, expectation, observed value, sample rows) and the way out: fix the
history and backfill the range again, or name the view with `--allow-failed-checks`. Ranges backfilled before
checks were recorded are not checked.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import click

from common.config import ProjectConfig
from common.errors import FeaturectlError
from common.quality_log import CheckResult, QualityLog, QualityRecord
from featurectl.offline_versions import Materializing
from featurectl.repo_plan import backfill_command

SAMPLES_SHOWN = 3


class FailedChecksError(FeaturectlError):
    """Offline rows to be materialized failed a data-quality check of their view."""


def _sample(row: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.items())


def failure_lines(check: CheckResult) -> list[str]:
    """A failed check as the CLI prints it: the feature, the expectation, what was observed, sample rows."""
    lines = [f"{check.feature}: {check.expectation} failed: {check.observed}"]
    lines += [f"  e.g. {_sample(row)}" for row in check.samples[:SAMPLES_SHOWN]]
    return lines


def print_backfill_checks(records: Iterable[QualityRecord]) -> None:
    """Per view with expectations: how many passed, and every failure in full."""
    for record in records:
        if not record.checks:
            continue
        failed = record.failed
        summary = f"  {record.view}: {len(record.checks) - len(failed)} of {len(record.checks)} checks passed"
        click.secho(summary, fg="red" if failed else None)
        for check in failed:
            for line in failure_lines(check):
                click.secho(f"    {line}", fg="red")
        if failed:
            click.secho(f"    `materialize` refuses these rows of {record.view} until a backfill passes, or with "
                        f"--allow-failed-checks {record.view}", fg="red")


def check_quality(cfg: ProjectConfig, jobs: Sequence[Materializing], allow_failed: Sequence[str],
                  cli: str = "featurectl") -> None:
    """Refuse, before anything is written, views whose offline rows in their range failed a check (unless named
    in `allow_failed`, which is warned of); prints every failure first."""
    unknown = set(allow_failed) - {job.view.name for job in jobs}
    if unknown:
        raise click.BadParameter(f"{', '.join(sorted(unknown))}: not a view this run materializes",
                                 param_hint="--allow-failed-checks")
    refused = []
    quality_log = QualityLog(cfg.registry_url)
    try:
        for job in jobs:
            name = job.view.name
            failed = [r for r in quality_log.holding(cfg.project, name, job.start, job.end) if not r.passed]
            for record in failed:
                waived = name in allow_failed
                head = f"warning: --allow-failed-checks {name}: materializing although" if waived else "refused:"
                click.secho(f"{head} rows of `{name}` backfilled over [{record.start:%Y-%m-%dT%H:%M}Z, "
                            f"{record.end:%Y-%m-%dT%H:%M}Z) failed checks:", fg="yellow" if waived else "red",
                            err=True)
                for check in record.failed:
                    for line in failure_lines(check):
                        click.echo(f"  {line}", err=True)
                if not waived:
                    refused.append((name, record))
    finally:
        quality_log.close()
    if refused:
        fixes = "; ".join(f"`{backfill_command(r.start, r.end, name, cli)}`" for name, r in refused)
        views = " ".join(f"--allow-failed-checks {name}" for name in dict.fromkeys(n for n, _ in refused))
        raise FailedChecksError(f"{len(refused)} backfilled range(s) failed data-quality checks (above): fix the "
                                f"history and backfill again ({fixes}), or pass {views} to materialize them anyway")
