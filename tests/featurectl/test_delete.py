"""`featurectl delete` and `teardown` against the real Redis, Kafka and registry, on a repo of another shape than the
example's: an integer-keyed entity and a composite one (integer + string) over one source, values with glob
characters. What is left is compared with what was written minus the entity, row by row and key by key."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml

from cli_helpers import ROOT, featurectl, project_keys
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.types import ValueType
from redis_store.forget import EntityMatch, OnlineEraser
from redis_store.freshness import read_newest, record_key
from redis_store.freshness_history import history_key
from redis_store.layout import KeyEncoder
from redis_store.settings import RedisSettings

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
ITEMS = ["sw*rd", "a[1]", "?", "plain", "back\\slash", "7"]
PLAYERS = list(range(1, 13))
FEATURES = """
from dsl import (Aggregation, Entity, EventSource, FeatureLogging, FeatureService, FeatureView, Float64, Int64,
                 String, Timestamp)

player = Entity("player", join_keys={"player_id": Int64})
pair = Entity("pair", join_keys={"player_id": Int64, "item": String})
plays = EventSource("plays", {"player_id": Int64, "item": String, "score": Float64, "at": Timestamp},
                    timestamp_field="at", path="plays")
player_totals = FeatureView("player_totals", player, plays, tile="1h", ttl="30d",
                            features=[Aggregation("sum", "score", windows=["1d"], name="score")])
pair_best = FeatureView("pair_best", pair, plays, tile="1h", ttl="30d",
                        features=[Aggregation("max", "score", windows=["1d"], name="best")])
scoring = FeatureService("scoring", [pair_best], logging=FeatureLogging(sample_rate=1.0))
"""


def _repo(tmp: Path, project: str) -> Path:
    repo = tmp / project
    repo.mkdir()
    (repo / "features.py").write_text(FEATURES)
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = project
    settings["registry"]["path"] = f"sqlite:///{tmp / 'registry.db'}"
    settings["platform"] = {"data_dir": str(tmp / "data"), "state_dir": str(tmp / "state")}
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def _rows(rng: np.random.Generator, n: int) -> dict:
    hours = rng.integers(1, 20, n)
    return {"player_id": pa.array(rng.choice(PLAYERS, n), pa.int64()), "item": pa.array(rng.choice(ITEMS, n)),
            "stamp": pa.array([NOW - dt.timedelta(hours=int(h)) for h in hours], pa.timestamp("ms", "UTC"))}


def _write_partitioned(table: pa.Table, path: Path) -> None:
    dates = pa.array([t.strftime("%Y-%m-%d") for t in table.column(EVENT_TIMESTAMP).to_pylist()])
    ds.write_dataset(table.append_column("date", dates), path, format="parquet",
                     partitioning=ds.partitioning(pa.schema([("date", pa.string())]), flavor="hive"),
                     max_rows_per_file=40, max_rows_per_group=40)


def _data(tmp: Path, seed: int = 5) -> dict[str, pa.Table]:
    """Offline tables of both views and the source history, written where the repo's views read them."""
    rng = np.random.default_rng(seed)
    r = _rows(rng, 400)
    history = pa.table({"player_id": r["player_id"], "item": r["item"], "score": rng.normal(50, 10, 400),
                        "at": r["stamp"].cast(pa.int64())})  # sources hold epoch milliseconds
    (tmp / "data" / "plays").mkdir(parents=True)
    for i in range(3):
        pq.write_table(history.slice(i * 150, 150), tmp / "data" / "plays" / f"part-{i}.parquet")
    r = _rows(rng, 300)
    totals = pa.table({"player_id": r["player_id"], EVENT_TIMESTAMP: r["stamp"], "score_1d": rng.normal(0, 1, 300)})
    r = _rows(rng, 500)
    best = pa.table({"player_id": r["player_id"], "item": r["item"], EVENT_TIMESTAMP: r["stamp"],
                     "best_1d": rng.normal(0, 1, 500)})
    _write_partitioned(totals, tmp / "data" / "offline" / "player_totals")
    _write_partitioned(best, tmp / "data" / "offline" / "pair_best")
    r = _rows(rng, 200)                                   # vectors `serve` logged for the service (its columns)
    logs = pa.table({"player_id": r["player_id"], "item": r["item"], "pair_best__best_1d": rng.normal(0, 1, 200),
                     "__log_timestamp": r["stamp"], "__request_id": [f"r{i}" for i in range(200)]})
    folder = tmp / "data" / "feature_logs" / "scoring" / f"__log_date={NOW.date().isoformat()}"
    folder.mkdir(parents=True)
    for i in range(2):
        pq.write_table(logs.slice(i * 100, 100), folder / f"worker-0-{i}.parquet")
    return {"player_totals": totals, "pair_best": best, "plays": history, "logs": logs}


