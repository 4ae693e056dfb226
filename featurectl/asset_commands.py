"""`featurectl assets process | failures | generate`: features derived from 3D asset files, on Ray."""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from typing import Callable, Optional

import click
from tqdm import tqdm

from common.errors import FeaturectlError
from featurectl.similar_commands import similar

SHOWN_FAILURES = 20


class AssetCommandError(FeaturectlError, ValueError):
    """An asset command cannot run as asked; the message says why and what to do."""


def _asset_views(repo, source_name: Optional[str]):
    """The asset sources of the repo (or the one named) and the views over each."""
    from dsl.assets import AssetSource

    sources = [s for s in repo.sources if isinstance(s, AssetSource)]
    if source_name:
        sources = [s for s in sources if s.name == source_name]
    if not sources:
        raise AssetCommandError(f"the repo defines no asset source{f' `{source_name}`' if source_name else ''}: "
                                "add one, e.g. AssetSource(\"asset_meshes\", assets=\"assets/assets.parquet\")")
    return [(s, [v for v in repo.views if v.source == s]) for s in sources]


def _target(cfg):
    from batch.backfill import BackfillTarget

    return BackfillTarget(cfg.local_data_dir("featurectl assets"), cfg.registry_url, cfg.project,
                          cfg.platform.kafka.bootstrap_servers)


def _materialize(cfg, views, written: dict[str, tuple[int, int]]) -> None:
    """Each online view's written range into Redis (and its vectors into the vector index), recorded in the
    registry when the view is applied."""
    from feast import FeatureStore
    from feast.errors import FeatureViewNotFoundException

    from batch.materialize import materialize_view
    from dsl.compile_feast import offline_table_path
    from featurectl.materialize_commands import vector_sink
    from redis_store.settings import RedisSettings

    store = FeatureStore(config=cfg.feast_repo_config())
    for view in views:
        if view.name not in written or not view.online:
            continue
        try:
            feast_view = store.get_feature_view(view.name)
        except FeatureViewNotFoundException:
            click.secho(f"warning: `{view.name}` is not applied: its offline rows are written, not materialized; "
                        "run `featurectl apply`, then `featurectl materialize`", fg="yellow", err=True)
            continue
        start, end = (dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc) for ms in written[view.name])
        offline = offline_table_path(cfg.local_data_dir("featurectl assets"), view)
        with vector_sink(cfg, view) as on_written:
            stats = materialize_view(RedisSettings.from_config(cfg), view, cfg.project, offline, start, end,
                                     key_ttl_s=cfg.key_ttl_seconds, on_written=on_written)
        store.registry.apply_materialization(feast_view, cfg.project, start, end, commit=True)
        click.echo(f"{view.name}: materialized {stats.entities_written:,} assets into Redis")


def _print_failures(failures, heading: str) -> None:
    click.echo(heading)
    for row in failures.slice(0, SHOWN_FAILURES).to_pylist():
        click.echo(f"  {row['asset_id']}  {row['path']}: {row['reason']}")
    if failures.num_rows > SHOWN_FAILURES:
        click.echo(f"  ... and {failures.num_rows - SHOWN_FAILURES} more: `featurectl assets failures`")


def _ray_options(command: Callable) -> Callable:
    """--address, --workers and --materialize: how the commands that derive features use Ray and Redis."""
    options = [
        click.option("--address", default=None, help="an existing Ray cluster (default: a local Ray for this run)"),
        click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1),
                     help="Ray tasks at a time when deriving features (and CPUs of the local Ray)"),
        click.option("--materialize/--no-materialize", default=True, show_default=True,
                     help="load the derived features into Redis afterwards"),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), command)


@click.group()
def assets() -> None:
    """Derive features from 3D asset files (on Ray), list failures, generate assets."""


@assets.command()
@click.option("--source", "source_name", default=None, help="only this asset source (default: every one)")
@_ray_options
@click.pass_obj
def process(ctx, source_name: Optional[str], address: Optional[str], workers: int, materialize: bool) -> None:
    """Derive the features of every asset whose file changed, write the offline tables, materialize."""
    from batch.assets.pipeline import ray_session
    from dsl import load_repo

    cfg = ctx.config()
    chosen = _asset_views(load_repo(cfg.repo_path), source_name)
    with ray_session(address, workers) as start_ray:
        for source, views in chosen:
            _process_source(cfg, source, views, workers, materialize, start_ray)


