"""A master of a Redis Cluster killed (SIGKILL) while materialization and the streaming sink write to it, its
replica promoted by the cluster itself (a short cluster-node-timeout): both writers carry on, nothing written is
lost, and a reader that still holds the old slot map reads everything."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import hiredis
import numpy as np
import pyarrow as pa
import pytest

from batch.cluster_writer import ClusterChunkWriter
from batch.redis_writer import RowCommands
from dsl import Aggregation, Entity, EventSource, FeatureView, Float64, String, Timestamp
from dsl.compile_flink import SourceSettings, compile_view
from dsl.types import ValueType
from featurectl.services.scratch_redis import master_with_replica, redis_cluster
from redis_store import columns, dump, layout
from redis_store.cluster import SyncCluster
from redis_store.settings import RedisSettings
from streaming.redis_sink import RedisSink
from streaming.windows import ViewLayout

pytestmark = pytest.mark.integration

PROJECT = "failover"
SCORE, TS = layout.field_name("v", "score"), layout.ts_field("v")
CHUNKS, CHUNK_ROWS = 60, 200
EVENTS = EventSource("orders", {"shop": String, "price": Float64, "ts": Timestamp}, timestamp_field="ts",
                     kafka_topic="orders", path="orders")
VIEW = FeatureView("shop_orders", Entity("shop", join_keys={"shop": String}), EVENTS, tile="1m", ttl="1h",
                   features=[Aggregation("sum", "price", windows=["10m"], name="revenue")])
SHOPS = [f"shop{i}" for i in range(300)]
T = 1_767_225_600_000


def _chunk(ids: list[str], score: int) -> RowCommands:
    encoder = layout.KeyEncoder(PROJECT, {"asset_id": ValueType.STRING})
    key_bulks = columns.bulk(columns.key_column(encoder, [pa.array(ids)]))
    millis = np.full(len(ids), 10_000, dtype=np.int64)
    values = [columns.value_encoding(pa.array([score] * len(ids)), ValueType.INT64), columns.timestamp_column(millis)]
    fields = [SCORE, TS]
    return RowCommands(key_bulks, millis, columns.hget_commands(key_bulks, TS), fields, values,
                       dump.restore_commands(key_bulks, fields, values), dump.restorable(fields, values, 64, 128))


def _materialize(settings: RedisSettings, done: list) -> None:
    """Chunk after chunk, a little apart, so that the kill lands in the middle."""
    writer = ClusterChunkWriter(settings, connections=2)
    for c in range(CHUNKS):
        writer.send(_chunk([f"a{c}_{i}" for i in range(CHUNK_ROWS)], c))
        time.sleep(0.05)
    written = writer.close()
    # a chunk sent again after the kill finds the rows it wrote before its answer was lost: not newer, skipped
    done.append(written + writer.skipped_older)


def _stream(settings: RedisSettings, rounds: list) -> None:
    """Round after round of window values for every shop, each round newer than the last."""
    view_layout = ViewLayout(compile_view(VIEW, SourceSettings("x:1", Path("/"))))
    sink = RedisSink(settings, PROJECT)
    try:
        for r in range(80):
            rows = [((shop,), [float(r)]) for shop in SHOPS]
            assert sink.send(sink.commands(view_layout, rows, T + r)) == []
            rounds.append(r)
            time.sleep(0.04)
    finally:
        sink.close()


def _hgets(keys: list[bytes], field: bytes) -> list[bytes]:
    return [hiredis.pack_command((b"HGET", key, field)) for key in keys]


def _wait_for(check, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_writers_and_readers_carry_on_through_a_failover_and_lose_nothing(tmp_path):
    with redis_cluster(tmp_path, replicas=1, node_timeout_ms=1_000) as servers:
        settings = RedisSettings.parse(",".join(f"127.0.0.1:{s.port}" for s in servers), "redis_cluster")
        reader = SyncCluster(settings)
        master, replica = master_with_replica(servers)
        written, rounds, errors = [], [], []

        def guarded(target, *args):
            try:
                target(*args)
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=guarded, args=(_materialize, settings, written)),
                   threading.Thread(target=guarded, args=(_stream, settings, rounds))]
        for thread in threads:
            thread.start()
        _wait_for(lambda: len(rounds) >= 15, "the writers did not get going", 30)
        master.kill()
        killed_at = len(rounds)
        _wait_for(lambda: "role:master" in replica.cli("info", "replication"), "the replica was not promoted", 30)
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert killed_at < 80, "the kill landed while both wrote"
        assert written == [CHUNKS * CHUNK_ROWS], "every row written, or found written by a send before the kill"

        assert ("127.0.0.1", master.port) in reader.slots.masters, "the reader's slot map still names the dead master"
        ids = [f"a{c}_{i}" for c in range(CHUNKS) for i in range(CHUNK_ROWS)]
        keys = layout.KeyEncoder(PROJECT, {"asset_id": ValueType.STRING}).keys([ids])
        assert [layout.decode_value(v) for v in reader.read(keys, _hgets(keys, SCORE))] == [
            c for c in range(CHUNKS) for _ in range(CHUNK_ROWS)], "every materialized row, as written"
        shop_keys = layout.KeyEncoder(PROJECT, {"shop": ValueType.STRING}).keys([SHOPS])
        values = reader.read(shop_keys, _hgets(shop_keys, layout.field_name("shop_orders", "revenue_10m")))
        assert [layout.decode_value(v) for v in values] == [79.0] * len(SHOPS), "the last round, on every shop"
        assert ("127.0.0.1", master.port) not in reader.slots.masters, "the reader follows the new master"
