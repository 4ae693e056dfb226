"""`featurectl plan | apply`: compile the repo and register it in Feast's SQL registry (`delete_commands` removes)."""

from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import click

from common.config import ProjectConfig
from dsl.compile_feast import FeastObjects
from dsl.compile_flink import CompiledView, SourceSettings
from dsl.compile_repo import CompiledRepo, compile_repo


def _compiled(cfg: ProjectConfig) -> CompiledRepo:
    return compile_repo(cfg.repo_path, SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_dir))


def _repo_contents(cfg: ProjectConfig, objects: FeastObjects):
    from feast.project import Project
    from feast.repo_contents import RepoContents

    return RepoContents(projects=[Project(name=cfg.project)], data_sources=objects.data_sources,
                        feature_views=objects.feature_views, on_demand_feature_views=objects.on_demand_views,
                        stream_feature_views=[],
                        label_views=[], entities=objects.entities, feature_services=objects.feature_services,
                        permissions=[])


def _store(cfg: ProjectConfig):
    from feast import FeatureStore

    # Feast warns on every plan and apply that holds one; featurectl serves them itself (`serving.on_demand`)
    warnings.filterwarnings("ignore", message="On demand feature view is an experimental feature")
    return FeatureStore(config=cfg.feast_repo_config())


def _diff_without_touching(cfg: ProjectConfig, objects: FeastObjects) -> str:
    """Feast's registry diff, computed on a scratch copy when the registry is a SQLite file."""
    if cfg.uses_postgres_registry:
        registry_diff, _, _ = _store(cfg).plan(_repo_contents(cfg, objects))
        return registry_diff.to_string()
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "registry.db"
        current = Path(cfg.registry_url.removeprefix("sqlite:///"))
        if current.exists():
            shutil.copyfile(current, copy)
        scratch_cfg = ProjectConfig(cfg.repo_path, cfg.raw, registry_override=f"sqlite:///{copy}")
        registry_diff, _, _ = _store(scratch_cfg).plan(_repo_contents(scratch_cfg, objects))
        return registry_diff.to_string()


def _print_sql(compiled: list[CompiledView]) -> None:
    if compiled:
        click.secho("\n-- functions (both modes)", fg="cyan")
        click.echo(";\n".join(compiled[0].function_ddl) + ";")
    for view in compiled:
        click.secho(f"\n-- feature view {view.view}: streaming source (`featurectl stream` sets the consumer group "
                    "and start position per job)", fg="cyan")
        click.echo(";\n".join(view.streaming_source.ddl) + ";")
        click.secho(f"\n-- feature view {view.view}: streaming dead letters of {view.source}", fg="cyan")
        click.echo(view.streaming_source.dead_letter_query + ";")
        click.secho(f"\n-- feature view {view.view}: batch source", fg="cyan")
        click.echo(view.batch_source_ddl + ";")
        click.secho(f"\n-- feature view {view.view}: tile query (the same text in both modes; a stream adds a "
                    "STATE_TTL hint for its tiles' state)", fg="cyan")
        click.echo(view.tile_query + ";")


@click.command()
@click.option("--sql/--no-sql", default=True, show_default=True, help="print the compiled Flink SQL")
@click.pass_obj
def plan(ctx, sql: bool) -> None:
    """Show what `apply` would register and the Flink SQL of each view, changing nothing."""
    cfg = ctx.config()
    _, objects, compiled = _compiled(cfg)
    click.secho(f"project `{cfg.project}`, registry {cfg.registry_url}", bold=True)
    click.echo(_diff_without_touching(cfg, objects))
    if sql:
        _print_sql(compiled)


def _stale_objects(store, objects: FeastObjects) -> list:
    """Objects in the registry that the repo no longer defines (what `apply` removes)."""
    wanted = {(type(o).__name__, o.name) for o in objects.all()}
    current = [*store.list_feature_services(), *store.list_on_demand_feature_views(), *store.list_feature_views(),
               *store.list_data_sources(), *store.list_entities()]
    return [o for o in current if (type(o).__name__, o.name) not in wanted]


@click.command()
@click.pass_obj
def apply(ctx) -> None:
    """Register entities, sources, feature views and services in the Feast registry (idempotent)."""
    cfg = ctx.config()
    objects = _compiled(cfg).feast
    store = _store(cfg)
    registry_diff, _, _ = store.plan(_repo_contents(cfg, objects))
    stale = _stale_objects(store, objects)
    store.apply(objects.all(), objects_to_delete=stale, partial=False)
    click.echo(registry_diff.to_string())
    click.echo(f"applied {len(objects.entities)} entities, {len(objects.feature_views)} feature views, "
               f"{len(objects.feature_services)} feature services to {cfg.registry_url}"
               + (f"; removed {len(stale)} stale objects" if stale else ""))


COMMANDS = [plan, apply]
