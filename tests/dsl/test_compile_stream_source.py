"""The streaming relation of a source: on-time events and dead letters decided as the README's guarantee says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsl import load_repo
from dsl.compile_stream_source import (KafkaRead, dead_letter_query, lateness_ms, parse_spec, source_keys,
                                       source_relation)

ROOT = Path(__file__).resolve().parents[2]
STARTUP = {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "1"}


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "feature_repo")


def test_source_is_read_once_as_bytes_with_its_partition_and_offset(repo):
    source = repo.view("asset_activity").source
    kafka, _, _ = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl
    assert kafka.startswith("CREATE TEMPORARY TABLE `asset_interactions__kafka` (")
    assert "`__payload` BYTES" in kafka and "'format' = 'raw'" in kafka
    assert "`__partition` INT METADATA FROM 'partition' VIRTUAL" in kafka and "PROCTIME()" in kafka
    assert "'scan.startup.mode' = 'timestamp'" in kafka and "'properties.group.id' = 'g'" in kafka


def test_payloads_are_parsed_strictly_against_the_schema(repo):
    source = repo.view("asset_activity").source
    spec = json.loads(parse_spec(source, ("asset_id",)))
    assert spec == {"columns": [["asset_id", "STRING"], ["user_id", "STRING"], ["event_type", "STRING"],
                                ["dwell_ms", "BIGINT"], ["event_time", "BIGINT"]],
                    "required": ["asset_id", "event_time"]}
    checked = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl[1]
    assert "LATERAL TABLE(PARSE_EVENT(k.`__payload`, '" + parse_spec(source, ("asset_id",)) + "'))" in checked
    assert "TRY_CAST" not in checked and "CAST(" not in checked.replace("CAST(TIMESTAMPDIFF", "")


def test_watermark_is_the_running_max_per_partition_and_lateness_is_delay_plus_allowed(repo):
    source = repo.view("asset_activity").source
    _, checked, on_time = source_relation(source, KafkaRead("b:1", "g", STARTUP), ("asset_id",)).ddl
    assert lateness_ms(source) == 35_000
    assert ("MAX(CASE WHEN `__error` IS NULL THEN `event_time` END) OVER (\n  PARTITION BY `__partition` "
            "ORDER BY `__proctime`\n  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)") in checked
    assert on_time.endswith("WHERE `__error` IS NULL AND `event_time` >= `__max_seen` - 35000")
    assert "TO_TIMESTAMP_LTZ(`event_time`, 3) AS `__rowtime`" in on_time


def test_dead_letters_are_the_complement_with_the_original_payload(repo):
    query = dead_letter_query(repo.view("asset_activity").source)
    assert query.endswith("WHERE `__error` IS NOT NULL OR (NOT (`event_time` >= `__max_seen` - 35000))")
    assert "COALESCE(`__error`, 'late')" in query
    assert "PAYLOAD_TEXT(`__payload`, 16384), PAYLOAD_ENCODING(`__payload`, 16384)" in query
    assert "JSON_OBJECT" not in query and "UNION" not in query


def test_required_fields_are_the_keys_of_every_view_reading_the_source(repo):
    source = repo.view("asset_activity").source
    keys = source_keys(source, repo.views)
    assert keys == ("asset_id", "user_id")  # user_activity reads it too
    assert json.loads(parse_spec(source, keys))["required"] == ["asset_id", "user_id", "event_time"]
