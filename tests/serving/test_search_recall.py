"""Recall of `client.search` at scale: 100,000 seeded random vectors (isotropic Gaussian, dim 96: no clusters to
help a partitioned index, another shape than `featurectl bench search`'s) pushed through the SDK into Redis and
the index of the project's default settings; the 10 nearest of held-out queries, found through the SDK, agree with
numpy's exact search at recall@10 >= 0.95, at the distances numpy computes for the ids found."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cli_helpers import sibling

pytestmark = pytest.mark.integration

vector_env = sibling("vector_env", "serving")
ROWS, DIM, QUERIES, K = 100_000, 96, 100, 10
PUSH_ROWS = 10_000


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, local_services):
    import redis

    from common.config import load_config
    from serving.client import OnlineClient

    project = f"recall{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(tmp_path_factory.mktemp("recall"), project, DIM)
    drawn = np.random.default_rng(18).normal(size=(ROWS + QUERIES, DIM)).astype(np.float32)
    vectors, queries = drawn[:ROWS], drawn[ROWS:]
    now = int(time.time() * 1000)
    client = OnlineClient.from_repo(repo)
    try:
        for lo in range(0, ROWS, PUSH_ROWS):
            rows = range(lo, min(ROWS, lo + PUSH_ROWS))
            client.push("asset_shape_push", {"asset_id": [f"r{i}" for i in rows], "category": ["x"] * len(rows),
                                             "faces": list(rows), "embedding": list(vectors[lo:lo + len(rows)]),
                                             "event_timestamp": [now] * len(rows)})
        yield client, vectors, queries
    finally:
        client.close()
        db = redis.Redis(*load_config(repo).redis_host_port)
        keys = list(db.scan_iter(match=b"*" + project.encode(), count=10_000))
        for lo in range(0, len(keys), 10_000):
            db.delete(*keys[lo:lo + 10_000])


def test_recall_at_10_against_exact_search_on_100000_vectors(indexed):
    client, vectors, queries = indexed
    recall = vector_env.search_recall(client, vectors, queries, K)
    assert recall >= 0.95, f"recall@{K} {recall:.3f} over {QUERIES} queries"
