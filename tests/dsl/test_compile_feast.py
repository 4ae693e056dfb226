"""DSL -> Feast objects: entities, views with their output schema and sources, the event sources, services."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import pytest
from feast import FileSource, KafkaSource
from feast import types as ft

from dsl import Aggregation, Entity, EventSource, FeatureView, Float64, Int64, Repository, String, Timestamp
from dsl.compile_feast import compile_feast
from common.config import S3Settings
from common.storage import Storage
from dsl.compile_flink import SourceSettings, compile_view, source_path
from dsl.compile_repo import compile_repo
from dsl.errors import DefinitionError, DuplicateNameError

SETTINGS = SourceSettings("broker-1:9092,broker-2:9092", Path("/data"))


def test_example_repo_compiles_to_feast_objects(pytestconfig):
    compiled = compile_repo(pytestconfig.rootpath / "feature_repo", SETTINGS)
    repo, objects = compiled.repo, compiled.feast
    assert {e.name for e in objects.entities} == {"asset", "user"}
    asset = next(e for e in objects.entities if e.name == "asset")
    assert asset.join_key == "asset_id"
    views = {v.name: v for v in objects.feature_views}
    activity = views["asset_activity"]
    assert activity.ttl == timedelta(days=2)
    schema = {f.name: f.dtype for f in activity.schema}
    assert schema["views_24h"] == ft.Int64 and schema["dwell_ms_mean_1h"] == ft.Float64
    assert schema["last_user_24h"] == ft.String
    assert {f.name for f in activity.features} == set(repo.view("asset_activity").feature_names)
    assert activity.stream_source.name == "asset_activity_push"
    assert activity.batch_source.path == "/data/offline/asset_activity"
    services = {s.name: s for s in objects.feature_services}
    cond = services["cube3d_conditioning"]
    projected = {(p.name, f.name) for p in cond.feature_view_projections for f in p.features}
    assert ("asset_attributes", "bbox_x") in projected and ("asset_activity", "views_24h") in projected
    assert len(projected) == 8


def test_event_sources_are_kafka_sources_over_their_parquet_history(pytestconfig):
    objects = compile_repo(pytestconfig.rootpath / "feature_repo", SETTINGS).feast
    sources = {s.name: s for s in objects.data_sources}
    kafka = sources["asset_interactions"]
    assert isinstance(kafka, KafkaSource)
    assert kafka.kafka_options.topic == "asset_interactions"
    assert kafka.kafka_options.kafka_bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert kafka.kafka_options.message_format.schema_json == (
        "`asset_id` STRING, `user_id` STRING, `event_type` STRING, `dwell_ms` BIGINT, `event_time` BIGINT")
    assert kafka.kafka_options.watermark_delay_threshold == timedelta(seconds=5)
    assert kafka.timestamp_field == "event_time"
    history = kafka.batch_source
    assert isinstance(history, FileSource) and history.name == "asset_interactions_history"
    assert history.path == "/data/asset_interactions" and sources["asset_interactions_history"] == history


def test_histories_and_offline_tables_in_s3_carry_the_endpoint_to_feast_and_flink(pytestconfig):
    """`platform.data_storage` on an S3-compatible server: Feast's FileSources name the `s3://` folders with the
    endpoint; Flink's batch source reads the same URI; a source whose own path is a URI keeps it."""
    data = Storage("s3://bucket/data", S3Settings(endpoint="http://s3.local:9000", path_style_access=True))
    settings = SourceSettings("broker:9092", data)
    objects = compile_repo(pytestconfig.rootpath / "feature_repo", settings).feast
    sources = {s.name: s for s in objects.data_sources}
    for name, path in (("asset_interactions_history", "s3://bucket/data/asset_interactions"),
                       ("asset_activity_offline", "s3://bucket/data/offline/asset_activity")):
        assert (sources[name].path, sources[name].s3_endpoint_override) == (path, "http://s3.local:9000")
    repo = compile_repo(pytestconfig.rootpath / "feature_repo", settings).repo
    view = repo.view("asset_activity")
    assert "'path' = 's3://bucket/data/asset_interactions'" in compile_view(view, settings).batch_source_ddl
    elsewhere = dataclasses.replace(view, source=dataclasses.replace(view.source, path="s3a://other/events"))
    assert "'path' = 's3a://other/events'" in compile_view(elsewhere, SETTINGS).batch_source_ddl
    with pytest.raises(DefinitionError, match="has its history at s3a://other/events, not in a local folder"):
        source_path(elsewhere.source, Path("/data"))


def test_views_name_their_source_and_carry_their_tile_query(pytestconfig):
    compiled = compile_repo(pytestconfig.rootpath / "feature_repo", SETTINGS)
    tags = {v.name: v.tags for v in compiled.feast.feature_views}["user_activity"]
    query = next(c.tile_query for c in compiled.views if c.view == "user_activity")
    assert tags["featurectl.tile_query"] == query and "GROUP BY `user_id`" in query
    assert tags["featurectl.source"] == "asset_interactions"
    assert tags["featurectl.kafka_topic"] == "asset_interactions"
    assert tags["featurectl.history"] == "/data/asset_interactions"


