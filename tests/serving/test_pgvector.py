"""The pgvector engine (`serving.pgvector_index`) against a real PostgreSQL with pgvector (pgserver's, one for the
module, reached through `platform.vectors.uri`) and the shared Redis: exact neighbours for each metric, the same on
Milvus Lite's exact index; filtered searches exact even when the HNSW walk is poor; a vector of another dimension
refused; `featurectl materialize` fills the table and its HNSW index, which Feast's own PostgreSQL store reads; the
embedded server (in the repo's state folder) is shared by the repo's clients and stopped by `services down`."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time

import numpy as np
import pgserver
import pytest

from cli_helpers import sibling
from serving.vector_common import VectorSearchError

pytestmark = pytest.mark.integration

vector_env = sibling("vector_env", "serving")
DIM, ROWS = 8, 200


@pytest.fixture(scope="module")
def postgres_uri(tmp_path_factory):
    server = pgserver.get_server(tmp_path_factory.mktemp("pgvector") / "data", cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def _pushed_repo(folder, platform: dict, metric: str = "L2", categories=None, seed: int = 1):
    """A vector repo on `platform`'s engine with ROWS rows pushed (`r{i}`, faces i); (repo, client, vectors)."""
    from serving.client import OnlineClient

    repo, _ = vector_env.make_vector_repo(folder, f"pgv{time.time_ns() % 10**9}", DIM, platform, metric)
    vectors = np.random.default_rng(seed).normal(size=(ROWS, DIM)).astype(np.float32)
    client = OnlineClient.from_repo(repo)
    client.push("asset_shape_push", {"asset_id": [f"r{i}" for i in range(ROWS)],
                                     "category": categories or ["x"] * ROWS, "faces": list(range(ROWS)),
                                     "embedding": list(vectors), "event_timestamp": [int(time.time() * 1000)] * ROWS})
    return repo, client, vectors


def _oracle(vectors: np.ndarray, query: np.ndarray, metric: str, rows=None) -> tuple[np.ndarray, np.ndarray]:
    """Row numbers nearest first and their distances as the SDK reports them: squared L2, cosine similarity,
    inner product."""
    rows = np.arange(len(vectors)) if rows is None else np.asarray(rows)
    picked = vectors[rows].astype(np.float64)
    if metric == "L2":
        scores = ((picked - query) ** 2).sum(axis=1)
        return rows[np.argsort(scores)], np.sort(scores)
    if metric == "COSINE":
        picked = picked / np.linalg.norm(picked, axis=1, keepdims=True)
        query = query / np.linalg.norm(query)
    scores = picked @ query
    order = np.argsort(-scores)
    return rows[order], scores[order]


@pytest.mark.parametrize("engine", ["milvus", "pgvector"])
@pytest.mark.parametrize("metric", ["L2", "COSINE", "IP"])
def test_nearest_are_exact_for_each_metric(tmp_path, local_services, postgres_uri, engine, metric):
    platform = ({"engine": "pgvector", "uri": postgres_uri, "search_params": {"ef_search": 400}}
                if engine == "pgvector" else {"engine": "milvus", "index_type": "FLAT", "index_params": {}})
    repo, client, vectors = _pushed_repo(tmp_path, {"vectors": platform}, metric)
    try:
        for query in np.random.default_rng(2).normal(size=(4, DIM)).astype(np.float32):
            found = client.search("asset_shape:embedding", query, k=10, features=["faces"])
            rows, distances = _oracle(vectors, query.astype(np.float64), metric)
            assert found.features["faces"] == rows[:10].tolist()
            np.testing.assert_allclose(found.distances, distances[:10], rtol=1e-4, atol=1e-5)
    finally:
        client.close()
        vector_env.stop_engine(repo)


