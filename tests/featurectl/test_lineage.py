"""`featurectl apply` records each view's lineage in Feast's OpenLineage consumer store (the registry database);
each apply replaces it, and teardown removes it."""

from __future__ import annotations

import re

from cli_helpers import copy_example_repo


def _record(repo, data=None):
    """Record the repo's lineage, its data in `data` (a `Storage`; default: its data folder)."""
    from feast import FeatureStore

    from common.config import load_config
    from dsl.compile_flink import SourceSettings
    from dsl.compile_repo import compile_repo
    from featurectl.lineage import record_lineage

    cfg = load_config(repo)
    settings = SourceSettings(cfg.platform.kafka.bootstrap_servers, data or cfg.data_dir)
    store = FeatureStore(config=cfg.feast_repo_config())
    return store, record_lineage(store, compile_repo(cfg.repo_path, settings), settings)


def _graph(registry) -> tuple[set, set]:
    """The derived (dataset -> dataset) edges and the datasets Feast's consumer holds."""
    from feast.openlineage.store import OpenLineageStore

    ol_store = OpenLineageStore(connection_string=f"sqlite:///{registry}")
    edges = {(e["source_namespace"], e["source_name"], e["target_name"]) for e in ol_store.get_all_lineage_edges()
             if e["edge_type"] == "derived"}
    return edges, {(d["dataset_namespace"], d["dataset_name"]) for d in ol_store.get_datasets()}


def test_apply_records_topic_and_history_to_view_to_service_and_replaces_it(tmp_path):
    registry = tmp_path / "registry.db"
    repo = copy_example_repo(tmp_path, "lineage", {"path": f"sqlite:///{registry}"}, data_dir=tmp_path / "data")
    store, namespace = _record(repo)
    assert namespace == "lineage"
    history = str(tmp_path / "data" / "asset_catalog")
    edges, datasets = _graph(registry)
    assert {("kafka://127.0.0.1:19092", "asset_interactions", "user_activity"), ("file", history, "asset_attributes"),
            ("lineage", "asset_attributes", "cube3d_conditioning")} <= edges
    assert {("lineage", "asset_activity", "asset_ratios"), ("lineage", "generation_request", "generation_fit"),
            ("lineage", "asset_ratios", "asset_ranking")} <= edges
    # 3 views x (topic + history) + the asset view's history + 2 on-demand views x 2 inputs + 5 inputs of services
    assert len(edges) == 16

    features = repo / "features.py"
    text = re.sub(r"\nuser_activity = FeatureView\(.*?\n\)\n", "\n", features.read_text(), flags=re.S)
    features.write_text(text.replace('kafka_topic="asset_catalog"', 'kafka_topic="catalog_v2"'))
    _record(repo)
    edges, datasets = _graph(registry)
    assert not any(target == "user_activity" for _, _, target in edges)
    assert ("kafka://127.0.0.1:19092", "catalog_v2", "asset_attributes") in edges and len(edges) == 14
    assert ("kafka://127.0.0.1:19092", "asset_catalog") not in datasets  # no job reads it any more
    assert ("kafka://127.0.0.1:19092", "asset_interactions") in datasets

    from featurectl.lineage import forget_lineage

    forget_lineage(store)
    assert _graph(registry) == (set(), set())


def test_nothing_is_recorded_when_the_repo_turns_the_consumer_off(tmp_path):
    registry = tmp_path / "registry.db"
    repo = copy_example_repo(tmp_path, "no_lineage", {"path": f"sqlite:///{registry}"})
    settings = repo / "feature_store.yaml"
    settings.write_text(settings.read_text().replace("enabled: true", "enabled: false"))
    _, namespace = _record(repo)
    assert namespace is None and not registry.exists()


def test_histories_in_s3_are_recorded_by_bucket_and_key(tmp_path):
    """With the data in S3 (`platform.data_storage`), Feast's consumer holds each history as OpenLineage names S3
    data, `s3://bucket` and the key, not as a `file`; a re-apply with the data back on disk drops those."""
    from common.storage import Storage

    registry = tmp_path / "registry.db"
    repo = copy_example_repo(tmp_path, "lineage_s3", {"path": f"sqlite:///{registry}"}, data_dir=tmp_path / "data")
    _record(repo, Storage("s3://lake/shop"))
    edges, datasets = _graph(registry)
    assert ("s3://lake", "shop/asset_catalog", "asset_attributes") in edges
    assert not any(namespace == "file" for namespace, _ in datasets)
    _record(repo)
    edges, datasets = _graph(registry)
    assert ("file", str(tmp_path / "data" / "asset_catalog"), "asset_attributes") in edges
    assert not any(namespace.startswith("s3://") for namespace, _ in datasets)
