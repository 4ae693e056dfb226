"""A private feature repo with a vector feature (`asset_shape.embedding`, Vector(dim)) beside a category, registered
in a SQLite registry against the shared Redis: the repo of the vector-type and search tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from cli_helpers import ROOT, register_repo

FEATURES_PY = '''\
from dsl import Attribute, Entity, EventSource, FeatureView, Int64, String, Timestamp, Vector

asset = Entity("asset", join_keys={{"asset_id": String}})
shapes = EventSource(name="asset_shapes", timestamp_field="updated_at", path="asset_shapes",
                     schema={{"asset_id": String, "category": String, "faces": Int64,
                              "embedding": Vector({dim}, metric="{metric}"), "updated_at": Timestamp}})
asset_shape = FeatureView(name="asset_shape", entity=asset, source=shapes, tile="1h", ttl="365d",
                          features=[Attribute("category"), Attribute("faces"), Attribute("embedding")])
'''


def make_vector_repo(folder: Path, project: str, dim: int, platform: dict | None = None, metric: str = "L2"):
    """`folder/project` with the vector view (its embedding of `metric`) applied; returns (repo path, Feast's
    FeatureStore)."""
    repo = folder / project
    repo.mkdir(parents=True)
    (repo / "features.py").write_text(FEATURES_PY.format(dim=dim, metric=metric))
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = project
    settings["registry"]["path"] = f"sqlite:///{folder / project}.db"
    settings["platform"]["data_dir"] = str(folder / f"{project}-data")
    settings["platform"]["state_dir"] = str(folder / f"{project}-state")
    settings["platform"].update(platform or {})
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo, register_repo(repo)


def stop_engine(repo: Path) -> None:
    """Stop the repo's embedded PostgreSQL of the pgvector engine, if it started one."""
    from common.config import load_config
    from serving.pgvector_index import stop_embedded

    stop_embedded(load_config(repo))


def offline_rows(repo: Path, vectors: np.ndarray, prefix: str):
    """The vector view's offline table holding `vectors` (`{prefix}{i}`, category x, faces i) as of five minutes
    ago, for `featurectl materialize`; returns (config, view, that time)."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from common.config import load_config
    from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
    from dsl.repo import load_repo
    from dsl.types import Vector

    cfg = load_config(repo)
    view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
    rows, dim = vectors.shape
    when = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=5)
    folder = offline_table_path(cfg.data_dir, view)
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"asset_id": [f"{prefix}{i}" for i in range(rows)], "category": ["x"] * rows,
                             "faces": list(range(rows)), "embedding": pa.array(list(vectors), Vector(dim).arrow_type()),
                             EVENT_TIMESTAMP: pa.array([when] * rows, pa.timestamp("ms", "UTC"))}),
                   folder / "part-0.parquet")
    return cfg, view, when


def exact_nearest(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row numbers of each query's k nearest by squared L2, nearest first."""
    distances = (queries ** 2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors ** 2).sum(1)[None, :]
    nearest = np.argpartition(distances, k, axis=1)[:, :k]
    order = np.take_along_axis(distances, nearest, axis=1).argsort(axis=1)
    return np.take_along_axis(nearest, order, axis=1)


def search_recall(client, vectors: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Mean recall@k of `client.search` over `queries` against numpy's exact search, for rows pushed as `r{row}`
    with their row number in `faces`; each answer's ids, features and distances checked on the way."""
    recalls = []
    for query, expected in zip(queries, exact_nearest(vectors, queries, k)):
        found = client.search("asset_shape:embedding", query, k=k, features=["faces"])
        rows = np.array(found.features["faces"])
        assert [row["asset_id"] for row in found.ids] == [f"r{i}" for i in rows]
        np.testing.assert_allclose(found.distances, ((vectors[rows] - query) ** 2).sum(axis=1), rtol=1e-4)
        recalls.append(len(set(rows.tolist()) & set(expected.tolist())) / k)
    return float(np.mean(recalls))
