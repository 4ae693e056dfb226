"""Search over a vector feature against the real engines, each test on Milvus Lite and on pgvector (the
embedded PostgreSQL of `serving.pgvector_index`): vectors pushed through the SDK land in Redis and in the index;
`client.search` (sync and async) returns numpy's exact nearest neighbours with their distances and
Redis features, honours filters, refuses a query of another dimension; Feast's own
`retrieve_online_documents_v2` finds the same ids at the same distances in the same index, and its online read of
the index the same vectors."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from cli_helpers import answer_in_process, sibling
from serving.vector_common import VectorSearchError

pytestmark = pytest.mark.integration

vector_env = sibling("vector_env", "serving")
DIM, ROWS = 8, 300
CATEGORIES = ("chair", "table", "lamp")


# Milvus Lite's exact index, and pgvector's HNSW with an ef_search above the rows: exact on this small set
ENGINES = {"milvus": {"engine": "milvus", "index_type": "FLAT", "index_params": {}},
           "pgvector": {"engine": "pgvector", "search_params": {"ef_search": 400}}}


@pytest.fixture(scope="module", params=list(ENGINES))
def env(request, tmp_path_factory, local_services):
    from serving.client import OnlineClient

    folder = tmp_path_factory.mktemp("search")
    project = f"search{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(folder, project, DIM, {"vectors": ENGINES[request.param]})
    request.addfinalizer(lambda: vector_env.stop_engine(repo))
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    ids = [f"s{i}" for i in range(ROWS)]
    categories = [CATEGORIES[i % 3] for i in range(ROWS)]
    client = OnlineClient.from_repo(repo)
    client.push("asset_shape_push", {"asset_id": ids, "category": categories, "faces": list(range(ROWS)),
                                     "embedding": list(vectors), "event_timestamp": [int(time.time() * 1000)] * ROWS})
    yield repo, client, ids, categories, vectors
    client.close()


def _exact(vectors: np.ndarray, query: np.ndarray, k: int, rows=None) -> list[int]:
    rows = np.arange(len(vectors)) if rows is None else np.asarray(rows)
    distances = ((vectors[rows] - query) ** 2).sum(axis=1)
    return rows[np.argsort(distances, kind="stable")[:k]].tolist()


def test_search_returns_exact_neighbours_with_features(env):
    _, client, ids, categories, vectors = env
    for query in np.random.default_rng(6).normal(size=(5, DIM)).astype(np.float32):
        found = client.search("asset_shape:embedding", query, k=10, features=["category", "faces"])
        expected = _exact(vectors, query, 10)
        assert [row["asset_id"] for row in found.ids] == [ids[i] for i in expected]
        assert found.features["category"] == [categories[i] for i in expected]
        assert found.features["faces"] == expected
        exact = ((vectors[expected] - query) ** 2).sum(axis=1)
        np.testing.assert_allclose(found.distances, exact, rtol=1e-4, atol=1e-4)


def test_filters_keep_only_matching_entities(env):
    _, client, ids, categories, vectors = env
    query = np.random.default_rng(7).normal(size=DIM).astype(np.float32)
    found = client.search("asset_shape:embedding", query.tolist(), k=5, filters={"category": "lamp"},
                          features=["category"])
    lamps = [i for i, c in enumerate(categories) if c == "lamp"]
    assert [row["asset_id"] for row in found.ids] == [ids[i] for i in _exact(vectors, query, 5, lamps)]
    assert set(found.features["category"]) == {"lamp"}
    two = client.search("asset_shape:embedding", query, k=5, filters={"category": ["lamp", "chair"]})
    kept = [i for i, c in enumerate(categories) if c != "table"]
    assert [row["asset_id"] for row in two.ids] == [ids[i] for i in _exact(vectors, query, 5, kept)]


def test_async_client_agrees(env):
    from serving.client import AsyncOnlineClient

    repo, client, *_ = env
    query = np.ones(DIM, dtype=np.float32)

    async def search():
        async with AsyncOnlineClient.from_repo(repo) as aclient:
            return await aclient.search("asset_shape:embedding", query, k=7, features=["faces"])

    ours = asyncio.run(search())
    sync = client.search("asset_shape:embedding", query, k=7, features=["faces"])
    assert ours.ids == sync.ids and ours.features == sync.features


@pytest.mark.parametrize("reference, vector, message", [
    ("asset_shape:embedding", [0.0] * (DIM - 1), f"the query has {DIM - 1} numbers but the feature is a "
                                                 rf"vector\({DIM}\): give {DIM}"),
    ("asset_shape:category", [0.0] * DIM, "`asset_shape:category` is not a vector feature"),
    ("asset_shape:nothing", [0.0] * DIM, "no feature `asset_shape:nothing` in the registry"),
    ("asset_shape:embedding", [0.0] * (DIM - 1) + [float("nan")], "NaN or an infinity"),
    ("asset_shape:embedding", [0.0] * (DIM - 1) + [10 ** 400], "NaN or an infinity"),
    ("asset_shape:embedding", [0.0] * (DIM - 1) + [1e39], "a number beyond float32's range"),
])
def test_bad_queries_are_clear_errors(env, reference, vector, message):
    with pytest.raises(VectorSearchError, match=message):
        env[1].search(reference, vector, k=3)


def test_bad_filter_is_a_clear_error(env):
    with pytest.raises(VectorSearchError, match="cannot filter on `embedding`"):
        env[1].search("asset_shape:embedding", [0.0] * DIM, k=3, filters={"embedding": 1})


def test_an_answer_without_hits_still_names_the_join_keys(env):
    repo, client, *_ = env
    found = client.search("asset_shape:embedding", [0.0] * DIM, k=3, filters={"category": "sofa"}, features=["faces"])
    assert found.to_dict() == {"asset_id": [], "faces": [], "distance": []}
    status, body = _post_documents(repo, {"features": ["asset_shape:embedding", "asset_shape:category"],
                                          "query": [0.0] * DIM, "top_k": 2, "api_version": 2,
                                          "filters": {"key": "category", "type": "eq", "value": "sofa"}})
    assert status == 200 and body["metadata"]["feature_names"] == ["asset_id", "category", "distance"], body


def test_a_vector_pushed_as_integers_is_indexed_and_a_null_one_leaves_the_index(env):
    """Integers are numbers for a vector (as for any float column); a row whose vector is null takes the entity out
    of the index, as Redis then serves no vector for it."""
    _, client, *_ = env
    far = [7] * DIM

    def push(vector) -> None:
        client.push("asset_shape_push", {"asset_id": ["far"], "category": ["far"], "faces": [-1],
                                         "embedding": [vector], "event_timestamp": [int(time.time() * 1000)]})

    push(far)
    found = client.search("asset_shape:embedding", far, k=1, features=["faces"])
    assert found.ids == [{"asset_id": "far"}] and found.distances == [0.0] and found.features["faces"] == [-1]
    push(None)
    assert client.get_features(["asset_shape:embedding"], {"asset_id": ["far"]})["embedding"] == [None]
    assert "far" not in [row["asset_id"] for row in client.search("asset_shape:embedding", far, k=5).ids]


def test_feast_reads_the_same_index(env):
    from feast import FeatureStore

    from common.config import load_config
    from dsl.types import Vector
    from serving.vector_common import open_index

    repo, client, ids, _, vectors = env
    index = open_index(load_config(repo))
    store = FeatureStore(config=index.feast_repo_config(Vector(DIM)))
    query = np.random.default_rng(8).normal(size=DIM).astype(np.float32)
    theirs = store.retrieve_online_documents_v2(features=["asset_shape:embedding", "asset_shape:category"],
                                                query=query.tolist(), top_k=6, distance_metric="L2").to_dict()
    ours = client.search("asset_shape:embedding", query, k=6)
    assert theirs["asset_id"] == [row["asset_id"] for row in ours.ids]
    # the same distances (Feast's PostgreSQL store gives L2 itself, ours and Milvus its square); Feast 0.67's v2
    # answer from Milvus lists them in another order than its ids
    pgvector = index.config.platform.vectors.engine == "pgvector"
    np.testing.assert_allclose(sorted(np.square(theirs["distance"]) if pgvector else theirs["distance"]),
                               ours.distances, rtol=1e-5)
    # Feast's v2 search answers the query in the vector column; its online read of the index gives the vectors
    stored = store.get_online_features(["asset_shape:embedding", "asset_shape:category"],
                                       [{"asset_id": a} for a in theirs["asset_id"]]).to_dict()
    by_id = {asset: i for i, asset in enumerate(ids)}
    assert [list(v) for v in stored["embedding"]] == [vectors[by_id[a]].tolist() for a in theirs["asset_id"]]


def _post_documents(repo, body: dict) -> tuple[int, dict]:
    """Answered in this process: Milvus Lite serves one process at a time, so a `featurectl serve` subprocess
    could not open the test's index."""
    from serving.http_app import DOCUMENTS_PATH

    return answer_in_process(repo, DOCUMENTS_PATH, body)


