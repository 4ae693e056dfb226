"""`featurectl bench search`: nearest-neighbour search over a vector feature, our SDK against Feast's own reader.

A scratch project gets `--vectors` embeddings of `--dim` floats (clustered, as real embeddings are: `--clusters`
Gaussian clusters) materialized the usual way: values into Redis in Feast's layout, vectors into the vector index
(`serving.vector_common.open_index`). `--engine` picks where: pgvector, the default engine (HNSW; an embedded
PostgreSQL in the scratch folder, stopped at the end, or `--uri`'s postgresql://), Milvus Lite (embedded, FLAT), a
Milvus server (HNSW; the one `featurectl services up --milvus` runs, started here on free ports in the scratch folder
and stopped at the end, or `--uri`'s), or both Milvus ones, one benchmark line each; `--index-type` overrides
Milvus's default index. The server's load
ends with `VectorIndex.seal`, so the searches go through the built index. Then the same
`--queries` queries (after a warm-up; held-out draws of the same clusters) go
through `client.search(view:feature, vector, k, features=[category])`, which answers ids, distances and a Redis
feature, and through Feast's own `FeatureStore.retrieve_online_documents_v2` on the same index. Per side: p50/p99
per query and recall@k against numpy's exact search. The scratch Redis keys and Milvus collection are removed.

Where our p99 goes, measured in the same run: `index_p50_ms`/`index_p99_ms` time the index's round trip alone
(the engine's `search`: its client to the engine and back, no planning, no Redis), and `host_floor_p99_ms` times a fixed
`HOST_PROBE_MS` of CPU spun in our own process, as often as the queries: what the host's scheduling adds to a
request that waits on no other process. On a Milvus server whose metrics it can read (the one it starts, or
`--metrics-url`'s) each side also gets what the server says of its searches (`bench._milvus_metrics`): the share it
took 2 ms or more on itself (`server_over_2ms_pct`, beside the client's `search_over_2ms_pct`), the bucket of its
p99 and its CPU per search; on the server it starts, which writes its access log, per search too
(`bench._milvus_access_log`): the handler's own p50/p99 and those of the rest (`outside_server_*`). `params` records
the segments the query node searches and the load average before and after.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import click
import numpy as np

from bench._milvus_access_log import log_size, search_times_ms, split_figures
from bench._milvus_metrics import GOAL_MS, server_figures, snapshot
from bench._report import emit, percentiles
from bench._serve_env import apply_repo, bench_repo

PROJECT = "searchbench"
DEFINITIONS = """
from dsl import Vector

asset_shapes = EventSource(name="asset_shapes", timestamp_field="updated_at", path="asset_shapes",
                           schema={{"asset_id": String, "category": String, "embedding": Vector({dim}),
                                    "updated_at": Timestamp}})
asset_shape = FeatureView(name="asset_shape", entity=asset, source=asset_shapes, tile="1h", ttl="365d",
                          features=[Attribute("category"), Attribute("embedding")])
"""
WARMUP = 50
# The host probe's CPU, below one `client.search`'s own in our process (0.64 to 0.76 ms with a Redis feature,
# measured with `time.process_time`, 0.40 of it pymilvus's): a floor, not a model of the search.
HOST_PROBE_MS = 0.3


def _embeddings(rows: int, dim: int, clusters: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`rows` vectors around `clusters` Gaussian centres with their cluster numbers; `clusters` 0: one isotropic
    Gaussian (the hard case for a partitioned index), all of cluster 0."""
    if clusters == 0:
        return rng.normal(size=(rows, dim)).astype(np.float32), np.zeros(rows, dtype=np.int64)
    centers = rng.normal(size=(clusters, dim)).astype(np.float32)
    labels = rng.integers(0, clusters, rows)
    return (centers[labels] + 0.35 * rng.normal(size=(rows, dim))).astype(np.float32), labels


def _offline_table(folder: Path, vectors: np.ndarray, labels: np.ndarray, dim: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dsl.types import Vector

    when = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=5)
    table = pa.table({"asset_id": [f"asset_{i:06d}" for i in range(len(vectors))],
                      "category": [f"c{label % 20}" for label in labels.tolist()],
                      "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim),
                      "event_timestamp": pa.array([when] * len(vectors), pa.timestamp("ms", "UTC"))})
    assert table.schema.field("embedding").type == Vector(dim).arrow_type()
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "part-0.parquet")
    return folder


