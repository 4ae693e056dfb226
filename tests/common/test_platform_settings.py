"""The `platform` section of feature_store.yaml: defaults when absent, and a ConfigError (the CLI's one line) that
names each wrong setting and what is wrong with it, instead of pydantic's traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.config import ConfigError, load_config


def _repo(folder: Path, platform: object = None) -> Path:
    settings = {"project": "settings", "registry": {"registry_type": "sql", "path": f"sqlite:///{folder}/r.db"}}
    if platform is not None:
        settings["platform"] = platform
    (folder / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return folder


def test_serving_monitoring_is_on_unless_turned_off(tmp_path):
    assert load_config(_repo(tmp_path)).platform.serving.monitoring is True
    (tmp_path / "feature_store.yaml").write_text((tmp_path / "feature_store.yaml").read_text()
                                                 + "platform:\n  serving:\n    monitoring: off\n")  # YAML's false
    assert load_config(tmp_path).platform.serving.monitoring is False


def test_wrong_settings_are_named_with_what_is_wrong(tmp_path):
    repo = _repo(tmp_path, {"serving": {"monitoring": "sometimes", "montoring": False}, "http": {"max_headers": 2}})
    with pytest.raises(ConfigError) as raised:
        load_config(repo)
    message = str(raised.value)
    assert message.startswith(f"{repo}/feature_store.yaml: ") and "\n" not in message
    assert "platform.serving.monitoring: input should be a valid boolean" in message and "got 'sometimes'" in message
    assert "platform.serving.montoring is not a setting (check its spelling and section)" in message
    assert "platform.http.max_headers: input should be greater than or equal to 8, got 2" in message
    assert message.endswith("Fix each one, or remove it for its default")


def test_a_platform_section_that_is_not_a_mapping_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"`platform` must be a mapping of settings, got \['serving'\]"):
        load_config(_repo(tmp_path, ["serving"]))


def test_vectors_default_to_embedded_pgvector_and_a_uri_must_fit_the_engine(tmp_path):
    vectors = load_config(_repo(tmp_path)).platform.vectors
    assert (vectors.engine, vectors.uri) == ("pgvector", None)
    for platform, wrong in (({"uri": "http://127.0.0.1:19530"}, "is not a PostgreSQL address"),
                            ({"engine": "milvus", "uri": "postgresql://u@h:5432/db"}, "set `engine: pgvector`")):
        with pytest.raises(ConfigError) as raised:
            load_config(_repo(tmp_path, {"vectors": platform}))
        assert wrong in str(raised.value), raised.value
    milvus = load_config(_repo(tmp_path, {"vectors": {"engine": "milvus", "uri": "http://127.0.0.1:19530"}}))
    assert milvus.platform.vectors.uri == "http://127.0.0.1:19530"