def test_http_retrieve_online_documents_in_feasts_shape(env):
    repo, client, ids, categories, vectors = env
    query = np.random.default_rng(9).normal(size=DIM).astype(np.float32)
    status, body = _post_documents(repo, {
        "features": ["asset_shape:embedding", "asset_shape:category"], "query": query.tolist(), "top_k": 4,
        "api_version": 2, "filters": {"type": "and", "filters": [{"key": "category", "type": "in",
                                                                  "value": ["chair", "lamp"]}]}})
    assert status == 200, body
    kept = [i for i, c in enumerate(categories) if c != "table"]
    expected = _exact(vectors, query, 4, kept)
    assert body["metadata"]["feature_names"] == ["asset_id", "category", "distance"]
    assert [r["values"] for r in body["results"][:2]] == [[ids[i] for i in expected],
                                                          [categories[i] for i in expected]]
    status, body = _post_documents(repo, {"features": ["asset_shape:embedding"], "query": [1.0, 2.0], "top_k": 3})
    assert status == 400 and body["code"] == "bad_search" and "give 8" in body["error"]


def test_cli_similar_prints_the_nearest_assets(env):
    from click.testing import CliRunner

    from featurectl.cli import Context
    from featurectl.similar_commands import similar

    repo, _, ids, categories, vectors = env
    result = CliRunner().invoke(similar, ["s0", "-k", "3"], obj=Context(repo, None))
    assert result.exit_code == 0, result.output
    expected = _exact(vectors, vectors[0], 4)[1:]
    lines = result.output.strip().splitlines()
    assert lines[0] == "rank\tasset_id\tdistance\tcategory\tfaces"
    assert [line.split("\t")[1] for line in lines[1:]] == [ids[i] for i in expected]
    missing = CliRunner().invoke(similar, ["nobody"], obj=Context(repo, None))
    assert missing.exit_code != 0 and "has no `asset_shape:embedding` in Redis" in str(missing.exception)
