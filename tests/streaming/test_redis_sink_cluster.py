"""The streaming sink against a Redis Cluster of the test's own (3 masters on free ports): keys grouped per hash
slot (a script may only touch one slot), refusals mapped back to their rows, Feast's key ttl; redis-py's cluster
client (the one Feast reads with) reads what the sink wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from dsl.compile_flink import SourceSettings, compile_view
from dsl.types import ValueType
from featurectl.services.scratch_redis import redis_cluster
from redis_store import layout
from redis_store.cluster import SlotMap
from redis_store.settings import RedisSettings
from sink_view import VIEW, T
from streaming.redis_sink import RedisSink
from streaming.windows import ViewLayout

pytestmark = pytest.mark.integration

PROJECT = "sinkcluster"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with redis_cluster(tmp_path_factory.mktemp("sink_cluster")) as servers:
        yield (RedisSettings.parse(",".join(f"127.0.0.1:{s.port}" for s in servers), "redis_cluster"),
               redis.RedisCluster(host="127.0.0.1", port=servers[0].port), servers)


def _rows(view_layout: ViewLayout, shops: list[str], revenue: float, kind: str) -> list[tuple]:
    by_name = {"revenue_10m": revenue, "last_kind": kind}
    return [((shop,), [by_name[spec.name] for spec in view_layout.specs]) for shop in shops]


def _read(client, shops: list[str], feature: str) -> list:
    keys = layout.KeyEncoder(PROJECT, {"shop": ValueType.STRING}).keys([shops])
    return [layout.decode_value(client.hget(k, layout.field_name("shop_orders", feature))) for k in keys]


def test_rows_land_on_every_master_and_older_ones_are_refused_row_by_row(cluster):
    settings, client, _ = cluster
    view_layout = ViewLayout(compile_view(VIEW, SourceSettings("x:1", Path("/"))))
    sink = RedisSink(settings, PROJECT, key_ttl_s=300)
    try:
        shops = [f"s{i}" for i in range(400)]
        writes = sink.commands(view_layout, _rows(view_layout, shops, 2.5, "buy"), T)
        assert len(set(writes.slots)) > 300, "keys of many slots: one script call per slot"
        assert sink.send(writes) == []
        mixed = [f"new{i}" if i % 2 else f"s{i}" for i in range(400)]
        refused = sink.send(sink.commands(view_layout, _rows(view_layout, mixed, 9.0, "late"), T - 60_000))
        assert sorted(refused) == [(i, T) for i in range(0, 400, 2)], "each refusal names its own row"
        assert _read(client, shops[::2], "revenue_10m") == [2.5] * 200, "an older value never overwrites a newer"
        assert _read(client, mixed[1::2], "last_kind") == ["late"] * 200
        assert sink.send(sink.commands(view_layout, _rows(view_layout, shops[:3], 7.0, "newer"), T + 1)) == []
        assert _read(client, shops[:3], "last_kind") == ["newer"] * 3
        ttls = {client.ttl(k) for k in layout.KeyEncoder(PROJECT, {"shop": ValueType.STRING}).keys([shops])}
        assert ttls <= set(range(290, 301)), "every written key expires after the key ttl"
        assert sink.run_id() and sink.run_id().count(",") == 2, "the run ids of the three masters"
    finally:
        sink.close()


def test_a_stale_slot_map_and_a_slot_in_migration_are_followed(cluster):
    """MOVED: the sink's slot map puts every slot on one master; ASK: a slot half moved to another master."""
    settings, client, servers = cluster
    view_layout = ViewLayout(compile_view(VIEW, SourceSettings("x:1", Path("/"))))
    sink = RedisSink(settings, PROJECT)
    try:
        first = min(sink.redis.redis.slots.masters)
        sink.redis.redis.slots = SlotMap([[0, 16383, [first[0].encode(), first[1]]]])
        moved = [f"m{i}" for i in range(60)]
        assert sink.send(sink.commands(view_layout, _rows(view_layout, moved, 1.0, "moved"), T)) == []
        assert len(sink.redis.redis.slots.masters) == 3 and _read(client, moved, "last_kind") == ["moved"] * 60

        key = layout.KeyEncoder(PROJECT, {"shop": ValueType.STRING}).key(["asked"])
        slot = key_slot(key)
        by_port = {s.port: s for s in servers}
        source = by_port[sink.redis.redis.slots.owner[slot][1]]
        target = next(s for s in servers if s is not source and s.cli("role").startswith("master"))
        source_id, target_id = source.cli("cluster", "myid").strip(), target.cli("cluster", "myid").strip()
        assert target.cli("cluster", "setslot", str(slot), "importing", source_id).strip() == "OK"
        assert source.cli("cluster", "setslot", str(slot), "migrating", target_id).strip() == "OK"
        assert sink.send(sink.commands(view_layout, _rows(view_layout, ["asked"], 3.0, "asked"), T)) == []
        assert source.cli("cluster", "countkeysinslot", str(slot)).strip() == "0", "written where ASK pointed"
        for server in (target, source):
            server.cli("cluster", "setslot", str(slot), "node", target_id)
        assert layout.decode_value(redis.Redis(port=target.port).hget(
            key, layout.field_name("shop_orders", "last_kind"))) == "asked"
    finally:
        sink.close()