def test_filtered_search_is_exact_where_hnsw_would_miss(tmp_path, local_services, postgres_uri):
    rare = set(range(0, ROWS, 29))  # 7 of 200 rows
    categories = ["rare" if i in rare else "common" for i in range(ROWS)]
    # ef_search 1: the HNSW walk keeps one candidate; a filter applied after it would return one row or none
    platform = {"vectors": {"engine": "pgvector", "uri": postgres_uri, "search_params": {"ef_search": 1}}}
    repo, client, vectors = _pushed_repo(tmp_path, platform, categories=categories, seed=3)
    try:
        for query in np.random.default_rng(4).normal(size=(3, DIM)):
            for value, k in (("rare", 10), ("common", 10), (["rare", "common"], 20)):
                found = client.search("asset_shape:embedding", query, k=k, filters={"category": value},
                                      features=["faces", "category"])
                kept = [i for i, c in enumerate(categories) if c in ([value] if isinstance(value, str) else value)]
                rows, distances = _oracle(vectors, query, "L2", kept)
                assert found.features["faces"] == rows[:k].tolist()
                np.testing.assert_allclose(found.distances, distances[:k], rtol=1e-4)
        assert len(client.search("asset_shape:embedding", query, k=10, filters={"category": "none"}).ids) == 0
    finally:
        client.close()


def test_a_vector_of_another_dimension_is_refused(tmp_path, local_services, postgres_uri):
    from common.config import load_config
    from dsl.repo import load_repo
    from serving.vector_common import open_index

    repo, client, _ = _pushed_repo(tmp_path, {"vectors": {"engine": "pgvector", "uri": postgres_uri}})
    client.close()
    view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
    columns = {"asset_id": ["bad"], "category": ["x"], "faces": [1], "embedding": [[0.5] * (DIM - 1)]}
    for bulk in (False, True):
        with pytest.raises(VectorSearchError, match=f"its vectors must have {DIM} numbers"):
            open_index(load_config(repo)).write(view, columns, [int(time.time() * 1000)], bulk=bulk)


def test_a_bulk_load_writes_the_rows_feasts_writer_writes(tmp_path, local_services, postgres_uri):
    """Our binary COPY against Feast's own `online_write_batch` on the same rows: every column of every row equal,
    text that COPY would have to escape, integer vectors and a null vector (its entity left out) among them."""
    import datetime as dt

    import psycopg
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.type_map import python_values_to_proto_values

    from common.config import load_config
    from dsl.repo import load_repo
    from serving.vector_common import open_index, vector_kind

    repo, _ = vector_env.make_vector_repo(tmp_path, f"pgvb{time.time_ns() % 10**9}", DIM,
                                          {"vectors": {"engine": "pgvector", "uri": postgres_uri}})
    view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
    vectors = np.random.default_rng(9).normal(size=(50, DIM)).astype(np.float32).tolist()
    vectors[3] = list(range(DIM))
    vectors[7] = None
    categories = ["tab\there", 'quote " and \\ backslash', "line\nbreak", "é ü 中文", ""] * 10
    columns = {"asset_id": [f"e{i}" for i in range(50)], "category": categories, "faces": list(range(-25, 25)),
               "embedding": vectors}
    event_ms = [1_700_000_000_123 + 1000 * i for i in range(50)]
    index = open_index(load_config(repo))
    table = f"{load_config(repo).project}_asset_shape"

    def feasts_writer():
        kept = [i for i in range(50) if vectors[i] is not None]
        kinds = {**view.entity.join_keys, **view.output_schema()}
        protos = {name: python_values_to_proto_values(
            [[float(x) for x in columns[name][i]] if name == "embedding" else columns[name][i] for i in kept],
            kind.feast_value_type()) for name, kind in kinds.items()}
        data = [(EntityKey(join_keys=["asset_id"], entity_values=[protos["asset_id"][n]]),
                 {name: protos[name][n] for name in view.feature_names},
                 dt.datetime.fromtimestamp(event_ms[i] / 1000, dt.timezone.utc), None) for n, i in enumerate(kept)]
        index._table(view)
        index._store.online_write_batch(index.feast_repo_config(vector_kind(view)), index._feast_view(view.name),
                                        data, None)

    dumped = []
    for write in (feasts_writer, lambda: index.write(view, columns, event_ms, bulk=True),
                  lambda: index.write(view, columns, event_ms)):
        write()
        with psycopg.connect(postgres_uri) as conn:
            dumped.append(conn.execute(f'SELECT entity_key, feature_name, value, value_text, vector_value::text, '
                                       f'event_ts, created_ts FROM "{table}" ORDER BY 1, 2').fetchall())
        index.drop(table)
    assert len(dumped[0]) == 49 * 3
    assert dumped[1] == dumped[0] and dumped[2] == dumped[0]