def _timed(queries: np.ndarray, search: Callable[[np.ndarray], list[str]], metrics_url: Optional[str] = None,
           access_log: Optional[Path] = None) -> tuple[list[float], list[list[str]], dict]:
    """Latencies (ms) and ids of the queries after the warm-up, and what the Milvus server at `metrics_url` says of
    those searches (`bench._milvus_metrics`) and, per search, its `access_log` (`bench._milvus_access_log`)."""
    for query in queries[:WARMUP]:
        search(query)
    before = snapshot(metrics_url) if metrics_url else None
    log_from = log_size(access_log) if access_log else 0
    latencies, found = [], []
    for query in queries[WARMUP:]:
        started = time.perf_counter()
        found.append(search(query))
        latencies.append((time.perf_counter() - started) * 1000)
    server = server_figures(before, snapshot(metrics_url)) if before else {}
    if access_log:
        server.update(split_figures(latencies, search_times_ms(access_log, log_from)))
    return latencies, found, server


def _spin(_: np.ndarray) -> list[str]:
    end = time.perf_counter() + HOST_PROBE_MS / 1000
    while time.perf_counter() < end:
        pass
    return []


def _latency_figures(prefix: str, latencies: list[float]) -> dict:
    marks = percentiles(latencies)
    return {f"{prefix}_p50_ms": round(marks["p50"], 3), f"{prefix}_p99_ms": round(marks["p99"], 3)}


def _figures(latencies: list[float], found: list[list[str]], server: dict, exact: list[list[str]], k: int) -> dict:
    recall = np.mean([len(set(f) & set(e)) / k for f, e in zip(found, exact)])
    over_goal = 100 * float(np.mean(np.asarray(latencies) >= GOAL_MS))
    return {**_latency_figures("search", latencies), f"recall_at_{k}": round(float(recall), 4),
            f"search_over_{GOAL_MS}ms_pct": round(over_goal, 2), **server}


def _forget_keys(host_port: tuple[str, int]) -> None:
    """The scratch project's Redis keys (they end with its name) deleted."""
    import redis

    client = redis.Redis(*host_port)
    keys = list(client.scan_iter(match=b"*" + PROJECT.encode(), count=10_000))
    for lo in range(0, len(keys), 10_000):
        client.delete(*keys[lo:lo + 10_000])


@contextlib.contextmanager
def local_milvus(folder: Path) -> Iterator[tuple[str, str, Path]]:
    """A Milvus server (`featurectl services up --milvus`'s) with its state in `folder`, on free ports, writing its
    access log; its uri, metrics endpoint and access log."""
    from common.config import ProjectConfig
    from featurectl.services.milvus_server import MilvusServer, free_port_block

    config = ProjectConfig(folder, {"project": PROJECT, "registry": {"path": f"sqlite:///{folder / 'registry.db'}"},
                                    "platform": {"state_dir": str(folder),
                                                 "vectors": {"local_port": free_port_block()}}})
    server = MilvusServer(config, access_log=True)
    started = time.perf_counter()
    click.echo(server.up(), err=True)
    click.echo(f"milvus answered {time.perf_counter() - started:.1f}s after its start", err=True)
    try:
        yield server.uri, server.metrics_url, server.access_log_file
    finally:
        click.echo(server.down(), err=True)


