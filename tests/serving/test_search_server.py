"""Search on a Milvus server (the one `featurectl services up --milvus` runs, started here on free ports in a
scratch folder): the project's default index there is HNSW, built over the sealed rows after `VectorIndex.seal`;
`client.search` finds numpy's exact nearest neighbours of seeded isotropic vectors at recall@10 >= 0.95, at the
distances numpy computes for the ids found; Feast's own `retrieve_online_documents_v2` reads the same index; the
server's metrics (`bench._milvus_metrics`) count the searches we sent.
`featurectl materialize` of a view with a vector feature seals what it wrote, so the server serves it through the
index."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pytest

from cli_helpers import sibling

pytestmark = pytest.mark.integration

vector_env = sibling("vector_env", "serving")
ROWS, DIM, QUERIES, K = 3000, 32, 100, 10


@pytest.fixture(scope="module")
def milvus_server(tmp_path_factory):
    from common.config import ProjectConfig
    from featurectl.services.milvus_server import MilvusServer, free_port_block

    folder = tmp_path_factory.mktemp("milvus")
    server = MilvusServer(ProjectConfig(folder, {
        "project": "milvus", "registry": {"path": f"sqlite:///{folder / 'registry.db'}"},
        "platform": {"state_dir": str(folder), "vectors": {"local_port": free_port_block()}}}), access_log=True)
    server.up()
    try:
        yield server
    finally:
        server.down()


@pytest.fixture(scope="module")
def milvus_uri(milvus_server):
    return milvus_server.uri


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, local_services, milvus_uri):
    import redis

    from common.config import load_config
    from dsl.repo import load_repo
    from serving.client import OnlineClient
    from serving.vector_index import VectorIndex

    project = f"hnsw{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(tmp_path_factory.mktemp("hnsw"), project, DIM,
                                          {"vectors": {"engine": "milvus", "uri": milvus_uri}})
    drawn = np.random.default_rng(19).normal(size=(ROWS + QUERIES, DIM)).astype(np.float32)
    vectors, queries = drawn[:ROWS], drawn[ROWS:]
    client = OnlineClient.from_repo(repo)
    cfg = load_config(repo)
    index = VectorIndex(cfg)
    try:
        client.push("asset_shape_push", {"asset_id": [f"r{i}" for i in range(ROWS)], "category": ["x"] * ROWS,
                                         "faces": list(range(ROWS)), "embedding": list(vectors),
                                         "event_timestamp": [int(time.time() * 1000)] * ROWS})
        index.seal(next(v for v in load_repo(repo).views if v.name == "asset_shape"))
        yield repo, client, index, f"{project}_asset_shape", vectors, queries
    finally:
        client.close()
        index.drop(f"{project}_asset_shape")
        db = redis.Redis(*cfg.redis_host_port)
        keys = list(db.scan_iter(match=b"*" + project.encode(), count=10_000))
        if keys:
            db.delete(*keys)


def test_default_index_on_a_server_is_hnsw_over_every_row(indexed):
    from serving.vector_index import HNSW_BUILD

    _, _, index, collection, _, _ = indexed
    described = index.client().describe_index(collection, "vector_index_embedding")
    assert described["index_type"] == "HNSW"
    assert {name: int(described[name]) for name in HNSW_BUILD} == HNSW_BUILD
    assert (int(described["indexed_rows"]), int(described["pending_index_rows"])) == (ROWS, 0)


def test_server_metrics_and_access_log_count_our_searches(indexed, milvus_server):
    from bench._milvus_access_log import log_size, search_times_ms
    from bench._milvus_metrics import server_figures, snapshot

    _, client, index, collection, _, queries = indexed
    assert sum(segment.num_rows for segment in index.served_segments(collection)) == ROWS
    before, log_from = snapshot(milvus_server.metrics_url), log_size(milvus_server.access_log_file)
    for query in queries[:20]:
        client.search("asset_shape:embedding", query, k=K)
    figures = server_figures(before, snapshot(milvus_server.metrics_url))
    logged = search_times_ms(milvus_server.access_log_file, log_from)
    assert len(logged) == 20 and all(0 < ms < 10_000 for ms in logged)
    assert figures["server_searches"] == 20
    assert 0 <= figures["server_over_2ms_pct"] <= 100 and figures["server_cpu_ms_per_search"] > 0
    low, high = figures["server_p99_ms"]
    assert high is None or low < high


def test_recall_at_10_against_exact_search(indexed):
    _, client, _, _, vectors, queries = indexed
    recall = vector_env.search_recall(client, vectors, queries, K)
    assert recall >= 0.95, f"recall@{K} {recall:.3f} over {QUERIES} queries"


def test_feast_reads_the_same_index(indexed):
    from feast import FeatureStore

    from dsl.types import Vector

    _, client, index, _, _, queries = indexed
    store = FeatureStore(config=index.feast_repo_config(Vector(DIM)))
    for query in queries[:5]:
        ours = [row["asset_id"] for row in client.search("asset_shape:embedding", query, k=K).ids]
        theirs = store.retrieve_online_documents_v2(features=["asset_shape:embedding"], query=query.tolist(),
                                                    top_k=K, distance_metric="L2").to_dict()["asset_id"]
        assert theirs == ours


def test_materialize_seals_the_index(tmp_path, local_services, milvus_uri):
    import redis
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.materialize_commands import materialize
    from serving.vector_index import VectorIndex

    project = f"seal{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(tmp_path, project, DIM, {"vectors": {"engine": "milvus", "uri": milvus_uri}})
    vectors = np.random.default_rng(20).normal(size=(ROWS, DIM)).astype(np.float32)
    cfg, _, when = vector_env.offline_rows(repo, vectors, "m")
    index, collection = VectorIndex(cfg), f"{project}_asset_shape"
    try:
        hour = dt.timedelta(hours=1)
        ran = CliRunner().invoke(materialize, [(when - hour).isoformat(), (when + hour).isoformat()],
                                 obj=Context(repo, None))
        assert ran.exit_code == 0, ran.output + repr(ran.exception)
        described = index.client().describe_index(collection, "vector_index_embedding")
        assert (int(described["indexed_rows"]), int(described["pending_index_rows"])) == (ROWS, 0)
        assert index.served_indexed_rows(collection) == ROWS
    finally:
        index.drop(collection)
        db = redis.Redis(*cfg.redis_host_port)
        keys = list(db.scan_iter(match=b"*" + project.encode(), count=10_000))
        if keys:
            db.delete(*keys)


def test_a_bulk_write_deletes_only_what_the_collection_holds_and_replaces_it(tmp_path, local_services, milvus_uri):
    import pyarrow as pa

    from common.config import load_config
    from dsl.compile_feast import EVENT_TIMESTAMP
    from dsl.repo import load_repo
    from dsl.types import Vector
    from serving.vector_index import VectorIndex

    project = f"bulk{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(tmp_path, project, DIM, {"vectors": {"engine": "milvus", "uri": milvus_uri}})
    view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
    index, collection = VectorIndex(load_config(repo)), f"{project}_asset_shape"
    rng = np.random.default_rng(21)

    def table(ids: range, vectors: np.ndarray):
        return pa.table({"asset_id": [f"b{i}" for i in ids], "category": ["x"] * len(ids), "faces": list(ids),
                         "embedding": pa.array(list(vectors), Vector(DIM).arrow_type()),
                         EVENT_TIMESTAMP: pa.array([dt.datetime.now(dt.timezone.utc)] * len(ids),
                                                   pa.timestamp("ms", "UTC"))})

    first, second = rng.normal(size=(200, DIM)).astype(np.float32), rng.normal(size=(200, DIM)).astype(np.float32)
    try:
        assert index.write_table(view, table(range(0, 200), first)) == 200
        rows = index.client().query(collection, filter="asset_id_pk != ''", output_fields=["asset_id_pk", "asset_id"],
                                    consistency_level="Strong", limit=1000)
        keys = {row["asset_id"]: row["asset_id_pk"] for row in rows}
        assert len(keys) == 200
        asked = [keys["b7"], keys["b150"], "0" * 32]
        assert index._held(collection, "asset_id_pk", asked) == {keys["b7"], keys["b150"]}  # unflushed rows too
        assert index.write_table(view, table(range(100, 300), second)) == 200
        rows = index.client().query(collection, filter="asset_id_pk != ''", output_fields=["asset_id", "embedding"],
                                    consistency_level="Strong", limit=1000)
        assert sorted(row["asset_id"] for row in rows) == sorted(f"b{i}" for i in range(300))
        for row in rows:
            i = int(row["asset_id"][1:])
            expected = first[i] if i < 100 else second[i - 100]
            np.testing.assert_allclose(row["embedding"], expected, rtol=1e-6)
    finally:
        index.drop(collection)