def _process_source(cfg, source, views, workers: int, materialize: bool, start_ray: Callable[[], None]) -> None:
    """Derive one source's changed assets (on Ray, started by `start_ray` if there are some), print the summary,
    materialize."""
    from batch.assets.pipeline import process_assets

    with tqdm(unit="asset", desc=source.name) as bar:
        summary = process_assets(source, views, _target(cfg), workers, on_total=bar.reset, on_assets=bar.update,
                                 start_ray=start_ray)
    result = summary.result
    failed = result.table("failed", summary.failures.schema)
    hashed = sum(t.num_rows for t in result.unchanged)
    click.echo(f"{source.name}: {result.listed:,} listed: {sum(t.num_rows for t in result.derived):,} derived, "
               f"{result.same + hashed:,} unchanged ({hashed:,} of them read and hashed), {failed.num_rows:,} failed, "
               f"{result.still_failed:,} failed before and not tried again (their files did not change), in "
               f"{result.seconds:.1f}s")
    if failed.num_rows:
        _print_failures(failed, "failed this run:")
    if materialize:
        _materialize(cfg, views, summary.written)


@assets.command()
@click.option("--source", "source_name", default=None, help="only this asset source (default: every one)")
@click.pass_obj
def failures(ctx, source_name: Optional[str]) -> None:
    """The assets whose file could not be derived, with the reason (tried again when the file changes)."""
    from batch.assets.state import AssetRecord
    from dsl import load_repo

    cfg = ctx.config()
    for source, _ in _asset_views(load_repo(cfg.repo_path), source_name):
        recorded = AssetRecord.load(cfg.data_dir, source.name).failures
        _print_failures(recorded, f"{source.name}: {recorded.num_rows:,} failed")


@assets.command()
@click.argument("prompts", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--source", "source_name", default=None, help="the asset source to add the meshes to (default: the "
              "repo's only one)")
@click.option("--config", "config_name", default="auto", show_default=True,
              help="Cube 3D service config: v0.1, v0.5 or tiny; `auto` = v0.1 on a GPU, tiny on the CPU")
@click.option("--actors", default=1, show_default=True, type=click.IntRange(min=1),
              help="generating actors, one GPU each (one CPU actor without CUDA)")
@_ray_options
@click.pass_obj
def generate(ctx, prompts: Path, source_name: Optional[str], config_name: str, actors: int, address: Optional[str],
             workers: int, materialize: bool) -> None:
    """Generate a mesh per row of PROMPTS (Parquet: prompt[, asset_id, seed]) with Cube 3D on Ray, add them to the
    asset source and derive their features like any asset's."""
    import pyarrow as pa

    from batch.assets.generation import add_to_source, generate as generate_meshes, generated_folder, read_prompts
    from batch.assets.pipeline import ray_session
    from dsl import load_repo
    from featurectl.generate_commands import service_config

    cfg = ctx.config()
    chosen = _asset_views(load_repo(cfg.repo_path), source_name)
    if len(chosen) > 1:
        raise AssetCommandError(f"the repo has {len(chosen)} asset sources: name one with --source")
    (source, views), = chosen
    table = read_prompts(prompts)
    config = service_config(config_name)
    with ray_session(address, workers) as start_ray:
        start_ray()
        with tqdm(total=table.num_rows, unit="mesh", desc="cube3d") as bar:
            results = pa.concat_tables(generate_meshes(table, generated_folder(source, cfg.data_dir), config, actors,
                                                       str(cfg.repo_path), cfg.registry_url, on_rows=bar.update))
        ok = results.filter(pa.compute.equal(results.column("status"), "ok"))
        click.echo(f"generated {ok.num_rows:,} of {table.num_rows:,} meshes into "
                   f"{generated_folder(source, cfg.data_dir)}")
        for row in results.filter(pa.compute.equal(results.column("status"), "failed")).to_pylist():
            click.echo(f"  failed: {row['prompt']!r}: {row['reason']}")
        add_to_source(source, cfg.data_dir, ok)
        _process_source(cfg, source, views, workers, materialize, start_ray)


assets.add_command(similar)

COMMANDS = [assets]
