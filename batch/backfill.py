"""Backfill: historical events -> each view's offline feature table, for boundaries in [start, end).

1. One Flink batch job runs every view's compiled tile query over the Parquet history, reading from a longest
   window (or ttl) before `start`, since windows that end in the range need those tiles (`batch.tile_export`).
2. Per view, the tiles become window values at the boundaries where they change (`batch.windows`), chunk by
   chunk of entities, vectorized, and replace the range in the offline table (`batch.offline_table`).
3. Each view's written rows are checked against its expectations and profiled (`batch.quality`), then the range
   is recorded in the registry database (`batch.backfill_log`), with the version of each view that computed it
   (`dsl.view_version`), which `materialize` checks against the applied one, as it checks the quality record.
Views over an asset source that `featurectl assets process` has not written yet are left out, with a warning:
that command, not outside data, makes their history.
"""

from __future__ import annotations

import datetime as dt
import logging
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol, Sequence

import pyarrow.dataset as ds

from batch.backfill_log import BackfillLog, BackfillRecord
from batch.input_schema import SourceNeeds, check_history
from batch.offline_table import RangeWriter
from batch.quality import check_backfill
from batch.tile_export import TileJob, export_tiles, source_ranges
from batch.windows import TileGrid, offline_rows, offline_schema
from common.errors import FeaturectlError
from common.flink import create_table_env
from common.instants import check_range, format_epoch_ms
from common.quality_log import QualityRecord
from common.storage import Storage, as_storage, remote
from dsl.assets import AssetSource
from dsl.compile_feast import offline_table_location
from dsl.compile_flink import SourceSettings, compile_view, source_location
from dsl.feature_view import FeatureView
from dsl.view_version import view_version

log = logging.getLogger(__name__)


class BackfillError(FeaturectlError, RuntimeError):
    """A backfill cannot run as asked; the message says why and what to do."""


class Progress(Protocol):
    """Where a backfill reports progress (the CLI draws bars); stages run one after another."""

    def stage(self, name: str, total: int, unit: str) -> None: ...

    def advance(self, n: int) -> None: ...


class _Silent:
    def stage(self, name: str, total: int, unit: str) -> None:
        log.info("%s: %d %s", name, total, unit)

    def advance(self, n: int) -> None:
        pass


@dataclass(frozen=True)
class BackfillTarget:
    """Where a backfill reads and writes: the history and offline tables, and the registry that records it."""

    data_dir: Path | Storage  # the sources' histories and the offline tables: a local folder or shared storage
    registry_url: str
    project: str
    bootstrap_servers: str = ""  # only the streaming DDL of the compiled views uses it
    storage: Optional[Storage] = None  # shared storage for the exported tiles; None: a folder beside the tables


@dataclass
class ViewResult:
    view: str
    rows: int
    files: int
    version: Optional[str] = None
    quality: Optional[QualityRecord] = None  # what its expectations found, and the profile of its rows


@dataclass
class BackfillSummary:
    start: dt.datetime
    end: dt.datetime
    events_read: int = 0
    seconds: float = 0.0
    views: list[ViewResult] = field(default_factory=list)

    @property
    def rows_written(self) -> int:
        return sum(v.rows for v in self.views)

    @property
    def files(self) -> int:
        return sum(v.files for v in self.views)


def _epoch_ms(value: dt.datetime, name: str) -> int:
    if value.tzinfo is None:
        raise BackfillError(f"`{name}` {value} has no time zone: pass an aware datetime (UTC)")
    return int(value.timestamp() * 1000)


def backfill(views: Sequence[FeatureView], start: dt.datetime, end: dt.datetime, target: BackfillTarget, *,
             env=None, parallelism: int = 1, jobmanager: Optional[str] = None,
             progress: Optional[Progress] = None) -> BackfillSummary:
    """Write the offline rows of `views` for boundaries in [start, end), replacing what that range held.

    `env` is a batch TableEnvironment to reuse (PyFlink takes seconds to start one); by default one is made
    with `parallelism` and, for a remote cluster, `jobmanager` (whose task managers must reach `data_dir`).
    """
    began = time.monotonic()
    start_ms, end_ms = _epoch_ms(start, "start"), _epoch_ms(end, "end")
    check_range(start, end)
    if not views:
        raise BackfillError("no feature views to backfill: define some, or name them with --view")
    views = _with_history(views, target.data_dir)
    progress = progress or _Silent()
    settings = SourceSettings(target.bootstrap_servers, target.data_dir)
    compiled = [compile_view(v, settings) for v in views]
    jobs = [TileJob(v, c, TileGrid.of(c, start_ms, end_ms).origin_ms, end_ms) for v, c in zip(views, compiled)]
    for warning in check_history(SourceNeeds.of_views(views), target.data_dir).warnings:
        log.warning(warning)
    summary = BackfillSummary(start, end, events_read=_count_events(jobs, settings))
    scratch = _scratch(target)
    try:
        progress.stage("flink: tiles", summary.events_read, "ev")
        storage = remote(target.storage, *(source_location(v.source, target.data_dir) for v in views))
        env = env or create_table_env(streaming=False, parallelism=parallelism, jobmanager=jobmanager,
                                      storage=storage)
        folders = export_tiles(env, jobs, scratch)
        progress.advance(summary.events_read)
        for job in jobs:
            summary.views.append(_write_view(job, folders[job.view.name], start_ms, end_ms, target, progress))
    finally:
        scratch.delete()
    checked = check_backfill(list(views), start, end, target.data_dir, target.registry_url, target.project)
    for result in summary.views:
        result.quality = checked[result.view]
    _record(summary, target)
    summary.seconds = time.monotonic() - began
    return summary


