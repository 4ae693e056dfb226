"""`featurectl models register | list | promote | rollback` against a SQLite registry and the local PostgreSQL;
checkpoints checked at registration; feature lineage recorded and listed."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from cli_helpers import copy_example_repo, register_repo

pytestmark = pytest.mark.integration


def _models(repo: Path, *args: str, registry: str | None = None):
    """`featurectl [--registry R] --repo REPO models ARGS` in-process; the result and its output."""
    from featurectl.cli import Context
    from featurectl.models_commands import models

    return CliRunner().invoke(models, list(args), obj=Context(repo, registry))


def _ok(repo: Path, *args: str, registry: str | None = None) -> str:
    result = _models(repo, *args, registry=registry)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def _refused(repo: Path, *args: str, registry: str | None = None) -> str:
    """The message of the FeaturectlError the CLI prints as one line."""
    from common.errors import FeaturectlError

    result = _models(repo, *args, registry=registry)
    assert isinstance(result.exception, FeaturectlError), (result.output, result.exception)
    return str(result.exception)


@pytest.fixture(scope="module")
def sqlite_repo(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("models")
    return copy_example_repo(tmp, "models_sqlite", {"path": f"sqlite:///{tmp / 'registry.db'}"})


def _lifecycle(repo: Path, checkpoints: list[Path], registry: str | None = None) -> str:
    """Two versions registered, promoted, rolled back; the model's name (unique: PostgreSQL is shared)."""
    name = f"cube3d_{uuid.uuid4().hex[:8]}"
    first = _ok(repo, "register", name, str(checkpoints[0]), "--tag", "data=2026-11", registry=registry)
    assert f"registered {name} version 1: 65 tensors of config tiny" in first
    assert "version 2" in _ok(repo, "register", name, str(checkpoints[1]), registry=registry)
    assert "version 1" in _ok(repo, "promote", name, "1", "--alias", "champion", registry=registry)
    _ok(repo, "promote", name, "2", "--alias", "champion", registry=registry)
    _ok(repo, "promote", name, "1", "--alias", "challenger", registry=registry)
    listed = _ok(repo, "list", name, registry=registry)
    v1, v2 = listed.split("\n  v")[1:3]
    assert v1.startswith("1 ") and "@challenger" in v1 and "data=2026-11" in v1 and str(checkpoints[0]) in v1
    assert v2.startswith("2 ") and "@champion" in v2 and "tags:" not in v2

    assert "version 2 -> version 1" in _ok(repo, "rollback", name, registry=registry)
    listed = _ok(repo, "list", name, registry=registry)
    assert "@challenger @champion" in listed.split("\n  v")[1]
    assert "no previous champion" in _refused(repo, "rollback", name, registry=registry)
    assert "has no version 9; versions: 1, 2" in _refused(repo, "promote", name, "9", "--alias", "champion",
                                                          registry=registry)
    assert name in _ok(repo, "list", registry=registry)
    return name


def test_register_promote_rollback_on_sqlite_beside_the_registry(sqlite_repo, tiny_checkpoints):
    _lifecycle(sqlite_repo, tiny_checkpoints)
    assert (sqlite_repo.parent / "registry.mlflow.db").is_file()          # MLflow's tables in a sibling file
    assert "no model `other`" in _refused(sqlite_repo, "list", "other")


def test_register_promote_rollback_on_postgres_in_its_own_schema(sqlite_repo, tiny_checkpoints, local_services):
    import sqlalchemy as sa

    name = _lifecycle(sqlite_repo, tiny_checkpoints, registry="postgres")
    engine = sa.create_engine(local_services.postgres_url())
    try:
        with engine.connect() as conn:
            schemas = conn.execute(sa.text("SELECT table_schema FROM information_schema.tables "
                                           "WHERE table_name = 'registered_models'")).scalars().all()
            found = conn.execute(sa.text("SELECT count(*) FROM mlflow.registered_models WHERE name = :n"),
                                 {"n": name}).scalar()
    finally:
        engine.dispose()
    assert schemas == ["mlflow"] and found == 1
    from inference.registry import ModelRegistry

    ModelRegistry(local_services.postgres_url()).client.delete_registered_model(name)


def test_wrong_or_truncated_checkpoints_are_refused_with_the_reason(sqlite_repo, tiny_checkpoints, tmp_path):
    good = tiny_checkpoints[0]
    data = good.read_bytes()
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-1000])
    assert "not a readable safetensors checkpoint" in _refused(sqlite_repo, "register", "m", str(truncated))

    tensors = load_file(str(good))
    claims_v05 = tmp_path / "claims_v05.safetensors"
    save_file(tensors, str(claims_v05), metadata={"cube3d_config": "v0.5"})
    message = _refused(sqlite_repo, "register", "m", str(claims_v05))
    assert "does not match the model" in message and "wrong shape" in message

    missing = dict(tensors)
    missing.pop("lm_head.weight")
    no_head = tmp_path / "no_head.safetensors"
    save_file(missing, str(no_head), metadata={"cube3d_config": "tiny"})
    assert "1 missing: lm_head.weight" in _refused(sqlite_repo, "register", "m", str(no_head))

    unnamed = tmp_path / "unnamed.safetensors"
    save_file(tensors, str(unnamed))
    assert "pass --config" in _refused(sqlite_repo, "register", "m", str(unnamed))
    assert "registered m version 1" in _ok(sqlite_repo, "register", "m", str(unnamed), "--config", "tiny")
    reserved = _refused(sqlite_repo, "register", "m", str(good), "--tag", "feature_service=x")
    assert "are reserved for featurectl" in reserved


def test_lineage_records_the_feature_service_and_its_views_versions(tmp_path, tiny_checkpoints):
    from common.config import load_config
    from common.version_log import VersionLog
    from inference.registry.lineage import service_version

    repo = copy_example_repo(tmp_path, "models_lineage", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    register_repo(repo)
    cfg = load_config(repo)
    log = VersionLog(cfg.registry_url)
    log.record_applied(cfg.project, {"asset_attributes": ("a1b2c3", {}), "asset_activity": ("d4e5f6", {})}, [],
                       dt.datetime.now(dt.timezone.utc))
    log.close()
    out = _ok(repo, "register", "lined", str(tiny_checkpoints[0]), "--feature-service", "cube3d_conditioning")
    version = service_version({"asset_attributes": "a1b2c3", "asset_activity": "d4e5f6"})
    assert f"conditioned on cube3d_conditioning {version}" in out
    listed = _ok(repo, "list", "lined")
    assert f"features: cube3d_conditioning {version} (asset_activity@d4e5f6,asset_attributes@a1b2c3)" in listed
    assert "not registered in project" in _refused(repo, "register", "lined", str(tiny_checkpoints[0]),
                                                   "--feature-service", "nope")
