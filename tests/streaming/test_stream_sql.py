"""The streaming job's SQL: the source relations and tile queries are the compiler's, the job adds its sinks, its
consumer group and start position, and its fingerprint follows its SQL."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import threading
from pathlib import Path

import pytest

from dsl import load_repo
from dsl.compile_flink import SourceSettings, compile_view
from dsl.compile_stream_source import source_keys
from streaming.bootstrap import Generation
from streaming.job_sql import StreamDefinitionError, plan_job, tile_topics_of
from streaming.runner import StreamError, Target, job_lock, start_ms
from streaming.status import is_running

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = SourceSettings("127.0.0.1:19092", Path("/data"))
STARTUP = {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "1"}


@pytest.fixture(scope="module")
def repo():
    return load_repo(ROOT / "feature_repo")


def test_the_job_runs_the_compilers_source_relation_with_its_own_group_and_start(repo):
    plan = plan_job("p", [repo.view("asset_activity"), repo.view("user_activity")], repo.views, SETTINGS, STARTUP)
    placed = dataclasses.replace(SETTINGS, consumer_group=plan.group_id, startup=STARTUP)
    view = repo.view("asset_activity")
    compiled = compile_view(view, placed, source_keys(view.source, repo.views))
    assert len(plan.sources) == 1 and plan.sources[0].relation == compiled.streaming_source
    assert all(d in plan.ddl() for d in compiled.streaming_source.ddl)
    assert f"INSERT INTO `asset_interactions__dead_letters`\n{compiled.streaming_source.dead_letter_query}" \
        in plan.inserts()
    assert '"required": ["asset_id", "user_id", "event_time"]' in plan.sources[0].relation.ddl[1]
    assert plan.consumer_groups == [plan.group_id] and plan.cutovers == {}


def test_tile_queries_are_the_compilers_with_their_bookkeeping_columns(repo):
    view = repo.view("asset_activity")
    plan = plan_job("p", [view], repo.views, SETTINGS, STARTUP)
    names = [c.name for c in plan.views[0].compiled.tile_columns]
    assert names == [c.name for c in compile_view(view, SETTINGS).tile_columns]
    assert names[-2:] == ["__events__count", "__clock__max"]
    tile_query = compile_view(view, SETTINGS).tile_query
    assert plan.views[0].compiled.tile_query == tile_query
    inserts = plan.inserts()
    # only the tiles' state expires: 1 minute tile + 35 s lateness + 60 s margin after its last update
    assert inserts[0] == ("INSERT INTO `asset_activity__tiles`\nSELECT /*+ STATE_TTL('asset_interactions' = "
                          "'155000 ms') */\n" + tile_query.removeprefix("SELECT\n"))
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
    later = plan_job("p", views, repo.views, SETTINGS, STARTUP, generation=1)
    assert later.fingerprint != first.fingerprint and later.group_id != first.group_id
    cut = plan_job("p", views, repo.views, dataclasses.replace(SETTINGS, cutovers={"asset_interactions": 5}), STARTUP)
    assert cut.fingerprint != first.fingerprint and cut.cutovers == {"asset_interactions": 5}


def test_the_tile_topics_of_a_project_of_every_generation_are_found_by_name(repo):
    views = [repo.view("asset_activity"), repo.view("user_activity")]
    generations = [plan_job("p", views, repo.views, SETTINGS, STARTUP, generation=g) for g in (0, 1)]
    ours = [v.tiles_topic for plan in generations for v in plan.views]
    others = [plan_job("p2", views, repo.views, SETTINGS, STARTUP).views[0].tiles_topic, "events",
              "events.dead-letters", "featurectl.p.asset_activity.tiles-", "featurectl.p.a.b.tiles-12ab"]
    assert tile_topics_of("p", [*others, *ours]) == sorted(ours) and len(set(ours)) == 4


def test_a_view_without_a_topic_cannot_stream(repo):
    view = repo.view("asset_activity")
    quiet = dataclasses.replace(view, source=dataclasses.replace(view.source, kafka_topic=None))
    with pytest.raises(StreamDefinitionError, match="feature view `asset_activity`: source `asset_interactions` "
                                                    "has no kafka_topic"):
        plan_job("p", [quiet], repo.views, SETTINGS, STARTUP)


def test_a_view_over_a_source_with_vectors_cannot_stream(repo):
    from dsl import Vector

    view = repo.view("asset_attributes")
    schema = {**view.source.schema, "embedding": Vector(8)}
    shaped = dataclasses.replace(view, source=dataclasses.replace(view.source, schema=schema))
    with pytest.raises(StreamDefinitionError, match="feature view `asset_attributes`: source `asset_catalog` has "
                                                    "vector column `embedding` \\(vector\\(8\\)\\), and streams do "
                                                    "not read vectors; backfill and materialize"):
        plan_job("p", [shaped], repo.views, SETTINGS, STARTUP)


def test_a_new_generation_reads_back_one_longest_window_or_from_its_cutover(repo):
    """From the hour an event time may lead its record's timestamp before the earliest event that counts: one
    lookback (window, tile, lateness) before the start, or with history the cutover, whichever is later."""
    target = Target("p", None, SETTINGS, Path("/state"))
    now, day_and_more, hour = 10**13, (24 * 60 + 1) * 60_000 + 35_000, 3_600_000
    views = [repo.view("asset_activity")]
    assert start_ms(target, views, Generation(now, {})) == now - day_and_more - hour
    cutover = now - 600_000
    assert start_ms(target, views, Generation(now, {"asset_interactions": cutover})) == cutover - hour
    assert start_ms(target, views, Generation(now, {"asset_interactions": now - 3 * 86_400_000})) == \
        now - day_and_more - hour


def test_one_runner_per_job(tmp_path):
    with job_lock(tmp_path / "job"):
        with pytest.raises(StreamError, match="is already running"):
            with job_lock(tmp_path / "job"):
                pass
    with job_lock(tmp_path / "job"):  # released when the first one ended
        pass


def test_a_reader_asking_whether_the_job_runs_does_not_stop_it_starting(tmp_path):
    """`is_running` (the feature servers ask every second) holds a shared lock for an instant: a start then
    asks again instead of calling the job running."""
    home = tmp_path / "job"
    home.mkdir()
    fd = os.open(home / "lock", os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.01, os.close, [fd]).start()
    with job_lock(home):
        assert is_running(home)
    assert not is_running(home)
