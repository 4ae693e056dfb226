"""`featurectl materialize START END` and `featurectl materialize-incremental END`, with Feast's semantics.

An END more than `FUTURE_LIMIT` after now is refused unless `--force`: no offline row can be there yet, and the
recorded end is where every later `materialize-incremental` starts, so one typo (`9999-12-31`) would make each
of them read nothing, for ever. An end recorded that far ahead anyway (`--force`) is passed over by
`materialize-incremental`, with a warning, rather than started from.
"""

from __future__ import annotations

import datetime as dt
from typing import Optional

import click
from tqdm import tqdm

from common.instants import InstantError, check_range, shifted
from featurectl.params import INSTANT

FUTURE_LIMIT = dt.timedelta(days=1)
FORCE_HELP = f"allow an END more than {FUTURE_LIMIT.days} day after now"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _check_end(end: dt.datetime, force: bool) -> None:
    limit = _now() + FUTURE_LIMIT
    if end > limit and not force:
        raise InstantError("END", f"{end.isoformat()} is more than {FUTURE_LIMIT.days} day after now: no offline "
                                  "row can be there yet, and every later `materialize-incremental` would start "
                                  f"from it; give an END up to {limit:%Y-%m-%dT%H:%M}Z, or pass --force")


def _incremental_start(feast_view, name: str, end: dt.datetime, ttl: dt.timedelta) -> Optional[dt.datetime]:
    """Where `materialize-incremental` starts a view: its latest recorded end, ends past `FUTURE_LIMIT` passed
    over, else END - ttl; None when that is after END (nothing to do)."""
    limit = _now() + FUTURE_LIMIT
    ends = [interval_end for _, interval_end in feast_view.materialization_intervals]
    recorded = max((e for e in ends if e <= limit), default=None)
    ahead = max((e for e in ends if e > limit), default=None)
    since = recorded or shifted(end, -ttl, f"END - the ttl of `{name}`")
    if ahead is not None:
        click.secho(f"warning: `{name}` was materialized up to {ahead.isoformat()}, more than {FUTURE_LIMIT.days} "
                    f"day after now (`materialize --force`); starting from {since.isoformat()} instead",
                    fg="yellow", err=True)
    if since > end:
        click.echo(f"{name}: materialized up to {since.isoformat()} already, after END {end.isoformat()}: "
                   "nothing to do")
        return None
    return since


def _run(ctx, views: tuple[str, ...], end: dt.datetime, start: dt.datetime | None) -> None:
    from batch.materialize import MaterializeError, materialize_view
    from dsl import load_repo
    from dsl.compile_feast import offline_table_path
    from feast import FeatureStore
    from feast.errors import FeatureViewNotFoundException
    from redis_store.settings import RedisSettings

    cfg = ctx.config()
    repo = load_repo(cfg.repo_path)
    store = FeatureStore(config=cfg.feast_repo_config())
    settings = RedisSettings.from_config(cfg)
    chosen = [repo.view(name) for name in views] if views else [v for v in repo.views if v.online]
    for view in chosen:
        try:
            feast_view = store.get_feature_view(view.name)
        except FeatureViewNotFoundException:
            raise MaterializeError(f"feature view `{view.name}` is not in the registry of project `{cfg.project}`: "
                                   "run `featurectl apply` first") from None
        since = start or _incremental_start(feast_view, view.name, end, view.ttl)
        if since is None:
            continue
        path = offline_table_path(cfg.data_dir, view)
        with tqdm(unit="row", unit_scale=True, desc=view.name) as bar:
            stats = materialize_view(settings, view, cfg.project, path, since, end, key_ttl_s=cfg.key_ttl_seconds,
                                     on_rows=bar.update)
        store.registry.apply_materialization(feast_view, cfg.project, since, end, commit=True)
        click.echo(f"{view.name}: {since:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}: {stats.rows_read:,} rows read, "
                   f"{stats.entities_written:,} entity writes, {stats.skipped_older:,} skipped as older than Redis's, "
                   f"{stats.seconds:.1f}s "
                   f"({stats.rows_per_s:,.0f} rows/s)")


@click.command()
@click.argument("start", type=INSTANT)
@click.argument("end", type=INSTANT)
@click.option("--view", "views", multiple=True, help="only these views (default: every online view)")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.pass_obj
def materialize(ctx, start: dt.datetime, end: dt.datetime, views: tuple[str, ...], force: bool) -> None:
    """Load the latest offline values in [START, END] into Redis and record the interval."""
    check_range(start, end, ("START", "END"), closed=True)
    _check_end(end, force)
    _run(ctx, views, end, start)


@click.command("materialize-incremental")
@click.argument("end", type=INSTANT)
@click.option("--view", "views", multiple=True, help="only these views (default: every online view)")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.pass_obj
def materialize_incremental(ctx, end: dt.datetime, views: tuple[str, ...], force: bool) -> None:
    """Materialize from each view's last recorded end (or END - ttl) up to END."""
    _check_end(end, force)
    _run(ctx, views, end, None)


COMMANDS = [materialize, materialize_incremental]