def run(engine: str, vectors_n: int, dim: int, k: int, queries_n: int, clusters: int, uri: Optional[str],
        seed: int, index_type: Optional[str] = None, metrics_url: Optional[str] = None,
        access_log: Optional[Path] = None) -> dict:
    from batch.materialize import materialize_view
    from common.config import load_config
    from dsl.repo import load_repo
    from dsl.types import Vector
    from redis_store.settings import RedisSettings
    from serving.client import OnlineClient
    from serving.pgvector_index import stop_embedded
    from serving.vector_common import open_index

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        scratch = Path(tmp)
        platform = {"state_dir": str(scratch / "state"), "data_dir": str(scratch / "data"),
                    "vectors": {"engine": engine, **({"uri": uri} if uri else {}),
                                **({"index_type": index_type} if index_type else {})}}
        repo = bench_repo(scratch, PROJECT, DEFINITIONS.format(dim=dim), platform)
        apply_repo(repo)
        cfg = load_config(repo)
        view = next(v for v in load_repo(repo).views if v.name == "asset_shape")
        # the queries are held-out draws of the same clusters as the indexed vectors, as queries of real embeddings are
        drawn, labels = _embeddings(vectors_n + WARMUP + queries_n, dim, clusters, rng)
        vectors, labels, queries = drawn[:vectors_n], labels[:vectors_n], drawn[vectors_n:]
        offline = _offline_table(scratch / "offline", vectors, labels, dim)
        index = open_index(cfg)
        started = time.perf_counter()
        now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        materialize_view(RedisSettings.from_config(cfg), view, PROJECT, offline, dt.datetime(2000, 1, 1), now,
                         on_written=lambda table: index.write_table(view, table))
        load_s = time.perf_counter() - started
        index.seal(view)
        seal_s = time.perf_counter() - started - load_s
        click.echo(f"materialized {vectors_n:,} rows into Redis and the index in {load_s:.1f}s, sealed and indexed "
                   f"in {seal_s:.1f}s more", err=True)
        names = np.array([f"asset_{i:06d}" for i in range(vectors_n)])
        exact = [names[np.argsort(((vectors - q) ** 2).sum(axis=1))[:k]].tolist() for q in queries[WARMUP:]]
        load_before = os.getloadavg()[0]
        try:
            host_floor, _, _ = _timed(queries, _spin)
            collection, kind = f"{PROJECT}_asset_shape", Vector(dim)
            segments = len(index.served_segments(collection)) if index.on_server and engine == "milvus" else None
            index_only, _, _ = _timed(queries, lambda q: index.search(collection, "embedding", kind, q.tolist(), k))
            with OnlineClient.from_repo(repo) as client:
                ours = _timed(queries, lambda q: [r["asset_id"] for r in client.search(
                    "asset_shape:embedding", q, k, features=["category"]).ids], metrics_url, access_log)
            from feast import FeatureStore

            store = FeatureStore(config=index.feast_repo_config(Vector(dim)))
            peer = _timed(queries, lambda q: store.retrieve_online_documents_v2(
                features=["asset_shape:embedding", "asset_shape:category"], query=q.tolist(), top_k=k,
                distance_metric="L2").to_dict()["asset_id"], metrics_url, access_log)
            load_after = os.getloadavg()[0]
        finally:
            index.drop(f"{PROJECT}_asset_shape")
            _forget_keys(cfg.redis_host_port)
            stop_embedded(cfg)
    params = {"vectors": vectors_n, "dim": dim, "k": k, "queries": queries_n, "clusters": clusters,
              "engine": _engine_name(engine, uri),
              "index": f"{index.index_type} {index.index_params} {index.search_params}", "load_s": round(load_s, 1),
              "seal_s": round(seal_s, 1), "served_segments": segments,
              "load_avg_1m": [round(load_before, 2), round(load_after, 2)]}
    where = {**_latency_figures("index", index_only),
             "host_floor_p99_ms": round(percentiles(host_floor)["p99"], 3)}
    return {"ours": {**_figures(*ours, exact, k), **where}, "peer": _figures(*peer, exact, k), "params": params}


def _engine_name(engine: str, uri: Optional[str]) -> str:
    if engine == "pgvector":
        return f"pgvector {uri}" if uri else "pgvector embedded"
    return f"milvus server {uri}" if uri else "milvus-lite"


@click.command()
@click.option("--vectors", "vectors_n", default=100_000, show_default=True, help="embeddings indexed")
@click.option("--dim", default=128, show_default=True)
@click.option("-k", "k", default=10, show_default=True, help="neighbours per query")
@click.option("--queries", "queries_n", default=1000, show_default=True, help="timed queries per side")
@click.option("--clusters", default=256, show_default=True,
              help="Gaussian clusters the embeddings and queries come from; 0: one isotropic Gaussian")
@click.option("--engine", type=click.Choice(["pgvector", "lite", "server", "both"]), default="pgvector",
              show_default=True, help="pgvector (the default engine), Milvus Lite, a Milvus server, or both Milvus "
                                      "ones one after the other")
@click.option("--uri", default=None, help="the Milvus server to use, e.g. http://127.0.0.1:19530, or with "
                                          "--engine pgvector a PostgreSQL with pgvector; default: one started for "
                                          "the run")
@click.option("--metrics-url", default=None,
              help="with --uri: that server's Prometheus metrics, e.g. http://127.0.0.1:9091/metrics, for the "
                   "server-side figures (searched by nobody else meanwhile); default: the started server's")
@click.option("--seed", default=7, show_default=True)
@click.option("--index-type", default=None, help="Milvus index instead of `platform.vectors.index_type`'s default, "
                                                 "e.g. IVF_FLAT")
def command(vectors_n: int, dim: int, k: int, queries_n: int, clusters: int, engine: str, uri: Optional[str],
            metrics_url: Optional[str], seed: int, index_type: Optional[str]) -> None:
    """Search: our SDK's p50/p99 and recall@k beside Feast's retrieve_online_documents_v2 on the same index."""
    if engine == "pgvector":
        out = run("pgvector", vectors_n, dim, k, queries_n, clusters, uri, seed)
        emit("search", out["ours"], out["peer"], out["params"])
    if engine in ("lite", "both"):
        out = run("milvus", vectors_n, dim, k, queries_n, clusters, None, seed, index_type)
        emit("search", out["ours"], out["peer"], out["params"])
    if engine in ("server", "both"):
        with contextlib.ExitStack() as stack:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-search-milvus-")))
            server, metrics, log = (uri, metrics_url, None) if uri else stack.enter_context(local_milvus(folder))
            out = run("milvus", vectors_n, dim, k, queries_n, clusters, server, seed, index_type, metrics, log)
        emit("search", out["ours"], out["peer"], out["params"])
