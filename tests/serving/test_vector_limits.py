"""A vector the engine cannot index is refused by `featurectl plan` and `apply`, before anything is registered or
written: wider than pgvector's HNSW index takes (2,000 dimensions) on the default engine; Milvus takes it."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from cli_helpers import ROOT

FEATURES_PY = '''\
from dsl import Attribute, Entity, EventSource, FeatureView, String, Timestamp, Vector

asset = Entity("asset", join_keys={{"asset_id": String}})
shapes = EventSource(name="asset_shapes", timestamp_field="updated_at", path="asset_shapes",
                     schema={{"asset_id": String, "embedding": Vector({dim}), "updated_at": Timestamp}})
asset_shape = FeatureView(name="asset_shape", entity=asset, source=shapes, tile="1h", ttl="365d",
                          features=[Attribute("embedding")])
'''


def _repo(tmp_path, dim: int, engine: str):
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    (repo / "features.py").write_text(FEATURES_PY.format(dim=dim))
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = "limits"
    settings["registry"]["path"] = f"sqlite:///{tmp_path / 'registry.db'}"
    settings["platform"].update(data_dir=str(tmp_path / "data"), state_dir=str(tmp_path / "state"),
                                vectors={"engine": engine})
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def _planned(repo, command: str = "plan"):
    from featurectl import repo_commands
    from featurectl.cli import Context

    return CliRunner().invoke(getattr(repo_commands, command), [], obj=Context(repo, None))


def _refusal(done) -> str:
    from serving.vector_common import VectorSearchError

    assert isinstance(done.exception, VectorSearchError), done.output
    return str(done.exception)


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_vector_wider_than_pgvectors_hnsw_is_refused_before_anything_is_registered(tmp_path, command):
    done = _planned(_repo(tmp_path, 2001, "pgvector"), command)
    assert ("feature view `asset_shape`: vector(2001) has more dimensions than pgvector's HNSW index takes "
            "(2000): set `platform.vectors.engine: milvus`") in _refusal(done)
    assert not (tmp_path / "registry.db").exists()


def test_the_widest_vector_pgvector_indexes_and_a_wider_one_on_milvus_are_planned(tmp_path):
    done = _planned(_repo(tmp_path, 2000, "pgvector"))
    assert done.exit_code == 0, done.output
    assert "would create feature view asset_shape" in done.output
    done = _planned(_repo(tmp_path / "m", 4096, "milvus"))
    assert done.exit_code == 0, done.output

