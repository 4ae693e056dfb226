"""Which version of each feature view is applied, and which version wrote its online values: two tables beside
Feast's in the registry database (SQLite or PostgreSQL), as the backfill log is.

`featurectl_view_versions` is the history: one row each time `apply` registers a view whose definition changed
(its version, its definition as JSON, when), and one row with no version when `apply` removes a view. The latest
row of a view is what is applied. `featurectl_online_versions` holds one row per view: the version whose values
the last `materialize` or the last start of `featurectl stream` wrote to Redis, and whether they were offline
rows of another version accepted as this one (`materialize --allow-stale`). The server compares the two.

A table of our own rather than tags on Feast's objects: tags hold no history, and the backfill log, kept in
the same database, records the version of each range it holds.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import sqlalchemy as sa

from common.instants import as_utc

_metadata = sa.MetaData()
applied_versions = sa.Table(
    "featurectl_view_versions", _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("project", sa.String(255), nullable=False),
    sa.Column("view", sa.String(255), nullable=False),
    sa.Column("version", sa.String(64), nullable=True),  # NULL: the view was removed
    sa.Column("definition", sa.Text, nullable=True),
    sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_featurectl_view_versions_project_view", "project", "view"),
)
online_versions = sa.Table(
    "featurectl_online_versions", _metadata,
    sa.Column("project", sa.String(255), primary_key=True),
    sa.Column("view", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(64), nullable=False),
    sa.Column("written_by", sa.String(255), nullable=False),
    sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("stale_accepted", sa.Boolean, nullable=False),
)


@dataclass(frozen=True)
class AppliedVersion:
    view: str
    version: Optional[str]  # None: removed by this apply
    definition: Optional[dict[str, Any]]
    applied_at: dt.datetime


@dataclass(frozen=True)
class OnlineVersion:
    view: str
    version: str
    written_by: str  # e.g. `featurectl materialize`
    written_at: dt.datetime
    stale_accepted: bool = False  # offline rows of another version, written as this one (`--allow-stale`)


def _create_tables(engine: sa.Engine) -> None:
    try:
        _metadata.create_all(engine, checkfirst=True)
    except sa.exc.DBAPIError:  # another process (a server's workers start together) made one between check and create
        _metadata.create_all(engine, checkfirst=True)


class VersionLog:
    """The version records of one registry database (`url`: a SQLAlchemy URL, as Feast's SQL registry takes)."""

    def __init__(self, url: str):
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        _create_tables(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def record_applied(self, project: str, applied: Mapping[str, tuple[str, dict]], removed: Iterable[str],
                       at: dt.datetime) -> None:
        """One history row per view in `applied` (view -> (version, definition)) and per view `removed`."""
        rows = [{"project": project, "view": view, "version": version, "definition": json.dumps(definition),
                 "applied_at": as_utc(at)} for view, (version, definition) in applied.items()]
        rows += [{"project": project, "view": view, "version": None, "definition": None, "applied_at": as_utc(at)}
                 for view in removed]
        if rows:
            with self.engine.begin() as conn:
                conn.execute(applied_versions.insert(), rows)

    def history(self, project: str, view: Optional[str] = None) -> list[AppliedVersion]:
        """Every apply of the project's views (or of `view`), oldest first."""
        query = (sa.select(applied_versions).where(applied_versions.c.project == project)
                 .order_by(applied_versions.c.id))
        if view is not None:
            query = query.where(applied_versions.c.view == view)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [AppliedVersion(r["view"], r["version"], json.loads(r["definition"]) if r["definition"] else None,
                               as_utc(r["applied_at"])) for r in rows]

    def applied(self, project: str) -> dict[str, AppliedVersion]:
        """What is applied now: the latest history row of each view that was not removed since."""
        latest = {record.view: record for record in self.history(project)}
        return {view: record for view, record in latest.items() if record.version is not None}

    def record_online(self, project: str, versions: Mapping[str, str], written_by: str, at: dt.datetime,
                      stale_accepted: bool = False) -> None:
        """The online values of each view in `versions` (view -> version) were just written by `written_by`."""
        with self.engine.begin() as conn:
            for view, version in versions.items():
                conn.execute(online_versions.delete().where(online_versions.c.project == project,
                                                            online_versions.c.view == view))
                conn.execute(online_versions.insert().values(project=project, view=view, version=version,
                                                             written_by=written_by, written_at=as_utc(at),
                                                             stale_accepted=stale_accepted))

    def online(self, project: str) -> dict[str, OnlineVersion]:
        query = sa.select(online_versions).where(online_versions.c.project == project)
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return {r["view"]: OnlineVersion(r["view"], r["version"], r["written_by"], as_utc(r["written_at"]),
                                         r["stale_accepted"]) for r in rows}

    def conflicts(self, project: str) -> dict[str, tuple[OnlineVersion, AppliedVersion]]:
        """The views whose online values are of another version than the one applied, with both records."""
        applied, online = self.applied(project), self.online(project)
        return {view: (written, applied[view]) for view, written in online.items()
                if view in applied and applied[view].version != written.version}

    def forget_online(self, project: str, views: Sequence[str]) -> None:
        """These views' online values are gone (`apply` removed the views, and Feast's apply their online table)."""
        if not views:
            return
        with self.engine.begin() as conn:
            conn.execute(online_versions.delete().where(online_versions.c.project == project,
                                                        online_versions.c.view.in_(list(views))))

    def clear_online(self, project: str) -> None:
        """The project's online values are gone (`teardown`)."""
        with self.engine.begin() as conn:
            conn.execute(online_versions.delete().where(online_versions.c.project == project))

    def delete_project(self, project: str) -> int:
        """Forget the project's version history and online versions (its teardown); how many history rows."""
        with self.engine.begin() as conn:
            conn.execute(online_versions.delete().where(online_versions.c.project == project))
            return conn.execute(applied_versions.delete().where(applied_versions.c.project == project)).rowcount
