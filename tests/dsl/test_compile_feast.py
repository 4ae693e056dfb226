"""DSL -> Feast objects: entities, views with their output schema and sources, services."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from feast import types as ft

from dsl import Aggregation, Entity, EventSource, FeatureView, Int64, Repository, String, Timestamp, load_repo
from dsl.compile_feast import compile_feast


def test_example_repo_compiles_to_feast_objects(pytestconfig):
    repo = load_repo(pytestconfig.rootpath / "feature_repo")
    objects = compile_feast(repo, Path("/data"))
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
    assert activity.stream_source is not None or activity.batch_source is not None
    assert activity.batch_source.path == "/data/offline/asset_activity"
    services = {s.name: s for s in objects.feature_services}
    cond = services["cube3d_conditioning"]
    projected = {(p.name, f.name) for p in cond.feature_view_projections for f in p.features}
    assert ("asset_attributes", "bbox_x") in projected and ("asset_activity", "views_24h") in projected
    assert len(projected) == 8


def test_entity_with_two_join_keys_becomes_two_feast_entities():
    listing = Entity("listing", join_keys={"shop_id": String, "item_id": Int64})
    source = EventSource("sales", {"shop_id": String, "item_id": Int64, "ts": Timestamp}, timestamp_field="ts",
                         path="sales")
    view = FeatureView("listing_sales", listing, source, features=[Aggregation("count", windows=["1h"])])
    objects = compile_feast(Repository.of([view]), Path("/data"))
    assert sorted(e.name for e in objects.entities) == ["listing__item_id", "listing__shop_id"]
    assert sorted(objects.feature_views[0].entities) == ["listing__item_id", "listing__shop_id"]


def test_logged_service_compiles_to_feast_logging_config():
    from feast.infra.offline_stores.file_source import FileLoggingDestination

    from dsl import FeatureLogging, FeatureService

    asset = Entity("asset", join_keys={"asset_id": String})
    source = EventSource("events", {"asset_id": String, "ts": Timestamp}, timestamp_field="ts", path="events")
    view = FeatureView("activity", asset, source, features=[Aggregation("count", windows=["1h"], name="views")])
    logged = FeatureService("ranking", features=[view], logging=FeatureLogging(sample_rate=0.25))
    plain = FeatureService("plain", features=[view])
    services = {s.name: s for s in compile_feast(Repository.of([view, logged, plain]), Path("/data")).feature_services}
    config = services["ranking"].logging_config
    assert isinstance(config.destination, FileLoggingDestination)
    assert (config.destination.path, config.destination.partition_by, config.sample_rate) == \
        ("/data/feature_logs/ranking", None, 0.25)
    assert services["plain"].logging_config is None
