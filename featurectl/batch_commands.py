"""`featurectl backfill | training-set`: offline feature tables from the history, and point-in-time training sets."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import click
from tqdm import tqdm

from common.config import ProjectConfig
from common.instants import from_epoch_ms, shifted
from featurectl.params import INSTANT

if TYPE_CHECKING:
    from dsl.types import ValueType


class TqdmProgress:
    """One progress bar per backfill stage."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None

    def stage(self, name: str, total: int, unit: str) -> None:
        self.close()
        self.bar = tqdm(total=total, desc=name, unit=unit, unit_scale=True)

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@click.command()
@click.option("--start", type=INSTANT, required=True, help="first boundary, e.g. 2026-01-01 (UTC)")
@click.option("--end", type=INSTANT, required=True, help="end of the range, exclusive, e.g. 2026-01-08")
@click.option("--view", "view_names", multiple=True, help="a feature view to backfill (repeatable; default: all "
              "views with offline=True)")
@click.option("--parallelism", type=int, default=None, help="Flink parallelism (default: platform.flink)")
@click.option("--jobmanager", default=None, help="REST address host:port of a Flink cluster's JobManager "
              "(default: platform.flink.jobmanager, else a local mini-cluster)")
@click.pass_obj
def backfill(ctx, start: dt.datetime, end: dt.datetime, view_names: tuple[str, ...], parallelism: int | None,
             jobmanager: str | None) -> None:
    """Compute the offline feature tables of [START, END) from the Parquet history with Flink, replacing that range."""
    from batch.backfill import BackfillTarget, backfill as run_backfill
    from common.flink_rest import check_jobmanager
    from dsl import load_repo
    from featurectl.quality_checks import print_backfill_checks

    cfg = ctx.config()
    jobmanager = check_jobmanager(jobmanager or cfg.platform.flink.jobmanager)
    repo = load_repo(cfg.repo_path)
    views = [repo.view(name) for name in view_names] or [v for v in repo.views if v.offline]
    target = BackfillTarget(cfg.data_storage, cfg.registry_url, cfg.project, cfg.platform.kafka.bootstrap_servers,
                            cfg.shared_storage)
    progress = TqdmProgress()
    try:
        summary = run_backfill(views, start, end, target, parallelism=parallelism or cfg.platform.flink.parallelism,
                               jobmanager=jobmanager, progress=progress)
    finally:
        progress.close()
    for result in summary.views:
        click.echo(f"  {result.view}: {result.rows:,} rows in {result.files} files")
    print_backfill_checks(r.quality for r in summary.views if r.quality is not None)
    click.echo(f"backfilled {len(summary.views)} views over [{start.isoformat()}, {end.isoformat()}): "
               f"{summary.events_read:,} rows read, {summary.rows_written:,} rows written, "
               f"{summary.seconds:.1f} s")


