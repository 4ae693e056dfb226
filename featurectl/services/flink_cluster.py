"""Local Flink session cluster: one JobManager and N TaskManagers from PyFlink's own distribution, on 127.0.0.1.

Each process is a service of its own (`flink-jobmanager`, `flink-taskmanager-1`, ...), with its generated config,
pid and log under `<state>/<name>/`, started by the distribution's `bin/*.sh start-foreground` (which `exec`s
the JVM, so the pid we keep is the JVM's). Jobs reach it with `--jobmanager 127.0.0.1:<rest_port>` (or
`platform.flink.jobmanager`); the jars each job needs travel with it, so the cluster needs none of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

import yaml

from common.config import ProjectConfig
from common.flink import jar_dir
from common.flink_rest import FlinkRest, FlinkRestError
from common.storage import S3_JAR_GLOB, s3_flink_options
from featurectl.services.process import HOST, LocalService, LocalServiceError, require_java, spawn

JOBMANAGER = "flink-jobmanager"
TASKMANAGER = "flink-taskmanager-"

LOG4J = """\
rootLogger.level = INFO
rootLogger.appenderRef.console.ref = ConsoleAppender
appender.console.name = ConsoleAppender
appender.console.type = CONSOLE
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %-5p %-60c %x - %m%n
logger.netty.name = org.jboss.netty.channel.DefaultChannelPipeline
logger.netty.level = OFF
"""


def flink_home() -> Path:
    """PyFlink's distribution: `bin/`, `lib/` (Flink's jars) and `conf/`."""
    import pyflink

    return Path(pyflink.__file__).parent


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested YAML keys as Flink's flat ones (`a: {b: 1}` -> `a.b: 1`)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class FlinkProcess(LocalService):
    """A JobManager or TaskManager JVM: its own config folder, and a marker (`-D io.tmp.dirs=<its tmp>`) on its
    command line from the shell script to the JVM it becomes."""

    script: str
    ready_timeout_s = 90.0
    stop_timeout_s = 30.0

    @property
    def conf_dir(self) -> Path:
        return self.dir / "conf"

    @property
    def marker(self) -> str:
        return f"io.tmp.dirs={self.dir / 'tmp'}"

    @property
    def rest(self) -> FlinkRest:
        return FlinkRest(f"{HOST}:{self.cfg.platform.flink.local.rest_port}", timeout_s=2.0)

    def check_installed(self) -> None:
        if not (flink_home() / "bin" / self.script).is_file():
            raise LocalServiceError(f"{flink_home() / 'bin' / self.script} is missing: reinstall apache-flink "
                                    "(scripts/setup.sh)")
        require_java("Flink needs Java 17")

    def settings(self) -> dict[str, Any]:
        """Our keys over the distribution's (which hold the JVM options Java 17 needs)."""
        local = self.cfg.platform.flink.local
        ours = {
            "jobmanager.rpc.address": HOST, "jobmanager.rpc.port": local.rpc_port,
            "jobmanager.bind-host": HOST, "taskmanager.bind-host": HOST, "taskmanager.host": HOST,
            "rest.address": HOST, "rest.bind-address": HOST, "rest.port": local.rest_port,
            "jobmanager.memory.process.size": local.jobmanager_memory,
            "taskmanager.memory.process.size": local.taskmanager_memory,
            "taskmanager.numberOfTaskSlots": local.slots,
            "web.tmpdir": str(self.dir / "tmp" / "web"),
        }
        if self._s3_storage():
            ours.update(s3_flink_options(self.cfg.platform.s3))
        with (flink_home() / "conf" / "config.yaml").open() as fh:
            return {**flatten(yaml.safe_load(fh) or {}), **ours}

    def _s3_storage(self) -> bool:
        storage = self.cfg.shared_storage
        return storage is not None and storage.scheme in ("s3", "s3a")

    def _plugins(self) -> Path:
        """The distribution's plugins, plus Flink's S3 filesystem when the shared storage is on S3."""
        folder = self.dir / "plugins"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(flink_home() / "plugins", folder, symlinks=True)
        if self._s3_storage():
            jars = sorted(jar_dir("flink-fs").glob(S3_JAR_GLOB))
            if not jars:
                raise LocalServiceError(f"shared storage is on S3 but {S3_JAR_GLOB} is not in {jar_dir('flink-fs')}: "
                                        "run scripts/setup.sh")
            (folder / "s3-fs-hadoop").mkdir()
            (folder / "s3-fs-hadoop" / jars[-1].name).symlink_to(jars[-1])
        return folder

    def _hadoop_client(self) -> dict[str, str]:
        """`HADOOP_CLASSPATH` naming Hadoop's client jars when the shared or data storage is on HDFS: Flink's
        launch scripts put it on the JobManager's and TaskManagers' class path, where `hdfs://` is opened."""
        storages = (self.cfg.shared_storage, self.cfg.data_storage)
        on_hdfs = next((s for s in storages if s is not None and s.scheme == "hdfs"), None)
        return {} if on_hdfs is None else on_hdfs.jvm_environment(jar_dir("flink-fs"))

    def start(self) -> subprocess.Popen:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)
        (self.conf_dir / "config.yaml").write_text(yaml.safe_dump(self.settings(), sort_keys=True))
        (self.conf_dir / "log4j-console.properties").write_text(LOG4J)
        env = {**os.environ, "FLINK_CONF_DIR": str(self.conf_dir), "FLINK_LOG_DIR": str(self.dir),
               "FLINK_PID_DIR": str(self.dir), "FLINK_PLUGINS_DIR": str(self._plugins()), **self._hadoop_client()}
        argv = ["bash", str(flink_home() / "bin" / self.script), "start-foreground",
                "-D", self.marker, *self.arguments()]
        return spawn(argv, self.log_file, self.pid_file, env=env)

    def arguments(self) -> list[str]:
        return []


