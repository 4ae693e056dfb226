"""The record of what was backfilled: one table beside Feast's in the registry database (SQLite or PostgreSQL).

One row per finished backfill of one view: project, view, the range [start, end), rows and files written, when
it finished, and the view's version that computed it (`dsl.view_version`; NULL for ranges backfilled before
versions were recorded). Recording a range drops the records of ranges it contains, as the offline table drops
their rows, so the record reads like the table: re-running a range replaces it, and where ranges overlap the
newer one holds the rows. Training sets ask it which parts of a time span no backfill covered; `materialize`
and `plan` ask which version holds each part (`versions`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional

import sqlalchemy as sa

from common.instants import as_utc
from common.range_records import delete_project, range_columns, replace_contained
from common.spans import newest_per_part

TABLE_NAME = "featurectl_backfills"

_metadata = sa.MetaData()
backfills = sa.Table(
    TABLE_NAME, _metadata, *range_columns(),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("files", sa.Integer, nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("version", sa.String(64), nullable=True),
    sa.Index("ix_featurectl_backfills_project_view", "project", "view"),
)


@dataclass(frozen=True)
class BackfillRecord:
    project: str
    view: str
    start: dt.datetime
    end: dt.datetime
    rows: int
    files: int
    finished_at: dt.datetime
    version: Optional[str] = None  # the view's version that computed the range; None: not recorded


@dataclass(frozen=True)
class VersionedSpan:
    """A part of a view's offline table, [start, end), and the version that wrote it (None: not recorded)."""

    start: dt.datetime
    end: dt.datetime
    version: Optional[str]


def _add_version_column(engine: sa.Engine) -> None:
    """A table made before versions were recorded gets the column (NULL for its rows)."""
    if "version" in {c["name"] for c in sa.inspect(engine).get_columns(TABLE_NAME)}:
        return
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {TABLE_NAME} ADD COLUMN version VARCHAR(64)"))
    except sa.exc.DBAPIError:  # another process added it first
        if "version" not in {c["name"] for c in sa.inspect(engine).get_columns(TABLE_NAME)}:
            raise


class BackfillLog:
    """The backfill records of one registry database (`url`: a SQLAlchemy URL, as Feast's SQL registry takes)."""

    def __init__(self, url: str):
        self.engine = sa.create_engine(url)
        _metadata.create_all(self.engine, checkfirst=True)
        _add_version_column(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def record(self, entry: BackfillRecord) -> None:
        """Store `entry`, replacing the records of ranges of the same view that lie within it."""
        replace_contained(self.engine, backfills, entry.project, entry.view, as_utc(entry.start), as_utc(entry.end),
                          rows=entry.rows, files=entry.files, finished_at=as_utc(entry.finished_at),
                          version=entry.version)

    def records(self, project: str, view: Optional[str] = None) -> list[BackfillRecord]:
        query = sa.select(backfills).where(backfills.c.project == project).order_by(backfills.c.start, backfills.c.id)
        if view is not None:
            query = query.where(backfills.c.view == view)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [BackfillRecord(r["project"], r["view"], as_utc(r["start"]), as_utc(r["end"]), r["rows"], r["files"],
                               as_utc(r["finished_at"]), r["version"]) for r in rows]

    def gaps(self, project: str, view: str, start: dt.datetime,
             end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
        """The parts of [start, end) that no recorded backfill of `view` covers."""
        start, end = as_utc(start), as_utc(end)
        out, cursor = [], start
        for record in self.records(project, view):
            if record.end <= cursor or record.start >= end:
                continue
            if record.start > cursor:
                out.append((cursor, record.start))
            cursor = max(cursor, record.end)
        if cursor < end:
            out.append((cursor, end))
        return out

    def versions(self, project: str, view: str) -> list[VersionedSpan]:
        """The backfilled parts of `view`'s offline table in time order, each with the version of the newest record
        covering it (the one whose rows the table holds there); touching parts of one version are merged."""
        query = (sa.select(backfills.c.start, backfills.c.end, backfills.c.version)
                 .where(backfills.c.project == project, backfills.c.view == view).order_by(backfills.c.id))
        with self.engine.connect() as conn:
            newest_last = [(as_utc(s), as_utc(e), v) for s, e, v in conn.execute(query).all()]
        spans: list[VersionedSpan] = []
        for lo, hi, version in newest_per_part(newest_last):
            if spans and spans[-1].end == lo and spans[-1].version == version:
                spans[-1] = VersionedSpan(spans[-1].start, hi, version)
            else:
                spans.append(VersionedSpan(lo, hi, version))
        return spans

    def delete_project(self, project: str) -> int:
        """Forget every record of `project` (its teardown); how many there were."""
        return delete_project(self.engine, backfills, project)
