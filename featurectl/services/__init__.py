"""`featurectl services up|down|status`: the local Redis, Kafka and PostgreSQL of the one-machine setup, and on
request a Flink session cluster (`up --flink N`), an S3 server or HDFS for shared storage (`up --s3`, `up --hdfs`)
and a Milvus server for the vector index (`up --milvus`).

Each service lives in its own module; all bind 127.0.0.1 on the ports feature_store.yaml names and keep pid
files, logs and data under `platform.state_dir/<service>/`.
"""

from __future__ import annotations

import subprocess
from typing import Optional
from urllib.parse import urlparse

import click

from common.config import ProjectConfig
from featurectl.services.flink_cluster import JOBMANAGER, flink_services
from featurectl.services.hdfs_server import HdfsServer
from featurectl.services.kafka_broker import KafkaBroker
from featurectl.services.milvus_server import MilvusServer, local_milvus_uri
from featurectl.services.postgres_server import PostgresServer
from featurectl.services.process import LocalService, LocalServiceError
from featurectl.services.redis_server import RedisServer
from featurectl.services.s3_server import S3Server

SERVICES: dict[str, type[LocalService]] = {"redis": RedisServer, "kafka": KafkaBroker, "postgres": PostgresServer,
                                           "s3": S3Server, "hdfs": HdfsServer, "milvus": MilvusServer}


def all_services(cfg: ProjectConfig) -> list[LocalService]:
    """Every service, the Flink processes an earlier `up --flink` started included."""
    return [*(cls(cfg) for cls in SERVICES.values()), *flink_services(cfg)]


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def _first_host(addresses: str) -> str:
    """The host of the first `host:port` in a comma-separated list."""
    return addresses.split(",")[0].strip().rpartition(":")[0] or "127.0.0.1"


def uses_local_redis(cfg: ProjectConfig) -> bool:
    """Whether the online store is on this machine (`online_store.connection_string`), where `up` starts Redis."""
    return cfg.redis_host_port[0] in LOOPBACK


def uses_local_kafka(cfg: ProjectConfig) -> bool:
    """Whether the broker is on this machine (`platform.kafka.bootstrap_servers`), where `up` starts Kafka."""
    return _first_host(cfg.platform.kafka.bootstrap_servers) in LOOPBACK


def uses_local_s3(cfg: ProjectConfig) -> bool:
    """Whether the shared storage is on the S3 server `up --s3` starts."""
    storage = cfg.shared_storage
    return (storage is not None and storage.scheme in ("s3", "s3a")
            and cfg.platform.s3.endpoint == f"http://127.0.0.1:{cfg.platform.s3.local_port}")


def uses_local_hdfs(cfg: ProjectConfig) -> bool:
    """Whether the shared storage or the data storage is on the HDFS `up --hdfs` starts."""
    ours = {f"{host}:{cfg.platform.hdfs.local_port}" for host in ("127.0.0.1", "localhost")}
    storages = (cfg.shared_storage, cfg.data_storage)
    return any(s is not None and s.scheme == "hdfs" and urlparse(s.uri).netloc in ours for s in storages)


def uses_local_milvus(cfg: ProjectConfig) -> bool:
    """Whether the vector index is on the Milvus server `up --milvus` starts."""
    vectors = cfg.platform.vectors
    return vectors.engine == "milvus" and (vectors.uri or "").rstrip("/") == local_milvus_uri(vectors.local_port)


def wanted_services(cfg: ProjectConfig, only: Optional[str], postgres: Optional[bool],
                    flink: int = 0, s3: Optional[bool] = None, milvus: Optional[bool] = None,
                    hdfs: Optional[bool] = None) -> list[LocalService]:
    """`--only` wins (`--only flink`: the cluster alone, with `--flink N` TaskManagers, 1 by default); otherwise
    Redis and Kafka where the configuration puts them on this machine, plus PostgreSQL when the flag or the config
    asks for it, plus the S3 server when the flag asks or the shared storage is on it, plus HDFS when the flag asks
    or the shared or data storage is on it, plus the Milvus server when the flag asks or the vector index is on it,
    plus the Flink cluster with `flink` TaskManagers when above 0."""
    if only == "flink":
        return flink_services(cfg, flink or 1)
    if only:
        return [SERVICES[only](cfg)]
    optional = {"redis": uses_local_redis(cfg), "kafka": uses_local_kafka(cfg),
                "postgres": cfg.platform.postgres.enabled if postgres is None else postgres,
                "s3": uses_local_s3(cfg) if s3 is None else s3,
                "hdfs": uses_local_hdfs(cfg) if hdfs is None else hdfs,
                "milvus": uses_local_milvus(cfg) if milvus is None else milvus}
    wanted = [cls(cfg) for name, cls in SERVICES.items() if optional.get(name, True)]
    return wanted + (flink_services(cfg, flink) if flink else [])