def test_an_older_row_never_replaces_a_newer_one_and_k_past_ef_search_is_served(tmp_path, local_services,
                                                                                postgres_uri):
    """Rows of one entity come in any order (a materialization's batches, a late push): the index keeps the newest,
    as Redis does, and a row without a vector removes the entity only when it is the newest. Without filters an
    HNSW walk returns at most ef_search (64) rows: a larger k is served whole."""
    from common.config import load_config
    from dsl.repo import load_repo
    from serving.vector_common import open_index, vector_kind

    repo, _ = vector_env.make_vector_repo(tmp_path, f"pgvo{time.time_ns() % 10**9}", DIM,
                                          {"vectors": {"engine": "pgvector", "uri": postgres_uri}})
    view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
    index = open_index(load_config(repo))
    table = f"{load_config(repo).project}_asset_shape"
    rng = np.random.default_rng(4)
    new, old = rng.normal(size=(ROWS, DIM)).tolist(), rng.normal(size=(ROWS, DIM)).tolist()
    ids = [f"o{i}" for i in range(ROWS)]
    rows = lambda vectors: {"asset_id": ids, "category": ["x"] * ROWS, "faces": [1] * ROWS,  # noqa: E731
                            "embedding": vectors}
    t = 1_700_000_000_000
    index.write(view, rows(new), [t] * ROWS, bulk=True)
    index.seal(view)
    index.write(view, rows(old), [t - 1000] * ROWS, bulk=True)             # an earlier batch, written after
    index.write(view, rows(old[:1] + [None] * (ROWS - 1)), [t - 1000] * ROWS)  # older rows, one without a vector
    kind = vector_kind(view)
    for i in (0, 1, ROWS - 1):
        (hit, distance), *_ = index.search(table, "embedding", kind, new[i], 1)
        assert distance == pytest.approx(0.0, abs=1e-6), i
    assert len(index.search(table, "embedding", kind, new[0], 150)) == 150
    index.write(view, rows([None] * ROWS), [t + 1000] * ROWS)               # newer, without vectors: gone
    assert index.search(table, "embedding", kind, new[0], 10) == []


def test_materialize_fills_the_index_and_feast_reads_it(tmp_path, local_services, postgres_uri):
    import psycopg
    from click.testing import CliRunner
    from feast import FeatureStore

    from dsl.types import Vector
    from featurectl.cli import Context
    from featurectl.materialize_commands import materialize
    from serving.client import OnlineClient
    from serving.vector_common import open_index

    project = f"pgvm{time.time_ns() % 10**9}"
    repo, _ = vector_env.make_vector_repo(tmp_path, project, DIM, {"vectors": {"engine": "pgvector",
                                                                               "uri": postgres_uri}})
    vectors = np.random.default_rng(5).normal(size=(ROWS, DIM)).astype(np.float32)
    cfg, _, when = vector_env.offline_rows(repo, vectors, "m")
    hour = dt.timedelta(hours=1)
    ran = CliRunner().invoke(materialize, [(when - hour).isoformat(), (when + hour).isoformat()],
                             obj=Context(repo, None))
    assert ran.exit_code == 0, ran.output + repr(ran.exception)
    table = f"{project}_asset_shape"
    with psycopg.connect(postgres_uri) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{table}" WHERE vector_value IS NOT NULL').fetchone() == (ROWS,)
        indexes = [row[0] for row in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (table,))]
    assert any("USING hnsw (vector_value vector_l2_ops)" in d and "feature_name = 'embedding'" in d for d in indexes)
    query = np.random.default_rng(6).normal(size=DIM).astype(np.float32)
    with OnlineClient.from_repo(repo) as client:
        ours = client.search("asset_shape:embedding", query, k=5)
    store = FeatureStore(config=open_index(cfg).feast_repo_config(Vector(DIM)))
    theirs = store.retrieve_online_documents_v2(features=["asset_shape:embedding", "asset_shape:category"],
                                                query=query.tolist(), top_k=5, distance_metric="L2").to_dict()
    assert theirs["asset_id"] == [row["asset_id"] for row in ours.ids]
    stored = store.get_online_features(["asset_shape:embedding"], [{"asset_id": a} for a in theirs["asset_id"]])
    written = [vectors[int(asset[1:])].tolist() for asset in theirs["asset_id"]]
    assert [list(v) for v in stored.to_dict()["embedding"]] == written


