"""`featurectl bench scale`: writes past one Redis node. The same offline rows (entities x 20 features, as `bench
materialize`) are materialized three ways in one run, each side in its own process: ours into one redis-server,
ours into a Redis Cluster of `--masters` masters, and Feast's own `materialize` into the same cluster (the peer).
The cluster and the single node are this run's own (`featurectl.services.scratch_redis`), on this machine's cores,
so the cluster's figure is what the extra masters buy here, not on separate hosts; the CPU per row of the writing
process and of the redis-servers (INFO cpu) are the per-core costs the capacity plan (`docs/scale.md`) uses.

The stream phase starts a Flink session cluster of the run's own (a JobManager and 2 TaskManagers of 1 slot, the
classes `services up --flink 2` uses, on free ports, stopped at the end), and measures `bench stream`'s sustained
ingest on it at parallelism 1 and 2 (so parallelism 2 spans both TaskManagers), with the CPU per event of every
process the job runs in: the TaskManagers' and the JobManager's JVMs, the stream's client JVM and its window
writers. On a 2-core host p2/p1 is bounded by the cores; the CPU per event is what the plan uses. Its reference
is the same measurement on PyFlink's mini-cluster at the same parallelism (in params): the same job, events and
CPU accounting, so it shows what the session cluster's separate JVMs cost or buy. Feast's push (`bench stream`'s
peer) computes no windows, so it would say nothing about scaling the job.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click
import psutil
import pyarrow.dataset as ds
import yaml

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


TASKMANAGERS = 2


@contextmanager
def session_cluster(folder: Path, taskmanagers: int = TASKMANAGERS, slots: int = 1) -> Iterator[tuple[str, list[int]]]:
    """A Flink session cluster of this run's own: a repo at `folder` (its own state folder, free ports) and the
    services `services up --flink N` starts; yields the JobManager's REST address and the JVMs' pids, and stops
    them by those pids whatever happens (`featurectl --repo FOLDER services down` does the same by hand)."""
    from common.config import load_config
    from featurectl.services.flink_cluster import flink_services
    from featurectl.services.scratch_redis import free_port

    rest_port, rpc_port = free_port(), free_port()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "feature_store.yaml").write_text(yaml.safe_dump({
        "project": "bench_scale_flink", "registry": {"path": f"sqlite:///{folder / 'registry.db'}"},
        "platform": {"state_dir": str(folder / "state"),
                     "flink": {"local": {"rest_port": rest_port, "rpc_port": rpc_port, "slots": slots}}}}))
    services = flink_services(load_config(folder), taskmanagers)
    try:
        for svc in services:
            click.echo(svc.up(), err=True)
        yield f"127.0.0.1:{rest_port}", [svc.pid() for svc in services]
    finally:
        for svc in reversed(services):
            click.echo(svc.down(), err=True)


def _stream_phase(cfg, folder: Path, events: int, minicluster: bool) -> tuple[dict, dict]:
    """Sustained ingest at parallelism 1 and 2 on the session cluster (and on the mini-cluster when asked):
    the figures for `ours`, and the details for `params`."""
    from bench.stream import sustained_at

    load_before = psutil.getloadavg()
    session: dict[int, dict] = {}
    mini: dict[int, dict] = {}
    with session_cluster(folder) as (jobmanager, pids):
        for parallelism in (1, 2):
            click.echo(f"stream on the session cluster at parallelism {parallelism} ...", err=True)
            session[parallelism] = sustained_at(cfg, parallelism, events, jobmanager=jobmanager, cluster_pids=pids)
            if minicluster:  # interleaved, so that a change of the host's load falls on both alike
                click.echo(f"stream on the mini-cluster at parallelism {parallelism} ...", err=True)
                mini[parallelism] = sustained_at(cfg, parallelism, events)
    ours = {f"stream_p{p}_{m}": s[m] for p, s in session.items() for m in ("events_per_s", "cpu_us_per_event")}
    ours["stream_p2_vs_p1"] = round(session[2]["events_per_s"] / session[1]["events_per_s"], 3)
    params = {"stream_events": events, "stream_taskmanagers": TASKMANAGERS, "stream_slots_per_taskmanager": 1,
              "stream_session": {f"p{p}": s for p, s in session.items()},
              "stream_load_average": {"before": [round(x, 1) for x in load_before],
                                      "after": [round(x, 1) for x in psutil.getloadavg()]}}
    if mini:
        params["stream_minicluster"] = {f"p{p}": s for p, s in mini.items()}
        params["stream_minicluster_p2_vs_p1"] = round(mini[2]["events_per_s"] / mini[1]["events_per_s"], 3)
    return ours, params


@click.command()
@click.option("--entities", default=100_000, show_default=True)
@click.option("--masters", default=3, show_default=True, type=click.IntRange(3, 16), help="Redis Cluster masters")
@click.option("--seed", default=5, show_default=True)
@click.option("--events", default=1_000_000, show_default=True, type=click.IntRange(min=1000),
              help="the stream phase's backlog per run; 4 runs of 1 M are about a minute of processing on 2 cores "
              "(start-ups add about 30 s a run)")
@click.option("--minicluster/--no-minicluster", default=True, show_default=True,
              help="also measure the stream on PyFlink's mini-cluster at the same parallelism (the reference)")
@click.option("--skip-stream", is_flag=True, help="materialization only")
@click.option("--skip-materialize", is_flag=True, help="the stream phase only")
@click.pass_obj
def command(ctx, entities: int, masters: int, seed: int, events: int, minicluster: bool, skip_stream: bool,
            skip_materialize: bool) -> None:
    """Materialization into a Redis Cluster (ours vs Feast's, and vs one node) and the stream on a session cluster
    at parallelism 1 and 2."""
    if skip_stream and skip_materialize:
        raise click.UsageError("--skip-stream and --skip-materialize leave nothing to measure")
    ours: dict = {}
    peer: dict = {}
    params: dict = {"cpus": psutil.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as folder:
        if not skip_materialize:
            mine, theirs, details = _materialize_phase(Path(folder), entities, masters, seed)
            ours.update(mine)
            peer.update(theirs)
            params.update(details)
        if not skip_stream:
            mine, details = _stream_phase(ctx.config(), Path(folder) / "flink", events, minicluster)
            ours.update(mine)
            params.update(details)
    emit("scale", ours, peer, params)


def _materialize_phase(scratch: Path, entities: int, masters: int, seed: int) -> tuple[dict, dict, dict]:
    """Ours into one node and into the cluster, Feast's into the cluster: ours, the peer's, and the params."""
    from featurectl.services.scratch_redis import RedisServer, redis_cluster

    end = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    start = end - dt.timedelta(days=2)
    table = offline_table(entities, end, seed)
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
    return {f"cluster_{m}": ours[m] for m in metrics}, {f"cluster_{m}": peer[m] for m in metrics}, {
        "entities": entities, "features": 20, "masters": masters, "single_node_rows_per_s": one_node["rows_per_s"],
        "single_node_cpu_per_row_us": one_node["cpu_per_row_us"],
        "single_node_redis_cpu_per_row_us": one_node["redis_cpu_per_row_us"],
        "cluster_vs_single_node": round(ours["rows_per_s"] / one_node["rows_per_s"], 3),
        "seconds": {"single": one_node["seconds"], "cluster": ours["seconds"], "feast_cluster": peer["seconds"]},
        "peer_name": "feast 0.67 FeatureStore.materialize into the same cluster"}
