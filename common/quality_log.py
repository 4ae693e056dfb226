"""What each backfill's data-quality checks found, and the profile of its rows: one table beside Feast's in the
registry database (SQLite or PostgreSQL), next to the backfill log (`batch.backfill_log`).

One row per backfill of one view: project, view, the range [start, end), when it finished, whether every check
passed, the report (rows checked; per expectation the feature, the observed value, how many rows failed and a
few of them; the mean of every numeric feature, which `MaxChange` compares with; the share of rows without a value
of every feature, which `featurectl report` plots) and the profile of each feature
(`common.feature_profile`). Like the backfill log, recording a range drops the records of ranges it contains,
and where ranges overlap the newer one holds the rows: `materialize` asks which records hold the rows it would
write (`holding`), the feature server asks for each view's latest profiles (`latest_profiles`).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import sqlalchemy as sa

from common.feature_profile import FeatureProfile
from common.instants import as_utc
from common.range_records import delete_project, range_columns, replace_contained
from common.spans import newest_per_part

TABLE_NAME = "featurectl_quality"

_metadata = sa.MetaData()
quality = sa.Table(
    TABLE_NAME, _metadata, *range_columns(),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("passed", sa.Boolean, nullable=False),
    sa.Column("report", sa.Text, nullable=False),
    sa.Column("profiles", sa.Text, nullable=False),
    sa.Index("ix_featurectl_quality_project_view", "project", "view"),
    sqlite_autoincrement=True,  # ids only grow, also past a deleted newest record: the latest is the largest
)


@dataclass(frozen=True)
class CheckResult:
    """One expectation over one backfill's rows. `value` is the observed figure the check compared (rows outside
    the range or the allowed values, the not-null rate, the relative change of the mean; None: nothing to
    compare), `observed` says it in words, `samples` are a few failing rows (join keys, time, value)."""

    feature: str
    expectation: str
    passed: bool
    observed: str
    value: Optional[float]
    rows: int
    failing: int = 0
    samples: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class QualityRecord:
    project: str
    view: str
    start: dt.datetime
    end: dt.datetime
    finished_at: dt.datetime
    rows: int
    checks: tuple[CheckResult, ...] = ()
    means: dict[str, float] = field(default_factory=dict)  # of every numeric feature with a value
    null_rates: dict[str, float] = field(default_factory=dict)  # share of rows without a value, every feature
    profiles: dict[str, FeatureProfile] = field(default_factory=dict)
    id: Optional[int] = None  # set once recorded

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[CheckResult]:
        return [check for check in self.checks if not check.passed]


def _report_json(record: QualityRecord) -> str:
    return json.dumps({"rows": record.rows, "checks": [asdict(c) for c in record.checks], "means": record.means,
                       "null_rates": record.null_rates})


def _profiles_json(profiles: dict[str, FeatureProfile]) -> str:
    return json.dumps({name: profile.to_json() for name, profile in profiles.items()})


def _profiles(text: str) -> dict[str, FeatureProfile]:
    return {name: FeatureProfile.from_json(data) for name, data in json.loads(text).items()}


def _record_of(row: Any) -> QualityRecord:
    report = json.loads(row["report"])
    checks = tuple(CheckResult(**{**c, "samples": tuple(c["samples"])}) for c in report["checks"])
    return QualityRecord(row["project"], row["view"], as_utc(row["start"]), as_utc(row["end"]),
                         as_utc(row["finished_at"]), report["rows"], checks, report["means"],
                         report.get("null_rates", {}), _profiles(row["profiles"]), row["id"])


class QualityLog:
    """The quality records of one registry database (`url`: a SQLAlchemy URL, as Feast's SQL registry takes)."""

    def __init__(self, url: str):
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        try:
            _metadata.create_all(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:  # another process (a server's workers start together) made it meanwhile
            _metadata.create_all(self.engine, checkfirst=True)

    def close(self) -> None:
        self.engine.dispose()

    def record(self, entry: QualityRecord) -> None:
        """Store `entry`, replacing the records of ranges of the same view that lie within it."""
        replace_contained(self.engine, quality, entry.project, entry.view, as_utc(entry.start), as_utc(entry.end),
                          finished_at=as_utc(entry.finished_at), passed=entry.passed, report=_report_json(entry),
                          profiles=_profiles_json(entry.profiles))

    def records(self, project: str, view: str) -> list[QualityRecord]:
        """The view's records, oldest first."""
        query = (sa.select(quality).where(quality.c.project == project, quality.c.view == view)
                 .order_by(quality.c.id))
        with self.engine.connect() as conn:
            return [_record_of(row) for row in conn.execute(query).mappings().all()]

    def holding(self, project: str, view: str, start: dt.datetime, end: dt.datetime) -> list[QualityRecord]:
        """The records whose rows the view's offline table holds somewhere in [start, end] (a newer record
        covering all of an older one's part of it hides the older one), in time order."""
        start, end = as_utc(start), as_utc(end)
        records = self.records(project, view)
        parts = newest_per_part([(r.start, r.end, r) for r in records])
        holding = [r for lo, hi, r in parts if lo <= end and hi > start]
        return list({r.id: r for r in holding}.values())

    def baseline(self, project: str, view: str, start: dt.datetime, end: dt.datetime) -> Optional[QualityRecord]:
        """What a new backfill of [start, end) compares with: the record of that same range, else the latest."""
        records = self.records(project, view)
        same = [r for r in records if r.start == as_utc(start) and r.end == as_utc(end)]
        return (same or records or [None])[-1]

    def latest_profiles(self, project: str) -> dict[str, dict[str, FeatureProfile]]:
        """View -> feature -> profile, of each view's latest backfill."""
        newest = (sa.select(sa.func.max(quality.c.id)).where(quality.c.project == project)
                  .group_by(quality.c.view))
        query = sa.select(quality.c.view, quality.c.profiles).where(quality.c.id.in_(newest))
        with self.engine.connect() as conn:
            return {view: _profiles(text) for view, text in conn.execute(query).all()}

    def delete_project(self, project: str) -> int:
        """Forget every record of `project` (its teardown); how many there were."""
        return delete_project(self.engine, quality, project)
