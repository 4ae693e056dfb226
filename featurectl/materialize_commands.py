"""`featurectl materialize START END` and `featurectl materialize-incremental END`, with Feast's semantics.

An END more than `FUTURE_LIMIT` after now is refused unless `--force`: no offline row can be there yet, and the
recorded end is where every later `materialize-incremental` starts, so one typo (`9999-12-31`) would make each
of them read nothing, for ever. An end recorded that far ahead anyway (`--force`) is passed over by
`materialize-incremental`, with a warning, rather than started from.

Offline rows of another version than the applied one are refused unless `--allow-stale VIEW`
(`featurectl.offline_versions`); the version materialized is recorded for the feature server. Offline rows whose
backfill failed a data-quality check are refused unless `--allow-failed-checks VIEW` (`featurectl.quality_checks`).

A view that a running `featurectl stream` writes is materialized up to its stream's cutover, not past it: the offline
rows after the cutover are computed from the history alone, without the stream's Kafka events, and one written over
a value the stream wrote earlier would stay until that entity's windows next change in the stream.

A row replaces Redis's value when its boundary is newer than the stored `_ts`, and also when it is the same
boundary before the cutover of any stream of the view (or the view has none): a backfill that recomputed a boundary's
values (an event pushed into history later) reaches Redis by materializing the range again. From a cutover on an
equal `_ts` is kept, as Feast's writer keeps it: it may be the stream's value at that instant.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from typing import Callable, Iterator, Optional

import click
from tqdm import tqdm

from common.instants import InstantError, check_range, shifted
from featurectl.params import INSTANT

FUTURE_LIMIT = dt.timedelta(days=1)
FORCE_HELP = f"allow an END more than {FUTURE_LIMIT.days} day after now"
ALLOW_STALE_HELP = ("materialize this view (repeatable) even if its offline rows, or the repo's definition, are of "
                    "another version than the applied one")
ALLOW_FAILED_HELP = ("materialize this view (repeatable) even if the backfill of its offline rows failed a "
                     "data-quality check")


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


def _registered(store, cfg, view):
    from batch.materialize import MaterializeError
    from feast.errors import FeatureViewNotFoundException

    try:
        return store.get_feature_view(view.name)
    except FeatureViewNotFoundException:
        raise MaterializeError(f"feature view `{view.name}` is not in the registry of project `{cfg.project}`: "
                               "run `featurectl apply` first") from None


def _stream_end(name: str, end: dt.datetime, cutovers: dict[str, int]) -> dt.datetime:
    """END, or the cutover of the running stream that writes the view when that comes first."""
    cutover = cutovers.get(name)
    if cutover is None or cutover >= end.timestamp() * 1000:
        return end
    at = dt.datetime.fromtimestamp(cutover / 1000, dt.timezone.utc)
    click.echo(f"{name}: a running stream writes its values from its cutover {at.isoformat()} on: materializing up "
               "to the cutover, not to END")
    return at


def _since(feast_view, view, start: dt.datetime | None, end: dt.datetime, replaced: dict) -> dt.datetime | None:
    """Where a view's run starts: START, else its last materialized end, else END - ttl; END - ttl as well when
    the run replaces its online values whole (what was materialized before is not to be kept)."""
    if start is not None:
        return start
    if view.name not in replaced:
        return _incremental_start(feast_view, view.name, end, view.ttl)
    since = shifted(end, -view.ttl, f"END - the ttl of `{view.name}`")
    click.echo(f"{view.name}: {replaced[view.name]}: materializing from END - ttl ({since.isoformat()})")
    return since


@contextlib.contextmanager
def vector_sink(cfg, view) -> Iterator[Optional[Callable]]:
    """Where materialized rows of a view with a Vector feature go besides Redis: the vector index
    (`serving.vector_common.open_index`), sealed once the run has written them, so that a Milvus server builds its
    index over them and serves them through it (`VectorIndex.seal`; rows left in a growing segment are scanned), and
    pgvector builds its HNSW index over them once (`PgVectorIndex.seal`). None for other views. A run that fails
    leaves its rows unsealed: the next run's seal covers them."""
    if not view.vector_features:
        yield None
        return
    from serving.vector_common import open_index

    index = open_index(cfg)
    written = 0

    def write(table) -> None:
        nonlocal written
        written += index.write_table(view, table)

    yield write
    if written:
        index.seal(view)


def _materialize(cfg, store, job, feast_view, stream_cutover_ms: Optional[int]) -> None:
    from batch.materialize import NO_STREAM, materialize_view
    from dsl.compile_feast import offline_table_location
    from redis_store.settings import RedisSettings

    view, since, end = job.view, job.start, job.end
    cutover = NO_STREAM if stream_cutover_ms is None else stream_cutover_ms
    with vector_sink(cfg, view) as on_written, tqdm(unit="row", unit_scale=True, desc=view.name) as bar:
        stats = materialize_view(RedisSettings.from_config(cfg), view, cfg.project,
                                 offline_table_location(cfg.data_storage, view), since, end,
                                 key_ttl_s=cfg.key_ttl_seconds, stream_cutover_ms=cutover,
                                 on_rows=bar.update, on_written=on_written)
    store.registry.apply_materialization(feast_view, cfg.project, since, end, commit=True)
    click.echo(f"{view.name}: {since:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M}: {stats.rows_read:,} rows read, "
               f"{stats.entities_written:,} written, {stats.skipped_older:,} not newer than Redis's, "
               f"{stats.seconds:.1f}s ({stats.rows_per_s:,.0f} rows/s)")


