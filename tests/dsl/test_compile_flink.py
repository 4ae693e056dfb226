"""DSL -> Flink SQL: one query text for both modes, DDL per mode, partials per aggregation."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, Float64, Int32, Int64, String, Timestamp, col
from dsl.compile_flink import SourceSettings, compile_view
from dsl.compile_stream_source import KafkaRead, source_relation

SETTINGS = SourceSettings("127.0.0.1:19092", Path("/data"))
EVENTS = EventSource("clicks", {"shop": String, "item": Int32, "user": String, "price": Float64, "qty": Int64,
                                "ts": Timestamp}, timestamp_field="ts", kafka_topic="clicks-v1", path="clicks",
                     watermark_delay="10s")
ITEM = Entity("item", join_keys={"shop": String, "item": Int32})


@pytest.fixture
def compiled():
    view = FeatureView("item_sales", ITEM, EVENTS, tile="5m", features=[
        Aggregation("sum", "qty", windows=["1h", "24h"], filter=(col("price") > 1.5) & (col("user") != "bot")),
        Aggregation("mean", "price", windows=["1h"]),
        Aggregation("approx_distinct", "user", windows=["24h"], name="buyers"),
        Aggregation("count", windows=["10m"]),
        Attribute("price", name="last_price"),
    ])
    return compile_view(view, SETTINGS)


def test_same_query_text_in_both_modes(compiled):
    streaming, batch = compiled.statements("streaming"), compiled.statements("batch")
    assert streaming[-1] == batch[-1] == compiled.tile_query
    assert streaming[:-4] == batch[:-2] == list(compiled.function_ddl)
    assert streaming[-4:-1] == list(compiled.streaming_source.ddl)


def test_streaming_source_is_the_relation_the_stream_job_runs(compiled):
    kafka, checked, on_time = compiled.streaming_source.ddl
    assert compiled.streaming_source == source_relation(EVENTS, KafkaRead("127.0.0.1:19092", "featurectl", {
        "scan.startup.mode": "group-offsets", "properties.auto.offset.reset": "earliest"}), ("shop", "item"))
    assert kafka.startswith("CREATE TEMPORARY TABLE `clicks__kafka` (")
    assert "'topic' = 'clicks-v1'" in kafka and "'properties.bootstrap.servers' = '127.0.0.1:19092'" in kafka
    assert "'format' = 'raw'" in kafka and "`__payload` BYTES" in kafka
    assert "LATERAL TABLE(PARSE_EVENT(k.`__payload`, " in checked
    assert on_time.startswith("CREATE TEMPORARY VIEW `clicks` AS")
    assert "CURRENT_WATERMARK" not in "\n".join(compiled.statements("streaming"))


def test_streaming_view_drops_events_later_than_delay_plus_allowed_lateness(compiled):
    on_time = compiled.streaming_source.ddl[-1]
    assert on_time.endswith("WHERE `__error` IS NULL AND `ts` >= `__max_seen` - 40000")  # 10s delay + 30s lateness
    assert '"required": ["shop", "item", "ts"]' in compiled.streaming_source.ddl[1]


def test_source_keys_widen_the_required_fields():
    view = FeatureView("v", ITEM, EVENTS, features=[Aggregation("count", windows=["1h"])])
    checked = compile_view(view, SETTINGS, source_keys=("shop", "item", "user")).streaming_source.ddl[1]
    assert '"required": ["shop", "item", "user", "ts"]' in checked


def test_batch_ddl_reads_parquet_with_the_columns_the_streaming_view_has(compiled):
    ddl = compiled.batch_source_ddl
    assert "'connector' = 'filesystem'" in ddl and "'path' = 'file:///data/clicks'" in ddl
    assert "'format' = 'parquet'" in ddl
    batch_columns = [line.split()[0] for line in ddl.split(") WITH")[0].split("(", 1)[1].split(",\n")
                     if not line.strip().startswith("WATERMARK")]
    view_columns = [line.strip(" ,").split()[-1] for line in
                    compiled.streaming_source.ddl[-1].split("SELECT\n", 1)[1].split("\nFROM")[0].split("\n")]
    assert [c.strip() for c in batch_columns] == view_columns


def test_tile_query_groups_by_all_join_keys_and_epoch_aligned_tile(compiled):
    query = compiled.tile_query
    assert "`ts` - MOD(`ts`, 300000) AS `tile_start`" in query
    assert "FROM `clicks`\n" in query
    assert query.rstrip().endswith("GROUP BY `shop`, `item`, `ts` - MOD(`ts`, 300000)")


def test_partials_per_op(compiled):
    names = [c.name for c in compiled.tile_columns]
    assert names == ["qty_sum__sum", "price_mean__sum", "price_mean__count", "buyers__hll", "count__count",
                     "last_price__last", "__events__count", "__clock__max"]
    query = compiled.tile_query
    assert ("SUM(CASE WHEN (`price` > 1.5 AND `user` <> 'bot') THEN CAST(`qty` AS BIGINT) END) "
            "AS `qty_sum__sum`") in query
    assert "SUM(CAST(`price` AS DOUBLE)) AS `price_mean__sum`" in query
    assert "COUNT(CAST(`price` AS DOUBLE)) AS `price_mean__count`" in query
    assert "HLL_SKETCH(`user`) AS `buyers__hll`" in query
    assert "COUNT(1) AS `count__count`" in query
    assert "LAST_BY(`price`, `__rowtime`) AS `last_price__last`" in query
    assert "COUNT(*) AS `__events__count`" in query and "MAX(`ts`) AS `__clock__max`" in query
    types = {c.name: c.sql_type for c in compiled.tile_columns}
    assert types["qty_sum__sum"] == "BIGINT" and types["buyers__hll"] == "BYTES"
    assert types["last_price__last"] == "DOUBLE"


def test_window_specs_are_compiled_once_for_both_runtimes(compiled):
    specs = {w.name: w for w in compiled.windows}
    assert [w.name for w in compiled.windows] == ["qty_sum_1h", "qty_sum_24h", "price_mean_1h", "buyers_24h",
                                                  "count_10m", "last_price"]
    assert (specs["qty_sum_24h"].op, specs["qty_sum_24h"].tiles, specs["qty_sum_24h"].kind) == ("sum", 288, Int64)
    assert specs["price_mean_1h"].partials == {"sum": "price_mean__sum", "count": "price_mean__count"}
    assert specs["buyers_24h"].partials == {"hll": "buyers__hll"}
    assert (specs["last_price"].op, specs["last_price"].tiles) == ("last", 7 * 288)  # the default ttl, 7 days
    assert (compiled.tile_ms, compiled.ttl_ms, compiled.lateness_ms) == (300_000, 7 * 86_400_000, 40_000)
    assert compiled.longest_tiles == 7 * 288 and compiled.key_types == (String, Int32)


def test_a_cutover_keeps_earlier_kafka_events_out_of_the_stream():
    view = FeatureView("v", ITEM, EVENTS, features=[Aggregation("count", windows=["1h"])])
    placed = SourceSettings("127.0.0.1:19092", Path("/data"), cutovers={"clicks": 1_767_225_600_123})
    relation = compile_view(view, placed).streaming_source
    assert relation.ddl[-1].endswith("AND `ts` >= 1767225600123")
    assert relation.dead_letter_query.endswith(
        "WHERE `__error` IS NOT NULL OR (NOT (`ts` >= `__max_seen` - 40000) AND `ts` >= 1767225600123)")
    assert "1767225600123" not in compile_view(view, SETTINGS).streaming_source.ddl[-1]


def test_string_literals_are_escaped():
    view = FeatureView("v", ITEM, EVENTS, features=[
        Aggregation("count", windows=["1h"], filter=col("user") == "o'brien", name="obrien")])
    assert "`user` = 'o''brien'" in compile_view(view, SETTINGS).tile_query


def test_unknown_mode_is_rejected(compiled):
    with pytest.raises(ValueError, match="mode must be `streaming` or `batch`"):
        compiled.statements("micro-batch")


@pytest.mark.parametrize("text, sql", [("5s", "INTERVAL '5' SECOND"), ("90s", "INTERVAL '90' SECOND"),
                                       ("300s", "INTERVAL '5' MINUTE"), ("1h", "INTERVAL '1' HOUR"),
                                       ("24h", "INTERVAL '1' DAY"), ("7d", "INTERVAL '7' DAY"),
                                       ("100m", "INTERVAL '100' MINUTE(3)"), ("101s", "INTERVAL '101' SECOND(3)")])
def test_intervals_fit_flink_precision(text, sql):
    from dsl.duration import parse_duration, sql_interval

    assert sql_interval(parse_duration(text, "test")) == sql