def _read(path: Path) -> pa.Table:
    table = ds.dataset(path, format="parquet", partitioning="hive", ignore_prefixes=[".", "_"] if
                       path.parent.name != "feature_logs" else ["."]).to_table()      # logs: `__log_date=...`
    return table.drop_columns([c for c in ("date", "__log_date") if c in table.column_names])


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: json.dumps(row, default=str, sort_keys=True))


def _without(table: pa.Table, **given) -> list[dict]:
    return _sorted(pa.Table.from_pylist([row for row in table.to_pylist()
                                         if not all(row[k] == v for k, v in given.items())], schema=table.schema))


def _online_keys(redis_client, project: str) -> set[bytes]:
    return {k for k in redis_client.scan_iter(match=b"*" + project.encode(), count=1000)}


def _cli(repo: Path, *args: str):
    done = featurectl("--repo", str(repo), *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_glob_characters_and_partial_keys_find_exactly_the_entity(local_services):
    """The SCAN glob escapes the key's bytes, and candidates are decoded: `item=7` must not match a player 7."""
    import redis

    project = f"forget{uuid.uuid4().hex[:8]}"
    host, port = local_services.redis_host_port
    client = redis.Redis(host, port)
    pair = {"player_id": ValueType.INT64, "item": ValueType.STRING}
    encoder = KeyEncoder(project, pair)
    written = {(p, i): encoder.key([i, p]) for p in [7, 42, 777] for i in ITEMS}
    client.mset({key: b"x" for key in written.values()})
    eraser = OnlineEraser(RedisSettings.from_config(local_services))
    try:
        for given in ({"player_id": 7}, {"item": "sw*rd"}, {"item": "7"}, {"item": "a[1]"}, {"item": "back\\slash"}):
            match = EntityMatch(project, pair, given)
            expected = sorted(key for (p, i), key in written.items()
                              if given.get("player_id", p) == p and given.get("item", i) == i)
            assert eraser.keys(match) == expected, given
        complete = EntityMatch(project, pair, {"player_id": 42, "item": "?"})
        assert eraser.keys(complete) == [written[(42, "?")]]
        assert eraser.delete(eraser.keys(EntityMatch(project, pair, {"player_id": 777}))) == len(ITEMS)
        assert _online_keys(client, project) == {k for (p, _), k in written.items() if p != 777}
    finally:
        eraser.close()
        for key in _online_keys(client, project):
            client.delete(key)


def test_delete_an_entity_then_teardown_the_project(tmp_path, local_services):
    import redis
    from confluent_kafka.admin import AdminClient, NewTopic

    from batch.backfill_log import BackfillLog, BackfillRecord

    project = f"del{uuid.uuid4().hex[:8]}"
    repo = _repo(tmp_path, project)
    written = _data(tmp_path)
    _cli(repo, "apply")
    _cli(repo, "materialize", (NOW - dt.timedelta(days=2)).isoformat(), NOW.isoformat())
    host, port = local_services.redis_host_port
    client = redis.Redis(host, port)
    before = _online_keys(client, project)
    player = KeyEncoder(project, {"player_id": ValueType.INT64})
    pair = KeyEncoder(project, {"player_id": ValueType.INT64, "item": ValueType.STRING})
    assert player.key([7]) in before and any(pair.decode(k) and pair.decode(k)[1] == 7 for k in before)

    dry = _cli(repo, "delete", "--entity", "player_id=7", "--dry-run")
    expected_pairs = {k for k in before if (pair.decode(k) or [None, None])[1] == 7}
    assert f"would remove {len(expected_pairs)} key(s) of entity pair" in dry
    assert _online_keys(client, project) == before

    out = _cli(repo, "delete", "--entity", "player_id=7", "--yes")
    assert "removed 1 key(s) of entity player (views: player_totals)" in out
    assert f"removed {len(expected_pairs)} key(s) of entity pair (views: pair_best)" in out
    assert _online_keys(client, project) == before - expected_pairs - {player.key([7])}
    for view in ("player_totals", "pair_best"):
        removed = written[view].num_rows - len(_without(written[view], player_id=7))
        assert f"offline table {view}: removed {removed} row(s)" in out
        assert _sorted(_read(tmp_path / "data" / "offline" / view)) == _without(written[view], player_id=7)
    removed = written["logs"].num_rows - len(_without(written["logs"], player_id=7))
    assert removed and f"feature logs scoring: removed {removed} row(s)" in out        # the served vectors too
    assert _sorted(_read(tmp_path / "data" / "feature_logs" / "scoring")) == _without(written["logs"], player_id=7)
    kept = sum(1 for row in written["plays"].to_pylist() if row["player_id"] == 7)
    assert f"history plays: {kept} event(s) of the entity remain" in out and "--history" in out
    assert _sorted(_read(tmp_path / "data" / "plays")) == _sorted(written["plays"])

    out = _cli(repo, "delete", "--entity", "player_id=8", "--entity", "item=sw*rd", "--history", "--yes")
    assert "entity player" not in out and "(views: pair_best)" in out
    assert _sorted(_read(tmp_path / "data" / "plays")) == _without(written["plays"], player_id=8, item="sw*rd")
    assert pair.key(["sw*rd", 8]) not in _online_keys(client, project)

    wrong = featurectl("--repo", str(repo), "delete", "--entity", "asset_id=a1", "--yes")
    assert wrong.returncode == 1 and "no entity of this project has join key asset_id" in wrong.stderr
    wrong = featurectl("--repo", str(repo), "delete", "--entity", "player_id=seven", "--yes")
    assert wrong.returncode == 1 and "`seven` is not a whole number" in wrong.stderr
    wrong = featurectl("--repo", str(repo), "delete", "--entity", f"player_id={2**63}", "--yes")
    assert wrong.returncode == 1 and "is out of its range" in wrong.stderr and "Traceback" not in wrong.stderr
    wrong = featurectl("--repo", str(repo), "delete", "--entity", "item=a", "--entity", "item=b", "--yes")
    assert wrong.returncode == 1 and "join key `item` is given twice" in wrong.stderr

    mine = project_keys(repo).create("mine", ["*"], 10, 10)[0]
    other = project_keys(_repo(tmp_path, project + "x")).create("other", ["*"], 10, 10)[0]
    log = BackfillLog(f"sqlite:///{tmp_path / 'registry.db'}")
    log.record(BackfillRecord(project, "player_totals", NOW - dt.timedelta(days=1), NOW, 1, 1, NOW))
    topic = f"{project}.tiles.player_totals"
    admin = AdminClient({"bootstrap.servers": local_services.platform.kafka.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    job = tmp_path / "state" / "stream" / f"{project}.player_totals"
    job.mkdir(parents=True)
    (job / "status.json").write_text(json.dumps({"project": project, "topics": {"tiles": [topic],
                                                                                "dead_letters": []}}))

    assert set(read_newest(RedisSettings.parse(f"{host}:{port}"), project)) == {"player_totals", "pair_best"}
    out = _cli(repo, "teardown", "--yes")
    assert "removed 1 API key(s), 1 backfill record(s) and 2 definition version(s)" in out
    assert f"Kafka topic(s) of its streams: {topic}" in out
    assert not (tmp_path / "data" / "offline" / "player_totals").exists() and not job.exists()
    assert (tmp_path / "data" / "plays").exists()
    assert _online_keys(client, project) == set()
    assert not client.exists(record_key(project), history_key(project)), "the newest event times go with the values"
    assert [k.key_id for k in project_keys(repo).list()] == []
    assert other.key_id in [k.key_id for k in project_keys(tmp_path / (project + "x")).list()]
    assert mine.key_id not in [k.key_id for k in project_keys(tmp_path / (project + "x")).list()]
    assert log.records(project) == []
    assert topic not in admin.list_topics(timeout=10).topics
