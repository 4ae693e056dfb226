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


def test_each_row_may_carry_its_own_ts(sink_env):
    """The window writer writes every entity at its own last change: one `_ts` per row, each guarded alone."""
    client, project, view_layout, settings = sink_env
    sink = RedisSink(settings, project)
    rows = [_row(view_layout, shop, 1.0, "view") for shop in ("s1", "s2", "s3")]
    assert sink.send(sink.commands(view_layout, rows, [T, T - 60_000, T + 60_000])) == []
    keys = layout.KeyEncoder(project, {"shop": ValueType.STRING}).keys([["s1", "s2", "s3"]])
    ts_field = layout.ts_field("shop_orders")
    assert [layout.decode_timestamp_ms(client.hget(k, ts_field)) for k in keys] == [T, T - 60_000, T + 60_000]
    again = [_row(view_layout, shop, 2.0, "buy") for shop in ("s1", "s2", "s3")]
    assert sink.send(sink.commands(view_layout, again, [T, T - 120_000, T + 60_000])) == [(1, T - 60_000)]


def test_an_entity_seen_again_after_it_was_forgotten_is_written_at_the_ts_redis_holds(sink_env):
    """Its tiles all left its windows (written empty at that boundary, then forgotten); a late tile of it still in
    a window comes: its own change is earlier than Redis's `_ts`, so the write is refused and sent again at
    Redis's `_ts`, at once; the values are the late tile's, not the stale empty ones."""
    import oracle as tile_oracle
    from streaming.windows import WindowState
    from streaming.writer import write_rows

    client, project, view_layout, settings = sink_env
    sink, state, minute = RedisSink(settings, project), WindowState(view_layout), 60_000
    names = view_layout.column_names

    def apply(events):
        for (*key, start), values in tile_oracle.tiles(VIEW, events, Path("/")).items():
            state.apply(tuple(key), start, tuple(values[n] for n in names))
        dirty = state.take_dirty()
        rows = [(key, values) for key, values, _ in dirty]
        assert write_rows(sink, view_layout, rows, [ts for _, _, ts in dirty], state.served_ms) == []

    apply([{"shop": "s9", "price": 2.0, "kind": "early", "ts": T + 5_000}])
    apply([{"shop": "s8", "price": 1.0, "kind": "later", "ts": T + 60 * minute}])    # s9's tile leaves the 1h window
    assert ("s9",) not in state.entities
    apply([{"shop": "s9", "price": 7.0, "kind": "late", "ts": T + 5 * minute}])       # inside the 1h window still
    key = layout.KeyEncoder(project, {"shop": ValueType.STRING}).key(["s9"])
    assert layout.decode_value(client.hget(key, layout.field_name("shop_orders", "last_kind"))) == "late"
    assert layout.decode_timestamp_ms(client.hget(key, layout.ts_field("shop_orders"))) == T + 61 * minute


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
