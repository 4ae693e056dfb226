"""Redis Cluster: a 3-node cluster of the test's own (`redis-server --cluster-enabled yes` on free ports, joined
with `redis-cli --cluster create`, stopped by pid); Feast writes through its cluster client, we read with the
sync and async SDK, including after a stale slot map (MOVED)."""

from __future__ import annotations

import asyncio
import os

import pytest
from redis.crc import key_slot
from featurectl.services.scratch_redis import redis_cluster
from serving_env import feast_rows, make_repo

from redis_store.cluster import SlotMap
from serving.client import AsyncOnlineClient, OnlineClient

pytestmark = pytest.mark.integration

ASSETS = [f"asset_{i}" for i in range(60)]
FEATURES = ["asset_activity:views_1h", "asset_activity:last_user_24h", "asset_attributes:bbox_x"]


@pytest.fixture(scope="module")
def cluster_repo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    with redis_cluster(folder) as servers:
        nodes = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        repo, store = make_repo(folder, f"servingcluster{os.getpid()}", nodes, redis_type="redis_cluster")
        feast_rows(store, "asset_activity",
                   {a: {"views_1h": i, "last_user_24h": f"u{i}"} for i, a in enumerate(ASSETS)})
        feast_rows(store, "asset_attributes", {a: {"bbox_x": i / 4} for i, a in enumerate(ASSETS[::2])})
        yield repo, store


def _expected(store, rows):
    return store.get_online_features(FEATURES, [{"asset_id": r} for r in rows]).to_dict()


def test_sync_client_reads_across_all_nodes_like_feast(cluster_repo):
    repo, store = cluster_repo
    rows = [*ASSETS, "missing"]
    with OnlineClient.from_repo(repo) as client:
        assert len(client.redis.slots.masters) == 3
        assert len({client.redis.slots.owner[key_slot(k)]
                    for k in client.prepare(FEATURES, {"asset_id": rows}, False).keys}) == 3
        assert client.get_features(FEATURES, {"asset_id": rows}) == _expected(store, rows)


def test_a_stale_slot_map_is_reloaded_on_moved(cluster_repo):
    repo, store = cluster_repo
    with OnlineClient.from_repo(repo) as client:
        first = sorted(client.redis.slots.masters)[0]
        client.redis.slots = SlotMap([[0, 16383, [first[0].encode(), first[1]]]])  # everything on one node
        assert client.get_features(FEATURES, {"asset_id": ASSETS}) == _expected(store, ASSETS)
        assert len(client.redis.slots.masters) == 3


def test_async_client_reads_the_cluster(cluster_repo):
    repo, store = cluster_repo

    async def read():
        async with AsyncOnlineClient.from_repo(repo) as client:
            await client.ping()
            return await client.get_features(FEATURES, {"asset_id": ASSETS[:25]})

    assert asyncio.run(read()) == _expected(store, ASSETS[:25])