def _compile(views: list[FeatureView]):
    return compile_feast(Repository.of(views), SETTINGS, [compile_view(v, SETTINGS) for v in views])


def test_entity_with_two_join_keys_becomes_two_feast_entities():
    listing = Entity("listing", join_keys={"shop_id": String, "item_id": Int64})
    source = EventSource("sales", {"shop_id": String, "item_id": Int64, "ts": Timestamp}, timestamp_field="ts",
                         path="sales")
    view = FeatureView("listing_sales", listing, source, features=[Aggregation("count", windows=["1h"])])
    objects = _compile([view])
    assert sorted(e.name for e in objects.entities) == ["listing__item_id", "listing__shop_id"]
    assert sorted(objects.feature_views[0].entities) == ["listing__item_id", "listing__shop_id"]
    # no topic: the Parquet history alone, and no topic tag on the view
    assert [(type(s).__name__, s.name) for s in objects.data_sources if s.name.startswith("sales")] == \
        [("FileSource", "sales_history")]
    assert "featurectl.kafka_topic" not in objects.feature_views[0].tags


def test_a_source_named_like_a_views_offline_table_is_refused():
    shop = Entity("shop", join_keys={"shop_id": String})
    source = EventSource("orders_offline", {"shop_id": String, "ts": Timestamp}, timestamp_field="ts",
                         kafka_topic="orders")
    view = FeatureView("orders", shop, source, features=[Aggregation("count", windows=["1h"])])
    with pytest.raises(DuplicateNameError, match="Feast data source `orders_offline`.*rename the source or the view"):
        _compile([view])


def test_logged_service_compiles_to_feast_logging_config():
    from feast.infra.offline_stores.file_source import FileLoggingDestination

    from dsl import FeatureLogging, FeatureService

    asset = Entity("asset", join_keys={"asset_id": String})
    source = EventSource("events", {"asset_id": String, "ts": Timestamp}, timestamp_field="ts", path="events")
    view = FeatureView("activity", asset, source, features=[Aggregation("count", windows=["1h"], name="views")])
    logged = FeatureService("ranking", features=[view], logging=FeatureLogging(sample_rate=0.25))
    plain = FeatureService("plain", features=[view])
    repo = Repository.of([view, logged, plain])
    services = {s.name: s for s in compile_feast(repo, SETTINGS, [compile_view(view, SETTINGS)]).feature_services}
    config = services["ranking"].logging_config
    assert isinstance(config.destination, FileLoggingDestination)
    assert (config.destination.path, config.destination.partition_by, config.sample_rate) == \
        ("/data/feature_logs/ranking", None, 0.25)
    assert services["plain"].logging_config is None
    local = SourceSettings(SETTINGS.bootstrap_servers, Storage.local(Path("/data")))  # what `featurectl apply` passes
    services = {s.name: s for s in compile_feast(repo, local, [compile_view(view, local)]).feature_services}
    assert services["ranking"].logging_config.destination.path == "/data/feature_logs/ranking"
    remote = SourceSettings(SETTINGS.bootstrap_servers, Storage("s3://bucket/data", S3Settings()))
    with pytest.raises(DefinitionError, match=r"feature service `ranking`: logs its served vectors, but the data "
                                              r"is in s3://bucket/data"):
        compile_feast(repo, remote, [compile_view(view, remote)])


def no_estimate(row):
    return {"estimate": float("nan"), "label": None}  # NaN and None: missing values


def test_on_demand_outputs_are_the_declared_schema_not_inferred_from_a_call():
    """Feast's `apply` infers an on-demand view's outputs from a call on made-up inputs: a missing value there has
    no type (ValueError from `infer_features`), so the declared schema is the answer."""
    from dsl import OnDemandView, RequestFields

    shop = Entity("shop", join_keys={"shop_id": String})
    source = EventSource("sales", {"shop_id": String, "qty": Int64, "ts": Timestamp}, timestamp_field="ts",
                         path="sales")
    view = FeatureView("shop_sales", shop, source, features=[Aggregation("sum", "qty", windows=["1h"])])
    odfv = OnDemandView("estimates", sources=[view[["qty_sum_1h"]], RequestFields("req", {"x": Float64})],
                        schema={"estimate": Float64, "label": String}, transformation=no_estimate, mode="python")
    repo = Repository.of([view, odfv])
    feast_odfv = compile_feast(repo, SETTINGS, [compile_view(view, SETTINGS)]).on_demand_views[0]
    feast_odfv.infer_features()  # what FeatureStore.apply calls
    assert [(f.name, f.dtype) for f in feast_odfv.features] == [("estimate", ft.Float64), ("label", ft.String)]
    assert feast_odfv.feature_transformation.transform({"qty_sum_1h": [3], "x": [1.0]})["estimate"] == [None]
