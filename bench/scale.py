"""`featurectl bench scale`: writes past one Redis node. The same offline rows (entities x 20 features, as `bench
materialize`) are materialized three ways in one run, each side in its own process: ours into one redis-server,
ours into a Redis Cluster of `--masters` masters, and Feast's own `materialize` into the same cluster (the peer).
The cluster and the single node are this run's own (`featurectl.services.scratch_redis`), on this machine's cores,
so the cluster's figure is what the extra masters buy here, not on separate hosts; the CPU per row of the writing
process and of the redis-servers (INFO cpu) are the per-core costs the capacity plan (`docs/scale.md`) uses. The
stream's events/s at parallelism 1 and 2 are `featurectl bench stream`'s.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from pathlib import Path

import click
import pyarrow.dataset as ds

from bench._cli import featurectl
from bench._cpu import redis_cpu_s
from bench._report import emit
from bench.materialize import VIEW, offline_table, run_in_process, write_repo


def _materialize(scratch: Path, side: str, name: str, online_store: dict, ports: list[int], table,
                 start: dt.datetime, end: dt.datetime) -> dict:
    from common.config import load_config
    from dsl import load_repo
    from dsl.compile_feast import offline_table_path

    project = f"bench_scale_{name}_{int(time.time())}"
    repo = write_repo(scratch / name, project, online_store)
    cfg = load_config(repo)
    ds.write_dataset(table, offline_table_path(cfg.data_dir, load_repo(repo).view(VIEW)), format="parquet",
                     existing_data_behavior="delete_matching")
    featurectl(repo, "apply")
    click.echo(f"{name}: materializing {table.num_rows:,} entities x 20 features ...", err=True)
    before = redis_cpu_s(("127.0.0.1", port) for port in ports)
    result = run_in_process(side, repo, start, end)
    spent = redis_cpu_s(("127.0.0.1", port) for port in ports) - before
    result["redis_cpu_per_row_us"] = round(spent / result["rows"] * 1e6, 2)
    click.echo(f"{name}: {result}", err=True)
    return result


@click.command()
@click.option("--entities", default=100_000, show_default=True)
@click.option("--masters", default=3, show_default=True, type=click.IntRange(3, 16), help="Redis Cluster masters")
@click.option("--seed", default=5, show_default=True)
def command(entities: int, masters: int, seed: int) -> None:
    """Materialization into a Redis Cluster: ours vs Feast's into the same cluster, and ours vs one node."""
    from featurectl.services.scratch_redis import RedisServer, redis_cluster

    end = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    start = end - dt.timedelta(days=2)
    table = offline_table(entities, end, seed)
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        scratch = Path(folder)
        single = RedisServer(scratch / "single")
        try:
            with redis_cluster(scratch / "cluster", nodes=masters) as nodes:
                cluster = {"connection_string": ",".join(f"127.0.0.1:{n.port}" for n in nodes),
                           "redis_type": "redis_cluster"}
                ports = [n.port for n in nodes]
                one_node = _materialize(scratch, "ours", "single", {"connection_string": f"127.0.0.1:{single.port}"},
                                        [single.port], table, start, end)
                ours = _materialize(scratch, "ours", "cluster", cluster, ports, table, start, end)
                peer = _materialize(scratch, "peer", "feast_cluster", cluster, ports, table, start, end)
        finally:
            single.stop()
    metrics = ("rows_per_s", "cpu_per_row_us", "redis_cpu_per_row_us", "peak_rss_mb")
    emit("scale", {f"cluster_{m}": ours[m] for m in metrics}, {f"cluster_{m}": peer[m] for m in metrics},
         {"entities": entities, "features": 20, "masters": masters, "single_node_rows_per_s": one_node["rows_per_s"],
          "single_node_cpu_per_row_us": one_node["cpu_per_row_us"],
          "single_node_redis_cpu_per_row_us": one_node["redis_cpu_per_row_us"],
          "cluster_vs_single_node": round(ours["rows_per_s"] / one_node["rows_per_s"], 3),
          "seconds": {"single": one_node["seconds"], "cluster": ours["seconds"], "feast_cluster": peer["seconds"]},
          "peer_name": "feast 0.67 FeatureStore.materialize into the same cluster"})
