"""The history a stream starts from: per source, its cutover and the batch side's tiles of the events before it.

The cutover of a source is one past the greatest event time in its Parquet history (capped at now): the history
is taken as complete up to its last event, and everything from there on comes from Kafka. The tiles before the
cutover are what a backfill computes: the same compiled tile queries, run here in one Flink batch job over the
events in [cutover - longest window - ttl - tile, cutover), so a stream's windows start where the history left
them and each entity's last change (a tile leaving a window, up to a ttl back) is known.
`featurectl stream` hands an object of this class to the stream runner, which decides when a stream needs it
(first start, or after its state is gone).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Optional, Sequence

from batch.backfill_log import BackfillLog
from batch.input_schema import HistoryCheck, SourceNeeds, check_history
from batch.tile_export import TileJob, export_tiles
from common.flink import create_table_env
from common.instants import format_epoch_ms, from_epoch_ms
from common.storage import Storage, remote
from dsl.compile_flink import CompiledView, source_location
from dsl.feature_view import FeatureView
from dsl.source import EventSource

log = logging.getLogger(__name__)


class ParquetHistory:
    """The Parquet history of a repo's sources (`data_dir`), and the backfill record that says which ranges of
    each view's offline table were computed from it."""

    def __init__(self, data_dir: Path | Storage, registry_url: str, project: str, *, jobmanager: Optional[str] = None,
                 parallelism: int = 1, storage: Optional[Storage] = None):
        """`storage`: the shared storage the export's folder is in, when it is not local (`common.storage`)."""
        self.data_dir = data_dir
        self.storage = storage
        self.registry_url = registry_url
        self.project = project
        self.jobmanager = jobmanager
        self.parallelism = parallelism
        self._warned: set[str] = set()

    def cutovers(self, sources: Sequence[EventSource], now_ms: int) -> dict[str, int]:
        """Per source with history: one past its last event, at most `now_ms`; sources without history are left
        out (their streams count every Kafka event they read), with a warning."""
        latest = self._check([SourceNeeds.event_time(s) for s in sources]).latest_ms
        out = {}
        for source in sources:
            end = latest[source.name]
            if end is None:
                log.warning("source `%s` has no history at %s: its windows start empty and count only the events "
                            "the stream reads from Kafka; to start them from history, write its Parquet files "
                            "there and run `featurectl stream --reset`", source.name,
                            source_location(source, self.data_dir))
                continue
            if end >= now_ms:
                log.warning("source `%s` has history up to %s, after now: the stream counts Kafka events from now "
                            "on and takes the rest from the history", source.name, format_epoch_ms(end))
            out[source.name] = min(end + 1, now_ms)
        return out

    def export(self, views: Sequence[tuple[FeatureView, CompiledView]], cutovers: Mapping[str, int],
               folder: Storage) -> dict[str, Storage]:
        """Each view's tiles of the events before its source's cutover (enough for its longest window and for when
        an entity last changed within the ttl), as Parquet files under `folder/<view>/`; views whose source has no
        cutover get none."""
        jobs = []
        for view, compiled in views:
            cutover = cutovers.get(compiled.source)
            if cutover is None:
                continue
            first = cutover // compiled.tile_ms * compiled.tile_ms - compiled.longest_ms - compiled.ttl_ms
            jobs.append(TileJob(view, compiled, first, cutover))
        if not jobs:
            return {}
        self._check(SourceNeeds.of_views([job.view for job in jobs]))
        storage = remote(self.storage, *(source_location(job.view.source, self.data_dir) for job in jobs))
        env = create_table_env(streaming=False, parallelism=self.parallelism, jobmanager=self.jobmanager,
                               storage=storage)
        folders = export_tiles(env, jobs, folder)
        self._warn_gaps(jobs)
        return folders

    def _check(self, needs: list[SourceNeeds]) -> HistoryCheck:
        """The history's files against what is read of them (`batch.input_schema`); each warning is shown once,
        though the cutovers and the export both check the event times."""
        checked = check_history(needs, self.data_dir, require_rows=False)
        for warning in checked.warnings:
            if warning not in self._warned:
                self._warned.add(warning)
                log.warning(warning)
        return checked

    def _warn_gaps(self, jobs: list[TileJob]) -> None:
        """Say which parts of the history before a cutover no backfill computed: the stream is right without
        them, but training sets and `featurectl materialize` read the offline table."""
        backfills = BackfillLog(self.registry_url)
        try:
            for job in jobs:
                start, end = from_epoch_ms(job.history_start_ms), from_epoch_ms(job.end_ms)
                for lo, hi in backfills.gaps(self.project, job.view.name, start, end):
                    log.warning("view `%s`: no backfill covers %s to %s, before the stream's cutover; the stream "
                                "starts from the Parquet history regardless, but training sets and materialize "
                                "read the offline table: run `featurectl backfill --start %s --end %s --view %s`",
                                job.view.name, lo.isoformat(), hi.isoformat(), lo.isoformat(), hi.isoformat(),
                                job.view.name)
        finally:
            backfills.close()
