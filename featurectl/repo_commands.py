"""`featurectl plan | apply`: compile the repo and register it in Feast's SQL registry (`delete_commands` removes).

`plan` and `apply` print the same plan (`featurectl.repo_plan`): what would change, or what changed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

import click

from common.config import ProjectConfig
from dsl.compile_feast import FeastObjects
from dsl.compile_flink import CompiledView, SourceSettings
from dsl.compile_repo import CompiledRepo, compile_repo
from featurectl.lineage import record_lineage


def _settings(cfg: ProjectConfig) -> SourceSettings:
    return SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_storage)


def _compiled(cfg: ProjectConfig) -> CompiledRepo:
    from serving.vector_common import check_indexable

    compiled = compile_repo(cfg.repo_path, _settings(cfg))
    check_indexable(cfg, compiled.repo.views)
    return compiled


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


@contextlib.contextmanager
def _untouched(cfg: ProjectConfig) -> Iterator[ProjectConfig]:
    """Settings to read the registry with, changing nothing: a scratch copy when it is a SQLite file (Feast's
    registry and our logs create their tables when they open one), the registry itself on PostgreSQL."""
    if cfg.uses_postgres_registry:
        yield cfg
        return
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "registry.db"
        current = Path(cfg.registry_url.removeprefix("sqlite:///"))
        if current.exists():
            shutil.copyfile(current, copy)
        yield ProjectConfig(cfg.repo_path, cfg.raw, registry_override=f"sqlite:///{copy}")


def _feast_diff(cfg: ProjectConfig, objects: FeastObjects, left_alone: set[str]) -> str:
    """Feast's own registry diff of the repo, less the deletions of what `apply` leaves alone (Feast's `plan`
    cannot be given those objects back: it fails to validate on-demand views read from its registry)."""
    from feast.diff.registry_diff import TransitionType

    registry_diff, _, _ = _store(cfg).plan(_repo_contents(cfg, objects))
    registry_diff.feast_object_diffs = [d for d in registry_diff.feast_object_diffs
                                        if d.transition_type != TransitionType.DELETE or d.name not in left_alone]
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


@contextlib.contextmanager
def _logs(cfg: ProjectConfig) -> Iterator[tuple]:
    """The version log and the backfill log of the registry database."""
    from batch.backfill_log import BackfillLog
    from common.version_log import VersionLog

    version_log, backfill_log = VersionLog(cfg.registry_url), BackfillLog(cfg.registry_url)
    try:
        yield version_log, backfill_log
    finally:
        version_log.close()
        backfill_log.close()


@click.command()
@click.option("--sql/--no-sql", default=True, show_default=True, help="print the compiled Flink SQL")
@click.option("--feast-diff", is_flag=True, help="also print Feast's own registry diff")
@click.pass_obj
def plan(ctx, sql: bool, feast_diff: bool) -> None:
    """Show what `apply` would change, field by field, and the Flink SQL of each view, changing nothing."""
    from featurectl.repo_plan import plan_repo, render

    cfg = ctx.config()
    compiled = _compiled(cfg)
    click.secho(f"project `{cfg.project}`, registry {cfg.registry_url}", bold=True)
    with _untouched(cfg) as scratch, _logs(scratch) as (version_log, backfill_log):
        repo_plan = plan_repo(compiled, _store(scratch), version_log, backfill_log, cfg.project)
        click.echo("\n".join(render(repo_plan, "plan", ctx.command_prefix())))
        if feast_diff:
            click.secho("\n-- Feast's registry diff", fg="cyan")
            click.echo(_feast_diff(scratch, compiled.feast, repo_plan.kept))
    if sql:
        _print_sql(compiled.views)


@click.command()
@click.pass_obj
def apply(ctx) -> None:
    """Register entities, sources, feature views and services in the Feast registry (idempotent), and record the
    version of each view."""
    from featurectl.repo_plan import plan_repo, render
    from redis_store.freshness import forget_newest, read_newest
    from redis_store.settings import RedisSettings

    cfg = ctx.config()
    compiled = _compiled(cfg)
    objects = compiled.feast
    store = _store(cfg)
    redis = RedisSettings.from_config(cfg)
    with _logs(cfg) as (version_log, backfill_log):
        repo_plan = plan_repo(compiled, store, version_log, backfill_log, cfg.project)
        if repo_plan.removed_views:  # Feast's own client drops their online tables: a refused AUTH or an
            read_newest(redis, cfg.project)  # unreachable Redis fails here, not halfway
        store.apply(objects.all(), objects_to_delete=repo_plan.to_delete, partial=False)
        version_log.record_applied(cfg.project, repo_plan.to_record, repo_plan.removed_views,
                                   dt.datetime.now(dt.timezone.utc))
        version_log.forget_online(cfg.project, repo_plan.removed_views)
        forget_newest(redis, cfg.project, repo_plan.removed_views)
    click.echo("\n".join(render(repo_plan, "apply", ctx.command_prefix())))
    click.echo(f"applied {len(objects.entities)} entities, {len(objects.feature_views)} feature views, "
               f"{len(objects.feature_services)} feature services to {cfg.registry_url}")
    namespace = record_lineage(store, compiled, _settings(cfg))
    if namespace:
        click.echo(f"recorded their lineage for Feast's UI (OpenLineage namespace `{namespace}`)")


COMMANDS = [plan, apply]
