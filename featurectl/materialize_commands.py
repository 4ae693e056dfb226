"""`featurectl materialize START END` and `featurectl materialize-incremental END`, with Feast's semantics."""

from __future__ import annotations

import datetime as dt

import click
from tqdm import tqdm

from featurectl.params import INSTANT


def _run(ctx, views: tuple[str, ...], end: dt.datetime, start: dt.datetime | None) -> None:
    from batch.materialize import materialize_view
    from dsl import load_repo
    from dsl.compile_feast import offline_table_path
    from feast import FeatureStore
    from redis_store.settings import RedisSettings

    cfg = ctx.config()
    repo = load_repo(cfg.repo_path)
    store = FeatureStore(config=cfg.feast_repo_config())
    settings = RedisSettings.from_config(cfg)
    chosen = [repo.view(name) for name in views] if views else [v for v in repo.views if v.online]
    for view in chosen:
        feast_view = store.get_feature_view(view.name)
        since = start or feast_view.most_recent_end_time or (end - view.ttl)
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
@click.pass_obj
def materialize(ctx, start: dt.datetime, end: dt.datetime, views: tuple[str, ...]) -> None:
    """Load the latest offline values in [START, END] into Redis and record the interval."""
    _run(ctx, views, end, start)


@click.command("materialize-incremental")
@click.argument("end", type=INSTANT)
@click.option("--view", "views", multiple=True, help="only these views (default: every online view)")
@click.pass_obj
def materialize_incremental(ctx, end: dt.datetime, views: tuple[str, ...]) -> None:
    """Materialize from each view's last recorded end (or END - ttl) up to END."""
    _run(ctx, views, end, None)


COMMANDS = [materialize, materialize_incremental]