def _online_views(repo, cfg) -> list:
    """Every online view, less those over an asset source with nothing derived yet (warned about)."""
    from dsl.assets import AssetSource
    from dsl.compile_feast import offline_table_location

    out = []
    for view in (v for v in repo.views if v.online):
        if isinstance(view.source, AssetSource) and not offline_table_location(cfg.data_storage, view).exists():
            click.secho(f"warning: `{view.name}` is left out: asset source `{view.source.name}` has no derived "
                        "assets yet; run `featurectl assets process` first", fg="yellow", err=True)
            continue
        out.append(view)
    return out


def _run(ctx, views: tuple[str, ...], end: dt.datetime, start: dt.datetime | None,
         allow_stale: tuple[str, ...], allow_failed: tuple[str, ...]) -> None:
    from common.version_log import VersionLog
    from dsl import load_repo
    from feast import FeatureStore
    from featurectl.offline_versions import Materializing, check_offline_versions, clear_online_values, replaced
    from featurectl.quality_checks import check_quality
    from streaming.status import stream_cutovers

    cfg = ctx.config()
    repo = load_repo(cfg.repo_path)
    store = FeatureStore(config=cfg.feast_repo_config())
    chosen = [repo.view(name) for name in views] if views else _online_views(repo, cfg)
    sources = {v.name: v.source.name for v in chosen}
    cutovers = stream_cutovers(cfg.state_dir, cfg.project, sources, running=True)
    written_by_streams = stream_cutovers(cfg.state_dir, cfg.project, sources)
    version_log = VersionLog(cfg.registry_url)
    try:
        replacing, switching = replaced(version_log, cfg.project), version_log.conflicts(cfg.project)
        jobs = []
        for view in chosen:
            feast_view = _registered(store, cfg, view)
            view_end = _stream_end(view.name, end, cutovers)
            since = _since(feast_view, view, start, view_end, replacing)
            if since is not None and since > view_end:
                click.echo(f"{view.name}: START {since.isoformat()} is after its running stream's cutover: nothing "
                           "to do")
            elif since is not None:
                jobs.append((Materializing(view, since, view_end), feast_view))
        checked = check_offline_versions(cfg, version_log, [job for job, _ in jobs], allow_stale,
                                         ctx.command_prefix())
        check_quality(cfg, [job for job, _ in jobs], allow_failed, ctx.command_prefix())
        for job, feast_view in jobs:
            name = job.view.name
            if name in switching or (name in replacing and name not in checked.waived):
                clear_online_values(store, feast_view, replacing[name])
            _materialize(cfg, store, job, feast_view, written_by_streams.get(name))
            if name in checked.versions:
                stale = name in checked.waived
                version_log.record_online(cfg.project, {name: checked.versions[name]},
                                          "featurectl materialize" + (" --allow-stale" if stale else ""), _now(), stale)
    finally:
        version_log.close()


@click.command()
@click.argument("start", type=INSTANT)
@click.argument("end", type=INSTANT)
@click.option("--view", "views", multiple=True, help="only these views (default: every online view)")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--allow-stale", "allow_stale", multiple=True, metavar="VIEW", help=ALLOW_STALE_HELP)
@click.option("--allow-failed-checks", "allow_failed", multiple=True, metavar="VIEW", help=ALLOW_FAILED_HELP)
@click.pass_obj
def materialize(ctx, start: dt.datetime, end: dt.datetime, views: tuple[str, ...], force: bool,
                allow_stale: tuple[str, ...], allow_failed: tuple[str, ...]) -> None:
    """Load the latest offline values in [START, END] into Redis and record the interval."""
    check_range(start, end, ("START", "END"), closed=True)
    _check_end(end, force)
    _run(ctx, views, end, start, allow_stale, allow_failed)


@click.command("materialize-incremental")
@click.argument("end", type=INSTANT)
@click.option("--view", "views", multiple=True, help="only these views (default: every online view)")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--allow-stale", "allow_stale", multiple=True, metavar="VIEW", help=ALLOW_STALE_HELP)
@click.option("--allow-failed-checks", "allow_failed", multiple=True, metavar="VIEW", help=ALLOW_FAILED_HELP)
@click.pass_obj
def materialize_incremental(ctx, end: dt.datetime, views: tuple[str, ...], force: bool,
                            allow_stale: tuple[str, ...], allow_failed: tuple[str, ...]) -> None:
    """Materialize from each view's last recorded end (or END - ttl) up to END."""
    _check_end(end, force)
    _run(ctx, views, end, None, allow_stale, allow_failed)


COMMANDS = [materialize, materialize_incremental]
