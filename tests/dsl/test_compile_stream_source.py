"""The streaming relation of a source: on-time events and dead letters decided as the README's guarantee says."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsl import load_repo
from dsl.compile_stream_source import KafkaRead, dead_letter_query, lateness_ms, source_keys, source_relation

ROOT = Path(__file__).resolve().parents[2]
STARTUP = {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "1"}


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "feature_repo")


def test_source_is_read_as_text_with_its_partition_and_offset(repo):
    source = repo.view("asset_activity").source
    kafka, raw, _, _ = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl
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
    source = repo.view("asset_activity").source
    keys = source_keys(source, repo.views)
    assert keys == ("asset_id", "user_id")  # user_activity reads it too
    checked = source_relation(source, KafkaRead("b:1", "g", STARTUP), keys).ddl[2]
    assert "WHEN `asset_id` IS NULL THEN 'missing_field:asset_id'" in checked
    assert "WHEN `user_id` IS NULL THEN 'missing_field:user_id'" in checked
    assert "THEN 'wrong_type:dwell_ms'" in checked and "THEN 'wrong_type:event_time'" in checked
