"""The streaming sink against the real Redis: Feast's layout, the event-time guard, and Feast's key ttl."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from dsl.compile_flink import SourceSettings, compile_view
from dsl.types import ValueType
from redis_store import freshness, freshness_history, layout
from redis_store.settings import RedisSettings
from sink_view import VIEW, T
from streaming.redis_sink import RedisSink
from streaming.windows import ViewLayout

pytestmark = pytest.mark.integration


@pytest.fixture()
def sink_env(local_services):
    host, port = local_services.redis_host_port
    client = redis.Redis(host, port)
    project = f"sink_{uuid.uuid4().hex[:8]}"
    view_layout = ViewLayout(compile_view(VIEW, SourceSettings("x:1", Path("/"))))
    yield client, project, view_layout, RedisSettings.parse(f"{host}:{port}")
    for key in client.scan_iter(match=f"*{project}".encode(), count=1_000):
        client.delete(key)


def _row(layout_: ViewLayout, shop: str, revenue: float, kind: str) -> tuple:
    by_name = {"revenue_10m": revenue, "last_kind": kind}
    return (shop,), [by_name[spec.name] for spec in layout_.specs]


def test_rows_land_in_feast_layout_and_older_ones_are_refused(sink_env):
    client, project, view_layout, settings = sink_env
    sink = RedisSink(settings, project)
    assert sink.send(sink.commands(view_layout, [_row(view_layout, "s1", 2.5, "buy")], T)) == []
    older = [_row(view_layout, "s2", 1.0, "new"), _row(view_layout, "s1", 9.0, "late")]
    assert sink.send(sink.commands(view_layout, older, T - 60_000)) == [(1, T)]  # refused, with Redis's `_ts`
    key = layout.KeyEncoder(project, {"shop": ValueType.STRING}).key(["s1"])
    assert layout.decode_value(client.hget(key, layout.field_name("shop_orders", "revenue_10m"))) == 2.5
    assert layout.decode_value(client.hget(key, layout.field_name("shop_orders", "last_kind"))) == "buy"
    assert client.ttl(key) == -1, "without key_ttl_seconds keys never expire"


def test_written_keys_expire_after_the_key_ttl(sink_env):
    client, project, view_layout, settings = sink_env
    sink = RedisSink(settings, project, key_ttl_s=300)
    rows = [_row(view_layout, shop, 1.0, "view") for shop in ("s1", "s2")]
    assert sink.send(sink.commands(view_layout, rows, T)) == []
    s1, s2 = layout.KeyEncoder(project, {"shop": ValueType.STRING}).keys([["s1", "s2"]])
    assert 290 <= client.ttl(s1) <= 300 and 290 <= client.ttl(s2) <= 300
    client.persist(s1)
    assert sink.send(sink.commands(view_layout, [_row(view_layout, "s1", 5.0, "old")], T - 1)) == [(0, T)]
    assert client.ttl(s1) == -1, "a refused (older) row does not touch the key"


def test_the_sink_records_the_newest_event_time_it_wrote_and_never_lowers_it(sink_env):
    """What the window writer sends after each flush: its views' clocks, on the sink's own connection."""
    client, project, view_layout, settings = sink_env
    sink = RedisSink(settings, project)
    try:
        sink.record_newest({"shop_orders": T})
        sink.record_newest({"shop_orders": T - 60_000})  # a slower writer process of the same stream
        assert freshness.read_newest(settings, project) == {"shop_orders": T}
    finally:
        sink.close()
        client.delete(freshness.record_key(project), freshness_history.history_key(project))