def test_the_embedded_server_is_shared_and_stopped_by_services_down(tmp_path, local_services):
    import psutil
    from click.testing import CliRunner

    from common.config import load_config
    from featurectl.cli import Context
    from featurectl.services import services
    from serving.pgvector_index import embedded_folder, embedded_server

    repo, client, vectors = _pushed_repo(tmp_path, {"vectors": {"engine": "pgvector"}})
    try:
        pid = embedded_server(load_config(repo)).get_pid()
        assert psutil.Process(pid).is_running()
        # another process of the repo finds the server this one started, and does not start one of its own
        other = subprocess.run([sys.executable, "-c", "import sys; from common.config import load_config; "
                                "from serving.pgvector_index import embedded_server; "
                                "print(embedded_server(load_config(sys.argv[1])).get_pid())", str(repo)],
                               capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert other.returncode == 0 and other.stdout.split() == [str(pid)], other.stderr
        assert client.search("asset_shape:embedding", vectors[3], k=1).ids == [{"asset_id": "r3"}]
    finally:
        client.close()
    ran = CliRunner().invoke(services, ["down"], obj=Context(repo, None))
    assert ran.exit_code == 0, ran.output + repr(ran.exception)
    assert f"pgvector: stopped the embedded PostgreSQL in {embedded_folder(load_config(repo))}" in ran.output
    assert not (embedded_folder(load_config(repo)) / "postmaster.pid").exists()
    try:  # pg_ctl waited for the postmaster's exit; at most a zombie awaits its reaping
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass


def test_the_last_process_to_exit_stops_the_server_though_one_before_it_was_killed(tmp_path):
    """A process killed while it held the embedded server (no exit handler ran) leaves its pid in pgserver's list;
    the next process of the repo drops it, so its normal exit, the last, stops the server."""
    import signal

    import psutil
    import yaml

    from cli_helpers import ROOT

    repo = tmp_path / "repo"
    repo.mkdir()
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["platform"] = {"data_dir": str(tmp_path / "data"), "state_dir": str(tmp_path / "state")}
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    open_it = ("import sys, time; from common.config import load_config; "
               "from serving.pgvector_index import embedded_server; "
               "print(embedded_server(load_config(sys.argv[1])).get_pid(), flush=True); time.sleep(float(sys.argv[2]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    held = subprocess.Popen([sys.executable, "-c", open_it, str(repo), "600"], stdout=subprocess.PIPE, text=True,
                            env=env)
    pid = int(held.stdout.readline())
    held.send_signal(signal.SIGKILL)
    held.wait()
    try:
        assert psutil.Process(pid).is_running()                 # nobody stopped it: the killed one never could
        last = subprocess.run([sys.executable, "-c", open_it, str(repo), "0"], capture_output=True, text=True,
                              env=env)
        assert last.returncode == 0 and last.stdout.split() == [str(pid)], last.stderr
        deadline = time.time() + 20
        while time.time() < deadline and psutil.pid_exists(pid) and \
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.2)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    finally:
        from common.config import load_config
        from serving.pgvector_index import stop_embedded

        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            stop_embedded(load_config(repo))
