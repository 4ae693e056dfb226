"""A compiled repo's lineage as OpenLineage events: topic and history -> tile query -> view -> service."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from common.storage import Storage
from dsl import Aggregation, Entity, EventSource, FeatureView, Repository, String, Timestamp
from dsl.compile_flink import SourceSettings, compile_view
from dsl.compile_lineage import lineage_events
from dsl.compile_repo import compile_repo

SETTINGS = SourceSettings("broker-1:9092,broker-2:9092", Path("/data"))
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def _events(pytestconfig) -> tuple[dict[str, dict], dict[str, str]]:
    compiled = compile_repo(pytestconfig.rootpath / "feature_repo", SETTINGS)
    events = lineage_events("shop", compiled.repo, compiled.views, SETTINGS, WHEN)
    return {e["job"]["name"]: e for e in events}, {c.view: c.tile_query for c in compiled.views}


def _ids(datasets: list[dict]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def test_each_view_is_its_tile_query_from_topic_and_history(pytestconfig):
    events, queries = _events(pytestconfig)
    assert sorted(events) == ["asset_activity_tile_query", "asset_attributes_tile_query",
                              "asset_geometry_tile_query", "asset_ratios_transformation",
                              "feature_service_asset_ranking", "feature_service_cube3d_conditioning",
                              "generation_fit_transformation", "user_activity_tile_query"]
    job = events["asset_activity_tile_query"]
    assert job["job"]["namespace"] == "shop" and job["eventTime"] == "2026-01-02T03:04:05+00:00"
    assert job["eventType"] == "COMPLETE" and job["job"]["facets"]["feast_jobKind"] == {"kind": "definition"}
    assert job["job"]["facets"]["sql"]["query"] == queries["asset_activity"]
    assert _ids(job["inputs"]) == [("kafka://broker-1:9092", "asset_interactions"),
                                   ("file", "/data/asset_interactions")]
    assert [d["facets"]["feast_dataSource"]["name"] for d in job["inputs"]] == ["asset_interactions",
                                                                               "asset_interactions_history"]
    assert job["inputs"][0]["facets"]["schema"]["fields"][3] == {"name": "dwell_ms", "type": "BIGINT"}
    assert _ids(job["outputs"]) == [("shop", "asset_activity")]
    assert job["outputs"][0]["facets"]["feast_featureView"]["entities"] == ["asset"]


def test_each_service_reads_the_views_it_names(pytestconfig):
    events, _ = _events(pytestconfig)
    run = events["feature_service_cube3d_conditioning"]
    assert run["eventType"] == "COMPLETE" and run["job"]["facets"]["feast_jobKind"] == {"kind": "definition"}
    assert _ids(run["inputs"]) == [("shop", "asset_attributes"), ("shop", "asset_activity")]
    assert _ids(run["outputs"]) == [("shop", "cube3d_conditioning")]
    again, _ = _events(pytestconfig)
    assert again["feature_service_cube3d_conditioning"]["run"] == run["run"]  # one run per definition
    ranking = events["feature_service_asset_ranking"]
    assert _ids(ranking["inputs"]) == [("shop", "asset_activity"), ("shop", "asset_attributes"),
                                       ("shop", "asset_ratios")]


def test_an_on_demand_view_reads_its_stored_views_and_request_fields(pytestconfig):
    events, _ = _events(pytestconfig)
    fit = events["generation_fit_transformation"]
    assert sorted(_ids(fit["inputs"])) == [("shop", "asset_attributes"), ("shop", "generation_request")]
    assert fit["inputs"][-1]["facets"]["feast_dataSource"]["source_type"] == "RequestSource"
    assert _ids(fit["outputs"]) == [("shop", "generation_fit")]
    assert fit["outputs"][0]["facets"]["feast_featureView"]["features"] == ["prompt_length", "scale_to_target"]


def test_a_source_without_a_topic_is_read_from_its_history_alone():
    shop = Entity("shop", join_keys={"shop_id": String})
    source = EventSource("orders", {"shop_id": String, "ts": Timestamp}, timestamp_field="ts", path="/lake/orders")
    view = FeatureView("orders_1h", shop, source, features=[Aggregation("count", windows=["1h"])])
    [job] = lineage_events("shop", Repository.of([view]), [compile_view(view, SETTINGS)], SETTINGS, WHEN)
    assert _ids(job["inputs"]) == [("file", "/lake/orders")]


def test_a_history_in_object_storage_is_named_by_its_bucket_and_key():
    """OpenLineage names S3 data `s3://{bucket}` and the object key (not `file`); an `s3a://` URI is the same
    bucket; an HDFS path is named by its namenode."""
    shop = Entity("shop", join_keys={"shop_id": String})
    columns = {"shop_id": String, "ts": Timestamp}
    settings = SourceSettings("broker-1:9092", Storage("s3://lake/data/"))
    sources = [EventSource("orders", columns, timestamp_field="ts", path="orders"),
               EventSource("refunds", columns, timestamp_field="ts", path="s3a://archive/refunds/"),
               EventSource("visits", columns, timestamp_field="ts", path="hdfs://namenode:8020/lake/visits"),
               EventSource("carts", columns, timestamp_field="ts", path="/lake/carts")]
    views = [FeatureView(f"{s.name}_1h", shop, s, features=[Aggregation("count", windows=["1h"])]) for s in sources]
    jobs = lineage_events("shop", Repository.of(views), [compile_view(v, settings) for v in views], settings, WHEN)
    assert [_ids(job["inputs"]) for job in jobs] == [[("s3://lake", "data/orders")], [("s3://archive", "refunds")],
                                                     [("hdfs://namenode:8020", "/lake/visits")],
                                                     [("file", "/lake/carts")]]
    assert jobs[0]["inputs"][0]["facets"]["feast_dataSource"]["path"] == "s3://lake/data/orders"
