"""Backfill through PyFlink in batch mode: the offline rows are exactly the change boundaries of a raw-event
oracle with its values, a re-run replaces its range, and the registry records what was backfilled."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import window_oracle as oracle
from backfill_history import (CATALOG_CHANGE_MS, HOUR_MS, T0_MS, T1_MS, backfilled_history, batch_env,
                              example_repo_copy, utc)
from batch.backfill import BackfillError, BackfillTarget, backfill
from batch.backfill_log import BackfillLog, BackfillRecord, backfills
from batch.input_schema import InputSchemaError
from batch.offline_table import storable
from common.quality_log import QualityLog
from common.storage import Storage
from batch.windows import offline_schema
from cli_helpers import ROOT, featurectl
from common.instants import InstantError
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_location, offline_table_path
from dsl.compile_flink import SourceSettings, compile_view, source_path
from dsl.view_version import view_version

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def example_repo():
    return load_repo(ROOT / "feature_repo")


@pytest.fixture(scope="module")
def backfill_env():
    return batch_env()


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory, example_repo):
    return backfilled_history(tmp_path_factory, example_repo)


def read_offline(data_dir: Path | Storage, view) -> pa.Table:
    table = offline_table_location(data_dir, view).dataset(partitioning="hive").to_table()
    return table.sort_by([(k, "ascending") for k in view.entity.join_keys] + [(EVENT_TIMESTAMP, "ascending")])


def boundaries_by_entity(view, table: pa.Table) -> dict[tuple, list[int]]:
    out: dict[tuple, list[int]] = {}
    keys = list(view.entity.join_keys)
    stamps = table.column(EVENT_TIMESTAMP).cast(pa.int64()).to_pylist()
    for row, ms in zip(table.select(keys).to_pylist(), stamps):
        out.setdefault(tuple(row[k] for k in keys), []).append(ms)
    return out


def assert_rows_match_oracle(view, table: pa.Table, events: list[dict], start_ms: int, end_ms: int,
                             sample: int = 600) -> None:
    per_entity = oracle.by_entity(view, events)
    got = boundaries_by_entity(view, table)
    want = {key: sorted(oracle.change_boundaries(view, rows, start_ms, end_ms)) for key, rows in per_entity.items()}
    assert got == {k: v for k, v in want.items() if v}, "rows are not exactly the change boundaries"
    rows = table.to_pylist()
    keys = list(view.entity.join_keys)
    for row in random.Random(7).sample(rows, min(sample, len(rows))):
        boundary = int(row[EVENT_TIMESTAMP].timestamp() * 1000)
        expected = oracle.values_at(view, per_entity[tuple(row[k] for k in keys)], boundary)
        assert {name: row[name] for name in expected} == expected, (view.name, row)


@pytest.mark.parametrize("view_name", ["asset_activity", "user_activity", "asset_attributes", "asset_geometry"])
def test_rows_are_the_change_boundaries_with_the_values_as_of_each(example_repo, backfilled, view_name):
    target, events = backfilled.target, backfilled.events
    view = example_repo.view(view_name)
    table = read_offline(target.data_dir, view)
    compiled = compile_view(view, SourceSettings("", target.data_dir))
    assert table.drop_columns(["date"]).schema == storable(offline_schema(compiled).empty_table()).schema
    assert_rows_match_oracle(view, table, events[view.source.name], T0_MS, T1_MS)
    for part in offline_table_path(target.data_dir, view).glob("date=*/*.parquet"):
        stamps = pq.read_table(part).column(EVENT_TIMESTAMP)
        assert {t.date().isoformat() for t in stamps.to_pylist()} == {part.parent.name.removeprefix("date=")}


def test_a_range_starts_with_a_row_for_every_entity_with_values_then(example_repo, backfilled):
    """The catalog rows are older than the range: each asset's attributes still have a row, at the catalog row's
    boundary before the range (not at the range's start, which would restart the ttl there), and the assets that
    change inside the range get a second row there."""
    table = read_offline(backfilled.target.data_dir, example_repo.view("asset_attributes"))
    stamps = pc.value_counts(table.column(EVENT_TIMESTAMP).cast(pa.int64())).to_pylist()
    changed = CATALOG_CHANGE_MS // HOUR_MS * HOUR_MS + HOUR_MS  # the end of the change's tile
    entered: dict[int, int] = {}
    for row in backfilled.events["asset_catalog"]:
        if row["updated_at"] < T0_MS:
            boundary = row["updated_at"] // HOUR_MS * HOUR_MS + HOUR_MS
            entered[boundary] = entered.get(boundary, 0) + 1
    assert sum(entered.values()) == 30 and max(entered) < T0_MS
    assert {s["values"]: s["counts"] for s in stamps} == {**entered, changed: 10}


def test_summary_and_record_of_the_backfill(example_repo, backfilled):
    target, events, summary = backfilled.target, backfilled.events, backfilled.summary
    assert summary.events_read == sum(len(rows) for rows in events.values())
    written = {v.name: read_offline(target.data_dir, v).num_rows for v in example_repo.views}
    assert {r.view: r.rows for r in summary.views} == written
    backfill_log = BackfillLog(target.registry_url)
    records = backfill_log.records("assets")
    backfill_log.close()
    assert {(r.view, r.start, r.end, r.rows) for r in records} == {
        (name, utc(T0_MS), utc(T1_MS), rows) for name, rows in written.items()}
    assert all(r.files >= 3 for r in records if r.view in ("asset_activity", "user_activity"))  # three dates
    settings = SourceSettings("", target.data_dir)
    assert {r.view: r.version for r in records} == {
        v.name: view_version(v, compile_view(v, settings)) for v in example_repo.views}


def test_every_backfill_checks_and_profiles_what_it_wrote(example_repo, backfilled):
    """The compiled path runs the expectations of the example repo over each view's rows of the range (not the
    rows before it, each entity's last change there) and records them with the rows' profiles; the fixed history
    passes them all."""
    target, summary = backfilled.target, backfilled.summary
    quality_log = QualityLog(target.registry_url)
    try:
        for result in summary.views:
            view = example_repo.view(result.view)
            record = result.quality
            stamps = read_offline(target.data_dir, view).column(EVENT_TIMESTAMP).cast(pa.int64())
            in_range = pc.sum(pc.and_(pc.greater_equal(stamps, T0_MS), pc.less(stamps, T1_MS))).as_py() or 0
            assert record.rows == in_range and record.passed
            assert [c.expectation for c in record.checks] == [e.label for e in view.expectations]
            assert set(record.profiles) <= set(view.feature_names) and record.profiles
            assert quality_log.holding("assets", view.name, utc(T0_MS), utc(T1_MS)) == [
                dataclasses.replace(record, id=quality_log.records("assets", view.name)[-1].id)]
    finally:
        quality_log.close()
    checks = {c.expectation: c for r in summary.views for c in r.quality.checks}
    table = read_offline(target.data_dir, example_repo.view("asset_activity"))
    stamps = table.column(EVENT_TIMESTAMP).cast(pa.int64())
    table = table.filter(pc.and_(pc.greater_equal(stamps, T0_MS), pc.less(stamps, T1_MS)))
    views = [v for v in table.column("views_24h").to_pylist() if v is not None]
    assert checks["InRange(views_24h, min=0)"].observed == (f"0 of {len(views):,} values outside [0, inf]; "
                                                           f"observed min {min(views)}, max {max(views)}")
    assert checks["NotNullRate(category, at_least=0.99)"].value == 1.0


def test_rerunning_a_range_replaces_it_and_keeps_the_rest(example_repo, backfilled, backfill_env, tmp_path):
    """Re-run [T0 + 3 h, T0 + 5 h), which crosses midnight, after two hours of events were deleted: rows in the
    range, and each entity's row at its last change before the range, follow the new history; the other rows
    outside it are untouched; nothing is duplicated."""
    target, events = backfilled.target, backfilled.events
    view = example_repo.view("asset_activity")
    shutil.copytree(target.data_dir, tmp_path / "data")
    target = BackfillTarget(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}", "assets")
    gap = (T0_MS + 2 * HOUR_MS, T0_MS + 4 * HOUR_MS)
    kept = [e for e in events["asset_interactions"] if not gap[0] <= e["event_time"] < gap[1]]
    folder = source_path(view.source, target.data_dir)
    shutil.rmtree(folder)
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(kept), folder / "part-0.parquet")
    before = read_offline(target.data_dir, view)
    start, end = T0_MS + 3 * HOUR_MS, T0_MS + 5 * HOUR_MS
    for _ in range(2):
        backfill([view], utc(start), utc(end), target, env=backfill_env)
    after = read_offline(target.data_dir, view)

    keys = list(view.entity.join_keys)
    last_before = {(*key, b) for key, rows in oracle.by_entity(view, kept).items()
                   for b in oracle.change_boundaries(view, rows, start, end) if b < start}
    assert last_before

    def split(table: pa.Table) -> tuple[list[dict], list[dict]]:
        """The rows the re-run writes (in the range, or an entity's last change before it), and the others."""
        written, others = [], []
        for row in table.to_pylist():
            ms = int(row[EVENT_TIMESTAMP].timestamp() * 1000)
            at = (*(row[k] for k in keys), ms)
            (written if start <= ms < end or at in last_before else others).append(row)
        return written, others

    (written, others), (old_written, old_others) = split(after), split(before)
    assert sorted(others, key=str) == sorted(old_others, key=str)
    assert_rows_match_oracle(view, pa.Table.from_pylist(written, schema=after.schema), kept, start, end)
    assert len(written) != len(old_written)
    backfill_log = BackfillLog(target.registry_url)
    assert [(r.start, r.end) for r in backfill_log.records("assets", view.name)] == [(utc(start), utc(end))]
    backfill_log.close()


def vector_events(n: int = 300) -> list[dict]:
    """Events of a vector source over 10 hours from T0: float32 values, ties in time."""
    rng = random.Random(3)
    events = []
    for i in range(n):
        ms = T0_MS + rng.randrange(0, 10 * HOUR_MS, 60_000 * 7)  # on a 7-minute grid: equal times recur
        vector = [float(pa.scalar(rng.uniform(-1, 1), pa.float32()).as_py()) for _ in range(4)]
        events.append({"shape_id": f"s{rng.randrange(5)}", "embedding": vector, "faces": rng.randrange(100),
                       "updated_at": ms})
    return events


def test_a_view_of_vectors_backfills_like_any_attribute(backfill_env, tmp_path):
    """A Vector feature's rows are the change boundaries with the latest vector as of each (ties: the greater, as
    Python orders lists), gone past the ttl: the same semantics as any `last`."""
    from dsl import Attribute, Entity, EventSource, FeatureView, Int64, String, Timestamp, Vector

    shape = Entity("shape", join_keys={"shape_id": String})
    source = EventSource("shapes", schema={"shape_id": String, "embedding": Vector(4), "faces": Int64,
                                           "updated_at": Timestamp}, timestamp_field="updated_at", path="shapes")
    view = FeatureView("shape_embedding", entity=shape, source=source, tile="1h", ttl="3h",
                       features=[Attribute("embedding"), Attribute("faces")])
    events = vector_events()
    (tmp_path / "data" / "shapes").mkdir(parents=True)
    schema = pa.schema([("shape_id", pa.string()), ("embedding", Vector(4).arrow_type()), ("faces", pa.int64()),
                        ("updated_at", pa.int64())])
    pq.write_table(pa.Table.from_pylist(events, schema), tmp_path / "data" / "shapes" / "part-0.parquet")
    target = BackfillTarget(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}", "vectors")
    start, end = T0_MS + 2 * HOUR_MS, T0_MS + 16 * HOUR_MS
    summary = backfill([view], utc(start), utc(end), target, env=backfill_env)
    table = read_offline(target.data_dir, view)
    assert table.num_rows == summary.rows_written > 0
    assert table.schema.field("embedding").type == pa.list_(pa.float32())  # stored so, see batch.offline_table
    assert_rows_match_oracle(view, table, events, start, end, sample=table.num_rows)
    assert None in table.column("embedding").to_pylist()  # emptied past the ttl
    assert summary.views[0].quality.null_rates["embedding"] > 0


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("local_services").postgres_url()


@pytest.fixture
def project_log(registry_url):
    """A backfill log and a project of the test's own, its records deleted afterwards."""
    project = f"log_{uuid.uuid4().hex[:8]}"
    backfill_log = BackfillLog(registry_url)
    try:
        yield backfill_log, project
    finally:
        with backfill_log.engine.begin() as conn:
            conn.execute(backfills.delete().where(backfills.c.project == project))
        backfill_log.close()


def test_backfill_log_replaces_contained_ranges_and_reports_gaps(project_log):
    backfill_log, project = project_log
    day = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def entry(start_h: int, end_h: int, rows: int) -> BackfillRecord:
        return BackfillRecord(project, "v", day + dt.timedelta(hours=start_h), day + dt.timedelta(hours=end_h),
                              rows, 1, day + dt.timedelta(days=9))

    for record in (entry(0, 10, 1), entry(0, 10, 2), entry(20, 30, 3), entry(2, 4, 4), entry(24, 26, 5)):
        backfill_log.record(record)
    assert [r.rows for r in backfill_log.records(project, "v")] == [2, 4, 3, 5]
    backfill_log.record(entry(20, 30, 6))
    assert [r.rows for r in backfill_log.records(project)] == [2, 4, 6]
    assert backfill_log.gaps(project, "v", day - dt.timedelta(hours=1), day + dt.timedelta(hours=40)) == [
        (day - dt.timedelta(hours=1), day), (day + dt.timedelta(hours=10), day + dt.timedelta(hours=20)),
        (day + dt.timedelta(hours=30), day + dt.timedelta(hours=40))]
    assert backfill_log.gaps(project, "v", day + dt.timedelta(hours=1), day + dt.timedelta(hours=9)) == []


def test_backfill_log_says_which_version_holds_each_part(project_log):
    """Where records overlap, the newer one's rows are in the table: its version holds that part."""
    backfill_log, project = project_log
    day = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def at(hours: int) -> dt.datetime:
        return day + dt.timedelta(hours=hours)

    for start_h, end_h, version in ((0, 10, "a"), (4, 6, "b"), (8, 12, "c"), (12, 14, "c"), (20, 22, None)):
        backfill_log.record(BackfillRecord(project, "v", at(start_h), at(end_h), 1, 1, day, version))
    assert [(s.start, s.end, s.version) for s in backfill_log.versions(project, "v")] == [
        (at(0), at(4), "a"), (at(4), at(6), "b"), (at(6), at(8), "a"), (at(8), at(14), "c"), (at(20), at(22), None)]
    assert backfill_log.versions(project, "w") == []


def test_a_backfill_log_made_before_versions_gets_the_column(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'registry.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text('CREATE TABLE featurectl_backfills (id INTEGER PRIMARY KEY, project VARCHAR(255), '
                             'view VARCHAR(255), start DATETIME, "end" DATETIME, rows BIGINT, files INTEGER, '
                             'finished_at DATETIME)'))
        conn.execute(sa.text("INSERT INTO featurectl_backfills VALUES (1, 'p', 'v', '2026-01-01 00:00:00', "
                             "'2026-01-02 00:00:00', 5, 1, '2026-01-03 00:00:00')"))
    engine.dispose()
    backfill_log = BackfillLog(url)
    try:
        day = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        backfill_log.record(BackfillRecord("p", "v", day + dt.timedelta(days=1), day + dt.timedelta(days=2), 1, 1,
                                           day, "abc"))
        assert [(r.rows, r.version) for r in backfill_log.records("p", "v")] == [(5, None), (1, "abc")]
    finally:
        backfill_log.close()


def test_cli_backfill_shows_progress_and_a_summary(example_repo, backfilled, tmp_path):
    target = backfilled.target
    project = example_repo_copy(tmp_path / "repo", tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}")
    shutil.copytree(target.data_dir / "asset_catalog", tmp_path / "data" / "asset_catalog")

    done = featurectl("--repo", str(project), "backfill", "--start", "2026-01-01T20:00", "--end", "2026-01-03T06:00",
                      "--view", "asset_attributes", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "windows: asset_attributes" in done.stderr  # the progress bar
    assert "40 rows read, 40 rows written" in done.stdout
    view = example_repo.view("asset_attributes")
    assert read_offline(tmp_path / "data", view).equals(read_offline(target.data_dir, view))

    bad = featurectl("--repo", str(project), "backfill", "--start", "yesterday", "--end", "2026-01-02")
    assert bad.returncode == 2 and "`yesterday` is not a date or time" in bad.stderr


def test_backfill_errors_say_what_to_do(example_repo, tmp_path):
    target = BackfillTarget(tmp_path / "empty", f"sqlite:///{tmp_path / 'registry.db'}", "assets")
    day = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(InputSchemaError, match="source `asset_catalog` has no history at .*featurectl datagen history"):
        backfill(example_repo.views, day, day + dt.timedelta(days=1), target)
    with pytest.raises(InstantError, match="empty range: start 2026-01-01T00:00:00[+]00:00 is the same instant as end"):
        backfill(example_repo.views, day, day, target)
    with pytest.raises(BackfillError, match="no time zone"):
        backfill(example_repo.views, day.replace(tzinfo=None), day + dt.timedelta(days=1), target)
    with pytest.raises(BackfillError, match="nothing to backfill: `asset_geometry` read asset sources without "
                                            "derived assets; run `featurectl assets process` first"):
        backfill([example_repo.view("asset_geometry")], day, day + dt.timedelta(days=1), target)
