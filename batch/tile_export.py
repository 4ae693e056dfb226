"""One Flink batch job: the tile queries of several views over a range of event time -> Parquet files.

Each view's compiled tile query runs unchanged. It reads the relation named after its source; here that name is
a CTE over the Parquet source table that keeps the events in [history start, end), the batch counterpart of
the streaming view over Kafka. Views of one source get the same CTE, so Flink scans the source once for all of
them (sub-plan reuse), and each view's tiles go straight to a filesystem sink: no row crosses into Python.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from common.flink import pin_planner
from common.storage import Storage
from dsl.compile_flink import TILE_START, CompiledView
from dsl.feature_view import FeatureView
from dsl.sql import create_table, quote_ident

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TileJob:
    """A view, its compiled SQL, and the event-time range [history_start_ms, end_ms) its tiles need."""

    view: FeatureView
    compiled: CompiledView
    history_start_ms: int
    end_ms: int


def source_ranges(jobs: list[TileJob]) -> dict[str, tuple[int, int]]:
    """Per source, the event-time range [start, end) that covers all its views (one shared scan); views of one
    source end where the source does."""
    ranges: dict[str, tuple[int, int]] = {}
    for job in jobs:
        start, end = ranges.get(job.compiled.source, (job.history_start_ms, job.end_ms))
        if end != job.end_ms:
            raise ValueError(f"views of source `{job.compiled.source}` end at {end} and {job.end_ms}: one scan "
                             "serves them all, so they must end together")
        ranges[job.compiled.source] = (min(start, job.history_start_ms), end)
    return ranges


def export_tiles(env, jobs: list[TileJob], out_dir: Storage) -> dict[str, Storage]:
    """Run all tile queries as one job; returns each view's folder of Parquet tile files (`out_dir`: a folder of
    shared storage, or a local one when the job runs here)."""
    ranges = source_ranges(jobs)
    for statement in jobs[0].compiled.function_ddl:
        env.execute_sql(statement)
    for job in {j.compiled.source: j for j in jobs}.values():
        env.execute_sql(f"DROP TEMPORARY TABLE IF EXISTS {quote_ident(job.compiled.source)}")
        env.execute_sql(job.compiled.batch_source_ddl)
    statements = env.create_statement_set()
    folders = {}
    for job in jobs:
        folders[job.view.name] = out_dir.child(job.view.name)
        sink = f"{job.view.name}__tiles"
        env.execute_sql(f"DROP TEMPORARY TABLE IF EXISTS {quote_ident(sink)}")
        env.execute_sql(_sink_ddl(sink, job, folders[job.view.name]))
        statements.add_insert_sql(f"INSERT INTO {quote_ident(sink)}\n"
                                  f"{_ranged_query(job, *ranges[job.compiled.source])}")
    log.info("running the tile queries of %s in one Flink batch job", ", ".join(j.view.name for j in jobs))
    pin_planner(env)
    statements.execute().wait()
    return folders


def _ranged_query(job: TileJob, start_ms: int, end_ms: int) -> str:
    source = quote_ident(job.compiled.source)
    ts = quote_ident(job.view.source.timestamp_field)
    return (f"WITH {source} AS (\n  SELECT * FROM {source} WHERE {ts} >= {start_ms} AND {ts} < {end_ms}\n)\n"
            f"{job.compiled.tile_query}")


def _sink_ddl(sink: str, job: TileJob, folder: Storage) -> str:
    columns = [f"{quote_ident(k)} {kind.flink_sql}" for k, kind in job.view.entity.join_keys.items()]
    columns.append(f"{quote_ident(TILE_START)} BIGINT")
    columns += [f"{quote_ident(c.name)} {c.sql_type}" for c in job.compiled.tile_columns]
    return create_table(sink, columns, {"connector": "filesystem", "path": folder.uri, "format": "parquet"})
