"""plan / apply / teardown against real registries; what apply wrote is read back through Feast's own API."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_helpers import featurectl as run_cli

ROOT = Path(__file__).resolve().parents[2]


def featurectl(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=300)


def test_plan_prints_objects_and_sql_and_touches_nothing(tmp_path):
    registry = tmp_path / "registry.db"
    result = featurectl("--registry", f"sqlite:///{registry}", "plan")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "+ would create feature view asset_activity, version " in out
    assert "+ would create feature service cube3d_conditioning" in out
    assert "-- feature view asset_activity: streaming source" in out and "'connector' = 'kafka'" in out
    assert "-- feature view asset_activity: batch source" in out and "'connector' = 'filesystem'" in out
    assert out.count("FROM `asset_interactions`\nGROUP BY") == 2  # asset_activity and user_activity
    assert "CREATE TEMPORARY VIEW `asset_interactions` AS" in out
    assert not registry.exists()


def test_plan_reports_a_definition_error_without_a_traceback(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "feature_store.yaml").write_text((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    (repo / "features.py").write_text(
        "from dsl import *\n"
        "a = Entity('asset', join_keys={'asset_id': String})\n"
        "s = EventSource('ev', {'asset_id': String, 'kind': String, 't': Timestamp}, timestamp_field='t', path='ev')\n"
        "v = FeatureView('v', a, s, features=[Aggregation('sum', 'kind', windows=['1h'])])\n")
    result = featurectl("--repo", str(repo), "plan")
    assert result.returncode != 0
    assert "`sum` over string column `kind`" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.integration
def test_apply_to_postgres_registry_and_read_back_with_feast(local_services):
    from feast import FeatureStore

    from common.config import load_config

    first = featurectl("--registry", "postgres", "apply")
    assert first.returncode == 0, first.stderr
    again = featurectl("--registry", "postgres", "apply")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("no changes\n"), again.stdout

    cfg = load_config(ROOT / "feature_repo", registry_override=local_services.postgres_url())
    store = FeatureStore(config=cfg.feast_repo_config())
    views = {v.name: v for v in store.list_feature_views()}
    assert set(views) == {"asset_activity", "asset_attributes", "user_activity", "asset_geometry"}
    assert {f.name for f in views["asset_activity"].features} >= {"views_1h", "views_24h", "unique_users_24h"}
    assert {e.name for e in store.list_entities()} == {"asset", "user"}
    service = store.get_feature_service("cube3d_conditioning")
    assert {p.name for p in service.feature_view_projections} == {"asset_attributes", "asset_activity"}

    gone = featurectl("--registry", "postgres", "teardown", "--yes")
    assert gone.returncode == 0, gone.stderr
    store = FeatureStore(config=cfg.feast_repo_config())
    assert store.list_feature_views() == []
