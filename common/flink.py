"""The Flink TableEnvironment both runtimes use: jars, time zone, execution mode, local or remote cluster.

Jars live in one cache folder filled by `scripts/setup.sh`: `$FEATURECTL_JARS` or `~/.cache/featurectl/jars`,
with `flink/` holding what Flink jobs load (Kafka connector, Parquet format, our UDF jar) and `kafka/` the
broker's classpath.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

from common.errors import FeaturectlError
from common.flink_rest import FlinkRest

if TYPE_CHECKING:
    from common.storage import Storage


class FlinkSetupError(FeaturectlError, RuntimeError):
    """Flink cannot start as configured; the message names the missing piece."""


# where PyFlink's local mini-cluster listens, set to loopback (Flink's defaults bind some of them to every interface)
LOOPBACK_KEYS = ("rest.address", "rest.bind-address", "jobmanager.rpc.address", "jobmanager.bind-host",
                 "taskmanager.bind-host", "taskmanager.host")


def jar_dir(kind: str = "flink") -> Path:
    root = Path(os.environ.get("FEATURECTL_JARS", Path.home() / ".cache" / "featurectl" / "jars"))
    return root / kind


def flink_jars() -> list[Path]:
    folder = jar_dir("flink")
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise FlinkSetupError(f"no Flink jars in {folder}: run scripts/setup.sh to fetch and build them")
    return jars


def create_table_env(streaming: bool, options: Optional[Mapping[str, str]] = None,
                     jobmanager: Optional[str] = None, parallelism: int = 1, storage: Optional["Storage"] = None):
    """A TableEnvironment in UTC with our jars; `jobmanager`, a JobManager's REST address (host:port), targets a
    real cluster, checked first: the jars go with each job, so the cluster needs none of its own. `storage`:
    the shared storage its jobs write to, whose filesystem the local JVM may need (`common.storage`)."""
    from pyflink.table import EnvironmentSettings, TableEnvironment

    if storage is not None:
        _prepare_gateway(storage)
    rest = None
    if jobmanager:  # before PyFlink's JVM starts: a wrong address fails in seconds, not after minutes of retries
        rest = FlinkRest(jobmanager)
        rest.check()
    settings = EnvironmentSettings.in_streaming_mode() if streaming else EnvironmentSettings.in_batch_mode()
    # PyFlink starts a gRPC server for Python UDF workers on every interface when it targets its local
    # mini-cluster; our jobs run Java functions only, so it is never used: 'process' mode skips starting it
    os.environ["_python_worker_execution_mode"] = "process"
    env = TableEnvironment.create(settings)
    conf = env.get_config()
    conf.set("table.local-time-zone", "UTC")
    conf.set("parallelism.default", str(parallelism))
    conf.set("python.execution-mode", "thread")
    conf.set("pipeline.jars", ";".join(p.resolve().as_uri() for p in flink_jars()))
    if rest is not None:
        host, _, port = rest.url.removeprefix("http://").rpartition(":")
        conf.set("execution.target", "remote")
        conf.set("rest.address", host)
        conf.set("rest.port", port)
    else:  # the mini-cluster's REST API (it can cancel jobs), RPC and blob ports: this host only
        for key in LOOPBACK_KEYS:
            conf.set(key, "127.0.0.1")
    for key, value in (options or {}).items():
        conf.set(key, value)
    return env


def pin_planner(env) -> None:
    """Make the Java thread that serves this Python thread's next call able to plan a query.

    Flink hands Calcite its metadata provider through a thread-local set once, on the Java thread that created the
    TableEnvironment. py4j pools its connections instead of pinning them to Python threads, so after another
    Python thread has used the gateway a later call may run on a Java thread that never had it; planning there
    fails with `NullPointerException: metadataHandlerProvider` (seen in a long test session). Call this right
    before a statement that plans: it sets the provider on the current connection's thread and drops a cached
    metadata query that may have been built without one."""
    cluster = env._j_tenv.getPlanner().plannerContext().getCluster()
    cluster.setMetadataProvider(cluster.getMetadataProvider())
    cluster.invalidateMetadataQuery()


def _prepare_gateway(storage: "Storage") -> None:
    """Put what the storage's filesystem needs into the environment PyFlink's gateway JVM starts with; a JVM
    this process already started without it cannot take it any more."""
    import pyflink.java_gateway

    wanted = storage.jvm_environment(jar_dir("flink-fs"))
    if not wanted:
        return
    if pyflink.java_gateway._gateway is None:
        os.environ.update(wanted)
    elif os.environ.get("HADOOP_CLASSPATH") != wanted["HADOOP_CLASSPATH"]:
        raise FlinkSetupError(f"this process started Flink before it needed shared storage {storage.uri}; run the "
                              "command in a process of its own (each featurectl command is)")
