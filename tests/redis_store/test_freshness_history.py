"""The freshness record's history against the real Redis: a sample of the whole record each time a view's time
moves (at most one per `GAP_MS`, Redis's clock), none when nothing moved; one slot with the record; forgotten with
the project's record."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from redis.crc import key_slot

from redis_store import freshness, freshness_history
from redis_store.settings import RedisSettings

pytestmark = pytest.mark.integration

T = 1_767_225_600_000  # 2026-01-01T00:00Z


@pytest.fixture()
def record(local_services):
    host, port = local_services.redis_host_port
    project = f"hist_{uuid.uuid4().hex[:8]}"
    settings = RedisSettings.parse(f"{host}:{port}")
    yield settings, project, redis.Redis(host, port)
    freshness.forget_newest(settings, project)


def test_the_history_shares_the_records_slot():
    for project in ("p", "freshness_1234abcd", "demo"):
        assert key_slot(freshness_history.history_key(project)) == key_slot(freshness.record_key(project))


def test_a_raised_record_is_sampled_whole_at_most_once_per_gap(record):
    settings, project, client = record
    assert freshness_history.read_history(settings, project) == []
    before = int(time.time() * 1000)
    freshness.record_newest(settings, project, {"a": T, "b": T - 5})
    freshness.record_newest(settings, project, {"a": T + 1})  # within the gap: left out
    freshness.record_newest(settings, project, {"a": T - 60_000})  # moves nothing
    [first] = freshness_history.read_history(settings, project)
    assert first.newest_ms == {"a": T, "b": T - 5}
    assert before - 1_000 <= first.at_ms <= int(time.time() * 1000) + 1_000
    time.sleep(freshness_history.GAP_MS / 1000)
    freshness.record_newest(settings, project, {"b": T - 5})  # moves nothing: no sample, however late
    assert len(freshness_history.read_history(settings, project)) == 1
    freshness.record_newest(settings, project, {"b": T})
    samples = freshness_history.read_history(settings, project)
    assert [s.newest_ms for s in samples] == [{"a": T, "b": T - 5}, {"a": T + 1, "b": T}]
    assert samples[1].at_ms - samples[0].at_ms >= freshness_history.GAP_MS
    freshness.forget_newest(settings, project)
    assert not client.exists(freshness_history.history_key(project))