class FlinkJobManager(FlinkProcess):
    name = JOBMANAGER
    script = "jobmanager.sh"

    @property
    def ports(self) -> list[int]:
        local = self.cfg.platform.flink.local
        return [local.rest_port, local.rpc_port]

    def ready(self) -> bool:
        try:
            self.rest.check()
        except FlinkRestError:
            return False
        return True


class FlinkTaskManager(FlinkProcess):
    """TaskManager `index` (1, 2, ...); its ports are picked by the OS, its resource id names it to the
    JobManager, which is how readiness is seen."""

    script = "taskmanager.sh"

    def __init__(self, cfg: ProjectConfig, index: int):
        self.name = f"{TASKMANAGER}{index}"
        super().__init__(cfg)
        self.resource_id = f"featurectl-tm-{index}"

    @property
    def ports(self) -> list[int]:
        return []

    @property
    def address(self) -> str:
        return f"{HOST}, JobManager {HOST}:{self.cfg.platform.flink.local.rpc_port}"

    def arguments(self) -> list[str]:
        return ["-D", f"taskmanager.resource-id={self.resource_id}"]

    def ready(self) -> bool:
        try:
            return any(tm["id"] == self.resource_id for tm in self.rest.taskmanagers())
        except FlinkRestError:
            return False


def flink_services(cfg: ProjectConfig, taskmanagers: Optional[int] = None) -> list[LocalService]:
    """The JobManager, then TaskManagers 1..`taskmanagers`, or, when None, every one with a folder (to see or stop
    what an earlier `up` started)."""
    if taskmanagers is None:
        found = [p.name.removeprefix(TASKMANAGER) for p in cfg.state_dir.glob(f"{TASKMANAGER}*")]
        indices = sorted(int(i) for i in found if i.isdigit())
    else:
        indices = list(range(1, taskmanagers + 1))
    return [FlinkJobManager(cfg), *(FlinkTaskManager(cfg, i) for i in indices)]
