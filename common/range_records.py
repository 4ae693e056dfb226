"""Tables of per-view time ranges in the registry database (the backfill log, the quality log), where recording a
range replaces the records of the ranges it contains, as the offline table's rows are replaced."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa


def range_columns() -> list[sa.Column]:
    """The columns every such table starts with: id, project, view and the range [start, end)."""
    return [sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("project", sa.String(255), nullable=False),
            sa.Column("view", sa.String(255), nullable=False),
            sa.Column("start", sa.DateTime(timezone=True), nullable=False),
            sa.Column("end", sa.DateTime(timezone=True), nullable=False)]


def replace_contained(engine: sa.Engine, table: sa.Table, project: str, view: str, start: dt.datetime,
                      end: dt.datetime, **values: Any) -> None:
    """Insert the record of [start, end) in one transaction with dropping the view's records within it."""
    c = table.c
    with engine.begin() as conn:
        conn.execute(table.delete().where(c.project == project, c.view == view, c.start >= start, c.end <= end))
        conn.execute(table.insert().values(project=project, view=view, start=start, end=end, **values))


def delete_project(engine: sa.Engine, table: sa.Table, project: str) -> int:
    """Forget every record of `project` (its teardown); how many there were."""
    with engine.begin() as conn:
        return conn.execute(table.delete().where(table.c.project == project)).rowcount
