"""Materialization into a Redis Cluster of the test's own (3 masters on free ports): the same hashes, byte for
byte and with the same ttl, as materializing into one node; read back alike by our SDK and by Feast's own
cluster reader; older rows never overwrite newer ones; the freshness record and its history land in one slot."""

from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import redis

from batch.materialize import materialize_view
from cli_helpers import copy_example_repo, featurectl, register_repo
from common.config import load_config
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.types import ValueType
from featurectl.services.scratch_redis import RedisServer, redis_cluster
from redis_store.freshness import read_newest
from redis_store.freshness_history import read_history
from redis_store.settings import RedisSettings
from serving.client import OnlineClient

pytestmark = pytest.mark.integration

VIEW = "asset_activity"
NOW = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
TTL_S = 3600
# (start, end) hours before NOW, in order: a first load, a later interval over the same entities (newer rows
# rewrite existing keys the checked way), then an older one (rows older than Redis's are skipped)
RUNS = [(20, 8), (20, 2), (23, 21)]


def _offline_table(view, entities: int, seed: int = 5) -> pa.Table:
    """Three rows per entity at random hours of the last day; a tenth of the values NULL (integers excepted)."""
    rng = np.random.default_rng(seed)
    n = entities * 3
    stamps = [NOW - dt.timedelta(hours=int(h), minutes=int(m)) for h, m in zip(rng.integers(1, 24, n),
                                                                                rng.integers(0, 60, n))]
    table = {"asset_id": pa.array([f"c{i % entities}" for i in range(n)]),
             EVENT_TIMESTAMP: pa.array(stamps, pa.timestamp("ms", "UTC"))}
    for name, kind in view.output_schema().items():
        if kind is ValueType.INT64:
            table[name] = pa.array(rng.integers(-50, 50_000, n))
        elif kind is ValueType.FLOAT64:
            table[name] = pa.array(rng.normal(0, 1e6, n), mask=rng.random(n) < 0.1)
        else:
            table[name] = pa.array([f"v{x}" * int(x % 7) for x in rng.integers(0, 500, n)], mask=rng.random(n) < 0.1)
    return pa.table(table)


def _hashes(clients: list[redis.Redis], project: str) -> dict[bytes, tuple[dict, int]]:
    """Every key of the project on these nodes: its fields and its ttl (rounded down to the minute)."""
    out = {}
    for client in clients:
        for key in client.scan_iter(match=b"*" + project.encode(), count=1_000):
            out[key] = (client.hgetall(key), client.ttl(key) // 60)
    return out


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The same offline table materialized, run by run, into one node (in-process) and into a cluster (with
    `featurectl materialize`); yields both repos, the project, the Redis clients of each and the view."""
    folder = tmp_path_factory.mktemp("mat_cluster")
    project = f"matcluster{os.getpid()}"
    view = load_repo(copy_example_repo(folder / "defs", project, {"path": "x.db"})).view(VIEW)
    table = _offline_table(view, entities=3_000)
    ds.write_dataset(table, offline_table_path(folder / "data", view), format="parquet")
    single = RedisServer(folder)
    try:
        with redis_cluster(folder) as servers:
            nodes = ",".join(f"127.0.0.1:{s.port}" for s in servers)
            repos = {}
            for name, store in (("single", {"connection_string": f"127.0.0.1:{single.port}"}),
                                ("cluster", {"connection_string": nodes, "redis_type": "redis_cluster"})):
                repos[name] = copy_example_repo(folder / name, project, {"path": f"sqlite:///{folder / name}.db"},
                                                {"type": "redis", "key_ttl_seconds": TTL_S, **store},
                                                data_dir=folder / "data")
                register_repo(repos[name])
            for since, until in RUNS:
                start, end = NOW - dt.timedelta(hours=since), NOW - dt.timedelta(hours=until)
                materialize_view(RedisSettings.parse(f"127.0.0.1:{single.port}"), view, project,
                                 offline_table_path(folder / "data", view), start, end, key_ttl_s=TTL_S)
                done = featurectl("--repo", str(repos["cluster"]), "materialize", start.isoformat(), end.isoformat(),
                                  "--view", VIEW)
                assert done.returncode == 0, done.stderr
            yield repos, project, [redis.Redis(port=single.port)], [redis.Redis(port=s.port) for s in servers], view
    finally:
        single.stop()


def test_the_cluster_holds_exactly_what_one_node_holds_ttl_included(loaded):
    _, project, single, cluster, _ = loaded
    expected = _hashes(single, project)
    assert len(expected) > 2_900, "most entities have a row in one of the runs"
    got = _hashes(cluster, project)
    assert {k: fields for k, (fields, _) in got.items()} == {k: fields for k, (fields, _) in expected.items()}
    # the two loads ran apart, so a key's minutes left may differ by one across a minute's turn
    assert all(abs(got[k][1] - expected[k][1]) <= 1 for k in got), "every key expires as on one node"
    assert {ttl for _, ttl in got.values()} <= {TTL_S // 60 - 1, TTL_S // 60 - 2}
    per_node = [sum(1 for _ in c.scan_iter(match=b"*" + project.encode(), count=1_000)) for c in cluster]
    assert min(per_node) > 500, per_node


def test_our_sdk_and_feasts_cluster_reader_read_what_one_node_returns(loaded):
    from feast import FeatureStore

    repos, _, _, _, view = loaded
    features = [f"{VIEW}:{name}" for name in view.output_schema()]
    rows = [{"asset_id": f"c{i}"} for i in range(0, 3_000, 7)] + [{"asset_id": "missing"}]
    expected = FeatureStore(repo_path=str(repos["single"])).get_online_features(features, rows).to_dict()
    assert FeatureStore(repo_path=str(repos["cluster"])).get_online_features(features, rows).to_dict() == expected
    with OnlineClient.from_repo(repos["cluster"]) as client:
        assert client.get_features(features, {"asset_id": [r["asset_id"] for r in rows]}) == expected


def test_the_freshness_record_and_its_history_are_written_on_the_cluster(loaded):
    repos, project, _, _, _ = loaded
    single, cluster = (RedisSettings.from_config(load_config(repos[name])) for name in ("single", "cluster"))
    assert cluster.cluster
    newest = read_newest(cluster, project)
    assert newest == read_newest(single, project) and set(newest) == {VIEW}
    history = read_history(cluster, project)
    first_end_ms = int((NOW - dt.timedelta(hours=RUNS[0][1])).timestamp() * 1000)
    assert history and history[0].newest_ms == read_history(single, project)[0].newest_ms, "both sampled run one"
    assert history[0].newest_ms[VIEW] <= first_end_ms < newest[VIEW], "the first sample is the first run's raise"
    # the second run raised the record again: sampled unless it came within GAP_MS of the first sample (the report
    # then places it there); the third run's older rows raised nothing
    assert [s.newest_ms for s in history[1:]] in ([], [newest])
