"""`featurectl delete | teardown`: remove one entity's data (someone asking to be forgotten) or a whole project."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

import click

from common.config import ProjectConfig
from common.errors import FeaturectlError
from dsl.compile_feast import feature_log_path, offline_table_location, offline_table_path
from dsl.compile_flink import source_path
from dsl.entity import Entity
from dsl.feature_view import FeatureView
from dsl.repo import Repository, load_repo
from featurectl.params import join_key_value


class DeleteError(FeaturectlError, ValueError):
    """The entity to delete is not one of the project's; the message names what is."""


def _parse_entity(pairs: tuple[str, ...]) -> dict[str, str]:
    given: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise DeleteError(f"`--entity {pair}` is not NAME=VALUE (once per join key): write e.g. "
                              "--entity asset_id=a1")
        if name in given:
            raise DeleteError(f"join key `{name}` is given twice (`{name}={given[name]}`, `{pair}`): one entity per "
                              "command, each of its join keys once")
        given[name] = value
    return given


def _matching_views(repo: Repository, given: dict[str, str]) -> dict[str, tuple[Entity, dict, list[FeatureView]]]:
    """Per entity whose join keys include every given one: the entity, the given values typed as its keys, and its
    views."""
    known = sorted({key for entity in repo.entities for key in entity.join_keys})
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise DeleteError(f"no entity of this project has join key {', '.join(unknown)}; its join keys are "
                          f"{', '.join(known)}")
    out = {}
    for entity in repo.entities:
        if set(given) <= set(entity.join_keys):
            typed = {k: join_key_value(v, entity.join_keys[k], k) for k, v in given.items()}
            out[entity.name] = (entity, typed, [v for v in repo.views if v.entity.name == entity.name])
    if not out:
        raise DeleteError(f"no entity of this project has all of the join keys {', '.join(sorted(given))}: "
                          "give the keys of one entity")
    return out


def _remove_rows(folder: Path, given: dict[str, Any], dry_run: bool, label: str) -> tuple[int, int]:
    """(rows, files) of the entity in a Parquet folder, removed unless `dry_run`; a progress bar on many files."""
    from batch.forget import has_columns, parquet_files, remove_rows

    files = list(parquet_files(folder)) if folder.exists() else []
    rows = touched = 0
    many = len(files) > 20
    with click.progressbar(files, label=label, show_pos=True) if many else contextlib.nullcontext(files) as bar:
        for file in bar:
            if has_columns(file, given):
                found = remove_rows(file, given, dry_run)
                rows += found
                touched += found > 0
    return rows, touched


@click.command()
@click.option("--entity", "pairs", multiple=True, required=True, metavar="JOIN_KEY=VALUE",
              help="the entity to delete, by its join keys (repeat for each key; some keys of a composite entity "
                   "match every entity with those values)")
@click.option("--history", is_flag=True, help="also remove the entity's events from the sources' Parquet history "
                                               "(else the next backfill rebuilds its offline rows from them)")
@click.option("--dry-run", is_flag=True, help="count what would be removed, remove nothing")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def delete(ctx, pairs: tuple[str, ...], history: bool, dry_run: bool, yes: bool) -> None:
    """Remove one entity's online values (every view of the project), offline rows and logged feature vectors, and
    say what was removed."""
    from redis_store.forget import EntityMatch, OnlineEraser
    from redis_store.settings import RedisSettings

    cfg = ctx.config()
    data_dir = cfg.local_data_dir("featurectl delete")
    repo = load_repo(cfg.repo_path)
    given = _parse_entity(pairs)
    matches = _matching_views(repo, given)
    who = ", ".join(f"{k}={v}" for k, v in given.items())
    if not (yes or dry_run):
        click.confirm(f"Remove {who} from project `{cfg.project}` (online values, offline rows, feature logs"
                      f"{' and source history' if history else ''})?", abort=True)
    verb = "would remove" if dry_run else "removed"
    eraser = OnlineEraser(RedisSettings.from_config(cfg))
    try:
        for entity, typed, views in matches.values():
            keys = eraser.keys(EntityMatch(cfg.project, entity.join_keys, typed))
            count = len(keys) if dry_run else eraser.delete(keys)
            click.echo(f"online: {verb} {count} key(s) of entity {entity.name} (views: "
                       f"{', '.join(v.name for v in views) or 'none'})")
    finally:
        eraser.close()
    for _, typed, views in matches.values():
        for view in views:
            rows, files = _remove_rows(offline_table_path(data_dir, view), typed, dry_run, view.name)
            click.echo(f"offline table {view.name}: {verb} {rows} row(s) in {files} file(s)")
    _feature_logs(data_dir, repo, matches, verb, dry_run)
    _history(data_dir, matches, history, dry_run)


def _feature_logs(data_dir: Path, repo: Repository, matches: dict, verb: str, dry_run: bool) -> None:
    """The entity's rows in the vectors `featurectl serve` logged for the services with logging (files whose
    columns include the given join keys)."""
    given = {tuple(sorted(typed.items())): typed for _, typed, _ in matches.values()}
    for service in repo.services:
        if service.logging is None:
            continue
        folder = feature_log_path(data_dir, service.name)
        rows = files = 0
        for typed in given.values():
            found, touched = _remove_rows(folder, typed, dry_run, f"{service.name} logs")
            rows, files = rows + found, files + touched
        click.echo(f"feature logs {service.name}: {verb} {rows} row(s) in {files} file(s)"
                   + ("; a running `featurectl serve` writes the rows it still holds after this: delete again "
                      "once it has flushed them, or stop it first" if rows and not dry_run else ""))