def _with_history(views: Sequence[FeatureView], data_dir: Path | Storage) -> list[FeatureView]:
    """`views` less those over an asset source without history yet (warned about); none left is an error."""
    kept, waiting = [], []
    for view in views:
        unwritten = isinstance(view.source, AssetSource) and not any(
            name.endswith(".parquet") for name in source_location(view.source, data_dir).readable_files())
        (waiting if unwritten else kept).append(view)
    for view in waiting:
        log.warning("view `%s` is left out: asset source `%s` has no derived assets yet; run `featurectl assets "
                    "process` first", view.name, view.source.name)
    if not kept:
        raise BackfillError(f"nothing to backfill: {', '.join(f'`{v.name}`' for v in waiting)} read asset sources "
                            "without derived assets; run `featurectl assets process` first")
    return kept


def _scratch(target: BackfillTarget) -> Storage:
    """A new folder for the job's tiles: in shared storage when configured (the task managers write them), else
    beside the offline tables."""
    if target.storage is not None:
        return target.storage.child("tiles", f"{target.project}-{uuid.uuid4().hex}")
    data = as_storage(target.data_dir)
    if not data.is_local:
        return data.child("offline", f".tiles-{uuid.uuid4().hex}")
    offline_root = Path(data.display) / "offline"
    offline_root.mkdir(parents=True, exist_ok=True)
    return Storage.local(Path(tempfile.mkdtemp(prefix=".tiles-", dir=offline_root)))


def _count_events(jobs: list[TileJob], settings: SourceSettings) -> int:
    """Events the job reads: those of each source in its range (Parquet statistics and one column); a source
    with none there is worth a warning, since its views' rows of the range will be empty."""
    total = 0
    for source_name, (lo, hi) in source_ranges(jobs).items():
        source = next(j.view.source for j in jobs if j.compiled.source == source_name)
        ts = ds.field(source.timestamp_field)
        dataset = source_location(source, settings.data_dir).dataset()
        count = dataset.count_rows(filter=(ts >= lo) & (ts < hi)) if dataset is not None else 0
        if not count:
            log.warning("source `%s`: none of its events is in [%s, %s), the event times this backfill reads: "
                        "its views' rows of the range are empty", source_name, format_epoch_ms(lo),
                        format_epoch_ms(hi))
        total += count
    return total


def _write_view(job: TileJob, tiles_folder: Storage, start_ms: int, end_ms: int, target: BackfillTarget,
                progress: Progress) -> ViewResult:
    view = job.view
    # The sink writes no file when a view has no tiles in range; the range is then replaced by nothing.
    dataset = tiles_folder.dataset()
    tiles = dataset.to_table() if dataset is not None else None
    tiles = tiles if tiles is not None and tiles.num_rows else None
    progress.stage(f"windows: {view.name}", tiles.num_rows if tiles else 0, "tiles")
    table = offline_table_location(target.data_dir, view)
    with RangeWriter(table, offline_schema(job.compiled), start_ms, end_ms) as writer:
        for rows, chunk_tiles in offline_rows(job.compiled, tiles, start_ms, end_ms) if tiles else ():
            writer.write(rows)
            progress.advance(chunk_tiles)
        stats = writer.commit()
    log.info("backfilled %s: %d rows in %d files", view.name, stats.rows, stats.files)
    return ViewResult(view.name, stats.rows, stats.files, view_version(view, job.compiled))


def _record(summary: BackfillSummary, target: BackfillTarget) -> None:
    backfill_log = BackfillLog(target.registry_url)
    try:
        finished = dt.datetime.now(dt.timezone.utc)
        for result in summary.views:
            backfill_log.record(BackfillRecord(target.project, result.view, summary.start, summary.end,
                                               result.rows, result.files, finished, result.version))
    finally:
        backfill_log.close()
