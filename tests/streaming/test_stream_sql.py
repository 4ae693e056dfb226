"""The streaming job's SQL: the source relation decides on-time and dead letters as the guarantee says, the tile
queries are the compiler's, and the job's fingerprint follows its SQL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dsl import load_repo
from dsl.compile_flink import SourceSettings, compile_view
from streaming.job_sql import CLOCK_COLUMN, EVENTS_COLUMN, StreamDefinitionError, plan_job, with_bookkeeping
from streaming.runner import StreamError, job_lock, lookback_ms
from streaming.source_sql import KafkaRead, dead_letter_query, lateness_ms, source_relation

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = SourceSettings("127.0.0.1:19092", Path("/data"))
STARTUP = {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "1"}


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "feature_repo")


def test_source_is_read_as_text_with_its_partition_and_offset(repo):
    source = repo.view("asset_activity").source
    kafka, raw, checked, on_time = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl
    assert kafka.startswith("CREATE TEMPORARY TABLE `asset_interactions__kafka` (")
    assert "`dwell_ms` STRING" in kafka and "`event_time` STRING" in kafka and "'format' = 'json'" in kafka
    assert "`__partition` INT METADATA FROM 'partition' VIRTUAL" in kafka and "PROCTIME()" in kafka
    assert "'scan.startup.mode' = 'timestamp'" in kafka and "'properties.group.id' = 'g'" in kafka
    assert "'format' = 'raw'" in raw and "'properties.group.id' = 'g-raw'" in raw


def test_watermark_is_the_running_max_per_partition_and_lateness_is_delay_plus_allowed(repo):
    source = repo.view("asset_activity").source
    _, _, checked, on_time = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl
    assert lateness_ms(source) == 35_000
    assert ("MAX(CASE WHEN `__error` IS NULL THEN `event_time` END) OVER (\n  PARTITION BY `__partition` "
            "ORDER BY `__proctime`\n  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)") in checked
    assert "TRY_CAST(`dwell_ms` AS BIGINT) AS `dwell_ms`" in checked
    assert on_time.endswith("WHERE `__error` IS NULL AND `event_time` >= `__max_seen` - 35000")
    assert "TO_TIMESTAMP_LTZ(`event_time`, 3) AS `__rowtime`" in on_time


def test_dead_letters_are_the_complement_plus_unreadable_payloads(repo):
    query = dead_letter_query(repo.view("asset_activity").source)
    checked, raw = query.split("\nUNION ALL\n")
    assert checked.endswith("WHERE `__error` IS NOT NULL OR NOT (`event_time` >= `__max_seen` - 35000)")
    assert "COALESCE(`__error`, 'late')" in checked and "COALESCE(`__payload`, JSON_OBJECT(" in checked
    assert "'malformed_json'" in raw and "IS JSON OBJECT" in raw


def test_required_fields_are_the_keys_of_every_view_reading_the_source(repo):
    plan = plan_job("p", [repo.view("asset_activity")], repo.views, SETTINGS, STARTUP)
    checked = plan.sources[0].relation.ddl[2]
    assert "WHEN `asset_id` IS NULL THEN 'missing_field:asset_id'" in checked
    assert "WHEN `user_id` IS NULL THEN 'missing_field:user_id'" in checked  # user_activity reads it too
    assert "THEN 'wrong_type:dwell_ms'" in checked and "THEN 'wrong_type:event_time'" in checked


def test_tile_queries_are_the_compilers_with_two_bookkeeping_columns(repo):
    view = repo.view("asset_activity")
    plan = plan_job("p", [view], repo.views, SETTINGS, STARTUP)
    names = [c.name for c in plan.views[0].compiled.tile_columns]
    assert names == [c.name for c in compile_view(view, SETTINGS).tile_columns] + [EVENTS_COLUMN, CLOCK_COLUMN]
    assert plan.views[0].compiled.tile_query == compile_view(with_bookkeeping(view), SETTINGS).tile_query
    inserts = plan.inserts()
    assert inserts[0].startswith("INSERT INTO `asset_activity__tiles`\nSELECT")
    assert inserts[1].startswith("INSERT INTO `asset_interactions__dead_letters`\nSELECT")
    assert any("'connector' = 'upsert-kafka'" in d and "PRIMARY KEY (`asset_id`, `tile_start`)" in d
               for d in plan.ddl())
    assert any("'sink.delivery-guarantee' = 'exactly-once'" in d for d in plan.ddl())


def test_fingerprint_follows_the_sql_not_the_start_position(repo):
    views = [repo.view("asset_activity"), repo.view("user_activity")]
    first = plan_job("p", views, repo.views, SETTINGS, STARTUP)
    again = plan_job("p", views, repo.views, SETTINGS, {**STARTUP, "scan.startup.timestamp-millis": "99"})
    assert first.fingerprint == again.fingerprint and len(first.sources) == 1
    assert first.views[0].tiles_topic == f"featurectl.p.asset_activity.tiles-{first.fingerprint}"
    changed = dataclasses.replace(views[0], tile="5m")
    assert plan_job("p", [changed, views[1]], repo.views, SETTINGS, STARTUP).fingerprint != first.fingerprint


def test_a_view_without_a_topic_cannot_stream(repo):
    view = repo.view("asset_activity")
    quiet = dataclasses.replace(view, source=dataclasses.replace(view.source, kafka_topic=None))
    with pytest.raises(StreamDefinitionError, match="feature view `asset_activity`: source `asset_interactions` "
                                                    "has no kafka_topic"):
        plan_job("p", [quiet], repo.views, SETTINGS, STARTUP)


def test_a_job_without_a_checkpoint_reads_back_one_longest_window(repo):
    day_and_more = (24 * 60 + 1) * 60_000 + 35_000
    assert lookback_ms([repo.view("asset_activity")]) == day_and_more


def test_one_runner_per_job(tmp_path):
    with job_lock(tmp_path / "job"):
        with pytest.raises(StreamError, match="is already running"):
            with job_lock(tmp_path / "job"):
                pass
    with job_lock(tmp_path / "job"):  # released when the first one ended
        pass