def read_entities(path: Path, option: str = "--entities", types: Mapping[str, ValueType] | None = None):
    """Entity (or label) rows from Parquet or CSV (a CSV `event_timestamp` may hold ISO times or epoch
    milliseconds); `option` names the file's option in errors. A CSV's columns named in `types` (join keys,
    request fields; a logged service's join keys for labels) are read as those types, not inferred: a String
    stays the text written ("", "NA", "123")."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    from dsl.compile_feast import EVENT_TIMESTAMP

    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pq.read_table(path)
    if suffix != ".csv":
        raise click.BadParameter(f"{path} is neither .parquet nor .csv", param_hint=option)
    types = dict(types or {})
    try:
        table = csv.read_csv(path, convert_options=csv.ConvertOptions(
            column_types={name: kind.arrow_type() for name, kind in types.items()}))
    except pa.ArrowInvalid as exc:
        declared = ", ".join(f"`{name}` {kind.value}" for name, kind in types.items())
        raise click.BadParameter(f"{path}: {exc}; fix the file (join keys and request fields are read as their "
                                 f"declared types: {declared or 'none here'})", param_hint=option) from None
    if EVENT_TIMESTAMP not in table.column_names:
        return table
    times = table.column(EVENT_TIMESTAMP)
    if pa.types.is_integer(times.type) or pa.types.is_timestamp(times.type):
        return table
    try:  # times Arrow did not read (mixed forms, dates, ...): as pandas reads them
        parsed = pd.to_datetime(times.cast(pa.string()).to_pandas(), utc=True, format="ISO8601")
    except ValueError as exc:  # not a time, or past pandas' years 1677 to 2262
        reason = str(exc).splitlines()[0].removesuffix(" You might want to try:")
        raise click.BadParameter(f"{path}: `{EVENT_TIMESTAMP}` holds a value that is not a time pandas can "
                                 f"read ({reason}): write ISO 8601 times from 1677 to 2262, or epoch "
                                 "milliseconds", param_hint=option) from None
    return table.set_column(table.column_names.index(EVENT_TIMESTAMP), EVENT_TIMESTAMP, pa.array(parsed))


def _warn_uncovered(cfg: ProjectConfig, views, times_ms) -> None:
    """Warn when part of the span the rows look at was never backfilled: rows there read the latest offline row
    before it (as `as_of` reads any row), so its events are missing from their values."""
    from batch.backfill_log import BackfillLog

    first, last = from_epoch_ms(int(times_ms.min())), from_epoch_ms(int(times_ms.max()))
    backfill_log = BackfillLog(cfg.registry_url)
    try:
        for view in views:
            gaps = backfill_log.gaps(cfg.project, view.name, shifted(first, -view.ttl, "the first row's time - ttl"),
                                     shifted(last, dt.timedelta(milliseconds=1), "the last row's time"))
            if gaps:
                spans = ", ".join(f"[{a.isoformat()}, {b.isoformat()})" for a, b in gaps[:3])
                click.secho(f"warning: `{view.name}` was never backfilled over {spans}"
                            f"{' ...' if len(gaps) > 3 else ''}: rows there hold its values as of the last "
                            "backfilled change at or before them (null past the ttl, or without one), without the "
                            f"events since; run `featurectl backfill --view {view.name} --start "
                            f"{gaps[0][0].isoformat()} --end {gaps[-1][1].isoformat()}`", fg="yellow", err=True)
    finally:
        backfill_log.close()


@click.command("training-set")
@click.option("--entities", "entities_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Parquet or CSV: join keys and `event_timestamp` per row, and the request fields of on-demand "
                   "features")
@click.option("--service", default=None, help="feature service whose features to join")
@click.option("--feature", "feature_refs", multiple=True, help="`view:feature` to join (repeatable), instead of "
              "--service")
@click.option("--from-log", "log_service", default=None, metavar="SERVICE", help="join --labels onto the vectors "
              "`featurectl serve` logged for this feature service, instead of --entities")
@click.option("--labels", "labels_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="with --from-log, Parquet or CSV: the service's join keys, `event_timestamp` and label columns")
@click.option("--out", "--output", "out_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Parquet file to write")
@click.option("--full-feature-names", is_flag=True, help="name columns `view__feature`")
@click.pass_obj
def training_set(ctx, entities_path: Path | None, service: str | None, feature_refs: tuple[str, ...],
                 log_service: str | None, labels_path: Path | None, out_path: Path, full_feature_names: bool) -> None:
    """Join point-in-time-correct feature values onto entity rows: as of each row's time, never later. With
    --from-log, join labels onto the latest vector served for their entity at or before their time."""
    if log_service or labels_path:
        if not (log_service and labels_path) or entities_path or service or feature_refs or full_feature_names:
            raise click.UsageError("--from-log SERVICE takes --labels FILE and --out FILE, and none of --entities, "
                                   "--service, --feature, --full-feature-names")
        _training_set_from_log(ctx.config(), log_service, labels_path, out_path)
        return
    if not entities_path:
        raise click.UsageError("pass --entities FILE (or --from-log SERVICE --labels FILE)")
    if bool(service) == bool(feature_refs):
        raise click.UsageError("pass either --service NAME or one or more --feature view:feature")
    _training_set(ctx.config(), entities_path, service or list(feature_refs), out_path, full_feature_names)


def _training_set(cfg: ProjectConfig, entities_path: Path, features: str | list[str], out_path: Path,
                  full_feature_names: bool) -> None:
    import pyarrow.parquet as pq

    from batch.training import entity_columns, request_times_ms, resolve_features, stored_reads, training_table
    from dsl import load_repo
    from dsl.compile_feast import EVENT_TIMESTAMP

    repo = load_repo(cfg.repo_path)
    began = time.monotonic()
    wanted = resolve_features(repo, features)
    entities = read_entities(entities_path, types=entity_columns(wanted))
    table = training_table(entities, features, repo, cfg.data_storage, full_feature_names=full_feature_names)
    _warn_uncovered(cfg, [view for view, _ in stored_reads(wanted)], request_times_ms(entities, EVENT_TIMESTAMP))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_path)
    added = table.num_columns - entities.num_columns
    click.echo(f"wrote {table.num_rows:,} rows x {added} features to {out_path} in {time.monotonic() - began:.1f} s")


def _training_set_from_log(cfg: ProjectConfig, service: str, labels_path: Path, out_path: Path) -> None:
    import pyarrow.parquet as pq
    from feast import FeatureStore

    from batch.training_log import label_key_types, logged_training_table

    began = time.monotonic()
    store = FeatureStore(config=cfg.feast_repo_config())
    labels = read_entities(labels_path, "--labels", types=label_key_types(service, store))
    table = logged_training_table(labels, service, store)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_path)
    matched = table.num_rows - table.column("__request_id").null_count
    click.echo(f"wrote {table.num_rows:,} label rows ({matched:,} with a logged vector) x "
               f"{table.num_columns - labels.num_columns} logged columns to {out_path} in "
               f"{time.monotonic() - began:.1f} s")


COMMANDS = [backfill, training_set]
