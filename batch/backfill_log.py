"""The record of what was backfilled: one table beside Feast's in the registry database (SQLite or PostgreSQL).

One row per finished backfill of one view: project, view, the range [start, end), rows and files written, when
it finished. Recording a range drops the records of ranges it contains, as the offline table drops their rows,
so the record reads like the table: re-running a range replaces it. Training sets ask it which parts of a time
span no backfill covered.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional

import sqlalchemy as sa

TABLE_NAME = "featurectl_backfills"

_metadata = sa.MetaData()
backfills = sa.Table(
    TABLE_NAME, _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("project", sa.String(255), nullable=False),
    sa.Column("view", sa.String(255), nullable=False),
    sa.Column("start", sa.DateTime(timezone=True), nullable=False),
    sa.Column("end", sa.DateTime(timezone=True), nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("files", sa.Integer, nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
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


def _utc(value: dt.datetime) -> dt.datetime:
    """Aware UTC; SQLite hands back the naive UTC wall time it was given."""
    return value.replace(tzinfo=dt.timezone.utc) if value.tzinfo is None else value.astimezone(dt.timezone.utc)


class BackfillLog:
    """The backfill records of one registry database (`url`: a SQLAlchemy URL, as Feast's SQL registry takes)."""

    def __init__(self, url: str):
        self.engine = sa.create_engine(url)
        _metadata.create_all(self.engine, checkfirst=True)

    def close(self) -> None:
        self.engine.dispose()

    def record(self, entry: BackfillRecord) -> None:
        """Store `entry`, replacing the records of ranges of the same view that lie within it."""
        start, end = _utc(entry.start), _utc(entry.end)
        with self.engine.begin() as conn:
            conn.execute(backfills.delete().where(
                backfills.c.project == entry.project, backfills.c.view == entry.view,
                backfills.c.start >= start, backfills.c.end <= end))
            conn.execute(backfills.insert().values(
                project=entry.project, view=entry.view, start=start, end=end, rows=entry.rows, files=entry.files,
                finished_at=_utc(entry.finished_at)))

    def records(self, project: str, view: Optional[str] = None) -> list[BackfillRecord]:
        query = sa.select(backfills).where(backfills.c.project == project).order_by(backfills.c.start, backfills.c.id)
        if view is not None:
            query = query.where(backfills.c.view == view)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [BackfillRecord(r["project"], r["view"], _utc(r["start"]), _utc(r["end"]), r["rows"], r["files"],
                               _utc(r["finished_at"])) for r in rows]

    def gaps(self, project: str, view: str, start: dt.datetime,
             end: dt.datetime) -> list[tuple[dt.datetime, dt.datetime]]:
        """The parts of [start, end) that no recorded backfill of `view` covers."""
        start, end = _utc(start), _utc(end)
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

    def delete_project(self, project: str) -> int:
        """Forget every record of `project` (its teardown); how many there were."""
        with self.engine.begin() as conn:
            return conn.execute(backfills.delete().where(backfills.c.project == project)).rowcount