@click.group()
def services() -> None:
    """Start, stop and inspect the local Redis, Kafka (KRaft), PostgreSQL and Flink session cluster."""


@services.command()
@click.option("--postgres/--no-postgres", default=None,
              help="also start PostgreSQL (default: platform.postgres.enabled in feature_store.yaml)")
@click.option("--flink", type=click.IntRange(min=0), default=0, metavar="N",
              help="also start a Flink session cluster: a JobManager and N TaskManagers (platform.flink.local)")
@click.option("--s3/--no-s3", default=None,
              help="also start the local S3 server (S3Proxy) on platform.s3.local_port (default: when "
                   "platform.shared_storage is an s3:// URI and platform.s3.endpoint is that server)")
@click.option("--hdfs/--no-hdfs", default=None,
              help="also start a local HDFS (Hadoop's MiniDFSCluster) on platform.hdfs.local_port and "
                   "local_http_port (default: when platform.shared_storage or data_storage is on it)")
@click.option("--milvus/--no-milvus", default=None,
              help="also start the local Milvus server (vector index, HNSW) on platform.vectors.local_port and the "
                   "11 ports after it (default: when platform.vectors.uri is that server)")
@click.option("--only", type=click.Choice([*SERVICES, "flink"]), default=None, help="start this one service only")
@click.pass_obj
def up(obj, postgres: Optional[bool], flink: int, s3: Optional[bool], hdfs: Optional[bool],
       milvus: Optional[bool], only: Optional[str]) -> None:
    """Start the services that are not running and wait until each answers; running ones are left alone."""
    cfg = obj.config()
    wanted = wanted_services(cfg, only, postgres, flink, s3, milvus, hdfs)
    for svc in wanted:
        click.echo(svc.up())
    started = {svc.name: svc for svc in wanted}
    if only is None and not uses_local_redis(cfg):
        host, port = cfg.redis_host_port
        click.echo(f"redis: not started: online_store.connection_string names {host}:{port}, not this machine "
                   "(`--only redis` starts a local one on that port)")
    if only is None and not uses_local_kafka(cfg):
        click.echo(f"kafka: not started: platform.kafka.bootstrap_servers names "
                   f"{cfg.platform.kafka.bootstrap_servers}, not this machine (`--only kafka` starts a local one)")
    if HdfsServer.name in started and not uses_local_hdfs(cfg):
        server = HdfsServer(cfg)
        click.echo(f"hdfs: keep data on it with `platform.shared_storage` or `data_storage: {server.uri}/FOLDER` "
                   f"and `platform.hdfs.webhdfs: {server.webhdfs}` in feature_store.yaml")
    if MilvusServer.name in started and not uses_local_milvus(cfg):
        uri = local_milvus_uri(cfg.platform.vectors.local_port)
        click.echo(f"milvus: index vectors on it with `platform.vectors.engine: milvus` and "
                   f"`platform.vectors.uri: {uri}` in feature_store.yaml")
    if JOBMANAGER in started:
        click.echo(f"flink: jobs run on it with `--jobmanager 127.0.0.1:{cfg.platform.flink.local.rest_port}` "
                   "or `platform.flink.jobmanager` in feature_store.yaml")


@services.command()
@click.pass_obj
def down(obj) -> None:
    """Stop every service that `up` started (by its pid file), whatever the current flags, and the embedded
    PostgreSQL of the pgvector index when it runs."""
    from serving.pgvector_index import stop_embedded

    failures = []
    for svc in reversed(all_services(obj.config())):
        try:
            click.echo(svc.down())
        except (LocalServiceError, OSError) as exc:
            failures.append(f"{svc.name}: {exc}")
    try:
        stopped = stop_embedded(obj.config())
    except (subprocess.CalledProcessError, OSError) as exc:
        failures.append(f"pgvector: {exc}")
    else:
        if stopped:
            click.echo(stopped)
    if failures:
        raise click.ClickException("could not stop " + "; ".join(failures))


@services.command()
@click.pass_obj
def status(obj) -> None:
    """One line per service: name, up/down, pid, address (Flink's processes once `up --flink` started them)."""
    for svc in all_services(obj.config()):
        click.echo(svc.status())


COMMANDS = [services]
