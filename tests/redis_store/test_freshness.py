"""The freshness record against the real Redis: it only moves forward, per view, whoever writes it; it can be
forgotten per view or whole; entity scans of the project never meet it. Its history: a sample of the whole record
each time a view's time moves (one per `GAP_MS` window, Redis's clock: a raise inside the window replaces its
sample), none when nothing moved, in the record's slot, forgotten with the project's record."""

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
    project = f"fresh_{uuid.uuid4().hex[:8]}"
    yield RedisSettings.parse(f"{host}:{port}"), project, redis.Redis(host, port)
    freshness.forget_newest(RedisSettings.parse(f"{host}:{port}"), project)


def test_the_newest_event_time_only_moves_forward_per_view(record):
    settings, project, _ = record
    assert freshness.read_newest(settings, project) == {}
    freshness.record_newest(settings, project, {"a": T, "b": T - 5})
    freshness.record_newest(settings, project, {"a": T - 60_000, "b": T})  # an older `a` changes nothing
    freshness.record_newest(settings, project, {"b": T})  # the same again (a retry) neither
    assert freshness.read_newest(settings, project) == {"a": T, "b": T}
    freshness.record_newest(settings, project, {"a": T + 1})
    assert freshness.read_newest(settings, project) == {"a": T + 1, "b": T}


def test_records_are_forgotten_per_view_or_whole(record):
    settings, project, client = record
    freshness.record_newest(settings, project, {"a": T, "b": T, "c": T})
    freshness.forget_newest(settings, project, ["a", "c"])
    assert freshness.read_newest(settings, project) == {"b": T}
    freshness.forget_newest(settings, project, [])
    assert freshness.read_newest(settings, project) == {"b": T}
    freshness.forget_newest(settings, project)
    assert not client.exists(freshness.record_key(project))


def test_a_scan_for_the_projects_entity_keys_does_not_find_the_record(record):
    settings, project, client = record
    freshness.record_newest(settings, project, {"a": T})
    assert client.exists(freshness.record_key(project))
    assert list(client.scan_iter(match=f"*{project}".encode(), count=10_000)) == []


def test_the_history_shares_the_records_slot():
    for project in ("p", "freshness_1234abcd", "demo"):
        assert key_slot(freshness_history.history_key(project)) == key_slot(freshness.record_key(project))


def test_a_raised_record_is_sampled_whole_at_most_once_per_gap(record):
    settings, project, client = record
    assert freshness_history.read_history(settings, project) == []
    before = int(time.time() * 1000)
    freshness.record_newest(settings, project, {"a": T, "b": T - 5})
    [opened] = freshness_history.read_history(settings, project)
    assert opened.newest_ms == {"a": T, "b": T - 5}
    assert before - 1_000 <= opened.at_ms <= int(time.time() * 1000) + 1_000
    freshness.record_newest(settings, project, {"a": T + 1})  # within the gap: the window's sample, replaced
    freshness.record_newest(settings, project, {"a": T - 60_000})  # moves nothing
    [first] = freshness_history.read_history(settings, project)
    assert first.newest_ms == {"a": T + 1, "b": T - 5}
    assert opened.at_ms <= first.at_ms <= int(time.time() * 1000) + 1_000
    time.sleep(freshness_history.GAP_MS / 1000)
    freshness.record_newest(settings, project, {"b": T - 5})  # moves nothing: no sample, however late
    assert len(freshness_history.read_history(settings, project)) == 1
    freshness.record_newest(settings, project, {"b": T})
    samples = freshness_history.read_history(settings, project)
    assert [s.newest_ms for s in samples] == [{"a": T + 1, "b": T - 5}, {"a": T + 1, "b": T}]
    assert samples[1].at_ms - opened.at_ms >= freshness_history.GAP_MS
    freshness.forget_newest(settings, project)
    assert not client.exists(freshness_history.history_key(project))


def test_views_raised_one_after_the_other_share_one_sample(record):
    """A materialize raises its views one call each, milliseconds apart: the window's sample holds them all."""
    settings, project, _ = record
    for i, view in enumerate(("v1", "v2", "v3")):
        freshness.record_newest(settings, project, {view: T + i})
    [sample] = freshness_history.read_history(settings, project)
    assert sample.newest_ms == {"v1": T, "v2": T + 1, "v3": T + 2}