def _history(data_dir: Path, matches: dict, remove: bool, dry_run: bool) -> None:
    sources = {}
    for _, typed, views in matches.values():
        for view in views:
            sources.setdefault(view.source.name, (view.source, typed))
    for source, typed in sources.values():
        if not set(typed) <= set(source.schema):
            click.echo(f"history {source.name}: has no column {', '.join(sorted(set(typed) - set(source.schema)))}"
                       "; nothing to remove")
            continue
        rows, files = _remove_rows(source_path(source, data_dir), typed, dry_run or not remove, source.name)
        if remove:
            click.echo(f"history {source.name}: {'would remove' if dry_run else 'removed'} {rows} event(s) in "
                       f"{files} file(s)")
        elif rows:
            click.echo(f"history {source.name}: {rows} event(s) of the entity remain; the next backfill rebuilds "
                       "its offline rows from them: add --history to remove them too")
        if source.kafka_topic and (remove or rows):
            click.echo(f"  events already in Kafka topic {source.kafka_topic} stay until its retention removes "
                       "them; a running stream keeps the entity's windows until they pass")


def _stream_jobs(cfg: ProjectConfig) -> list[tuple[Path, dict]]:
    from streaming.status import is_running, read_statuses

    jobs = [(home, status) for home, status in read_statuses(cfg.state_dir) if status.get("project") == cfg.project]
    for home, _ in jobs:
        if is_running(home):
            raise DeleteError(f"stream job {home.name} of project `{cfg.project}` is running: stop it "
                              "(Ctrl-C in its terminal, or kill its pid from `featurectl stream --status`) first")
    return jobs


def _remove_streams(cfg: ProjectConfig, jobs: list[tuple[Path, dict]]) -> None:
    from streaming.topics import delete_topics

    topics = sorted({t for _, status in jobs for kind in ("tiles", "dead_letters")
                     for t in (status.get("topics") or {}).get(kind, [])})
    if jobs:
        try:
            deleted = delete_topics(cfg.platform.kafka.bootstrap_servers, topics, timeout_s=10, project=cfg.project)
            click.echo(f"removed {len(deleted)} Kafka topic(s) of its streams: {', '.join(deleted) or '-'}")
        except Exception as exc:  # noqa: BLE001 - Kafka away: the rest of the teardown still runs
            click.echo(f"could not remove the streams' Kafka topics ({exc}): {', '.join(topics)}; start Kafka "
                       "(`featurectl services up`) and delete them with kafka-topics.sh", err=True)
    shared = cfg.shared_storage
    for home, _ in jobs:
        if shared is not None:
            shared.child("streams", home.name).delete()
        shutil.rmtree(home, ignore_errors=True)
    if jobs:
        click.echo(f"removed {len(jobs)} stream job folder(s) (checkpoints, exported tiles)")


@click.command()
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@click.pass_obj
def teardown(ctx, yes: bool) -> None:
    """Remove everything the project created: its registry objects, online values, offline tables, API keys,
    backfill records, definition versions and stream state. Its sources' history and Kafka topics are the input,
    and are kept."""
    from batch.backfill_log import BackfillLog
    from common.quality_log import QualityLog
    from common.version_log import VersionLog
    from serving.api_keys import KeyStore

    cfg = ctx.config()
    if not yes:
        click.confirm(f"Remove project `{cfg.project}` from {cfg.registry_url}, its online values, offline tables, "
                      "API keys and stream state?", abort=True)
    jobs = _stream_jobs(cfg)
    views = _remove_registered(cfg)
    for name in views:
        table = offline_table_location(cfg.data_storage, name)
        if table.exists():
            table.delete()
            click.echo(f"removed offline table {table}")
    _remove_streams(cfg, jobs)
    keys = KeyStore(cfg.registry_url, cfg.project).delete_project_keys()
    backfill_log, version_log = BackfillLog(cfg.registry_url), VersionLog(cfg.registry_url)
    quality_log = QualityLog(cfg.registry_url)
    try:
        records = backfill_log.delete_project(cfg.project)
        versions = version_log.delete_project(cfg.project)
        checks = quality_log.delete_project(cfg.project)
    finally:
        backfill_log.close()
        version_log.close()
        quality_log.close()
    click.echo(f"removed {keys} API key(s), {records} backfill record(s) and {versions} definition version(s)")
    click.echo(f"removed {checks} data-quality record(s) (checks and profiles of backfills)")
    click.echo(f"kept the sources' history under {cfg.data_storage} and their Kafka topics: they are input, not "
               "something the project made")


def _remove_registered(cfg: ProjectConfig) -> list[str]:
    """Delete the project's registry objects and online values; the names of the views it had."""
    from feast import FeatureStore

    from featurectl.lineage import forget_lineage
    from redis_store.freshness import forget_newest, read_newest
    from redis_store.settings import RedisSettings

    settings = RedisSettings.from_config(cfg)
    read_newest(settings, cfg.project)  # a refused AUTH fails here in one line, before Feast's own client deletes
    store = FeatureStore(config=cfg.feast_repo_config())
    current = [*store.list_feature_services(), *store.list_feature_views(), *store.list_on_demand_feature_views(),
               *store.list_stream_feature_views(), *store.list_data_sources(), *store.list_entities()]
    views = [v.name for v in store.list_feature_views()]
    try:
        store.apply([], objects_to_delete=current, partial=False)
        forget_newest(settings, cfg.project)
    except ConnectionError as exc:
        raise click.ClickException(f"cannot reach Redis to delete online values ({exc}): "
                                   "run `featurectl services up` and retry") from exc
    forget_lineage(store)
    store.registry.delete_project(cfg.project, commit=True)
    click.echo(f"removed {len(current)} registry objects of project `{cfg.project}` and their online values")
    return views


COMMANDS = [delete, teardown]
