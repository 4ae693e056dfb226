"""Local HDFS: Hadoop's MiniDFSCluster (a NameNode and a DataNode in one JVM), for `hdfs://` shared storage on
one machine.

Run by the MiniDFSClusterManager of hadoop-hdfs's test jar, from the jars `scripts/setup.sh` fetches into the
`hdfs` jar folder. The NameNode answers RPC on `platform.hdfs.local_port` (hdfs://127.0.0.1:PORT, what Flink
opens) and HTTP on `local_http_port` (WebHDFS, what featurectl uses); the DataNode's ports are picked free.
Every address is bound to 127.0.0.1. Blocks and the NameNode's image live under `<state_dir>/hdfs/data/`,
formatted on the first start and kept across restarts.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

from common.flink import jar_dir
from featurectl.services.process import HOST, LocalService, LocalServiceError, require_java, spawn

SERVER_JAR_GLOB = "hadoop-hdfs-*-tests.jar"
MAIN = "org.apache.hadoop.test.MiniDFSClusterManager"
# every server address on loopback (MiniDFSCluster binds the NameNode there already; the DataNode's defaults
# are 0.0.0.0), no permission checks (a one-user scratch filesystem) and one replica (one DataNode)
SETTINGS = {
    "dfs.datanode.address": f"{HOST}:0",
    "dfs.datanode.http.address": f"{HOST}:0",
    "dfs.datanode.ipc.address": f"{HOST}:0",
    "dfs.datanode.https.address": f"{HOST}:0",
    "dfs.namenode.https-address": f"{HOST}:0",
    "dfs.namenode.secondary.http-address": f"{HOST}:0",
    "dfs.namenode.secondary.https-address": f"{HOST}:0",
    "dfs.permissions.enabled": "false",
    "dfs.replication": "1",
}


class HdfsServer(LocalService):
    name = "hdfs"
    ready_timeout_s = 120.0

    @property
    def data(self):
        return self.dir / "data"

    @property
    def marker(self) -> str:
        return str(self.data)

    @property
    def ports(self) -> list[int]:
        return [self.cfg.platform.hdfs.local_port, self.cfg.platform.hdfs.local_http_port]

    @property
    def uri(self) -> str:
        """What Flink and `platform.shared_storage` / `data_storage` name the filesystem by."""
        return f"hdfs://{HOST}:{self.ports[0]}"

    @property
    def webhdfs(self) -> str:
        """What `platform.hdfs.webhdfs` is for this server."""
        return f"http://{HOST}:{self.ports[1]}"

    def check_installed(self) -> None:
        require_java("HDFS needs Java 17")
        if not list(jar_dir("hdfs").glob(SERVER_JAR_GLOB)):
            raise LocalServiceError(f"no {SERVER_JAR_GLOB} in {jar_dir('hdfs')}: run scripts/setup.sh")

    def start(self) -> subprocess.Popen:
        fresh = not any(self.data.glob("name-*/current/VERSION"))  # no NameNode image yet
        self.data.mkdir(parents=True, exist_ok=True)
        settings = {**SETTINGS, "hdfs.minidfs.basedir": str(self.data)}
        # Jersey's JAXB (WebHDFS's answers) defines classes by reflection, which Java 17 allows only when opened
        argv = ["java", "-Xmx512m", "--add-opens", "java.base/java.lang=ALL-UNNAMED", "-cp", str(jar_dir("hdfs") / "*"),
                MAIN,
                "-nnport", str(self.ports[0]), "-httpport", str(self.ports[1]), "-datanodes", "1",
                *(["-format"] if fresh else []),
                *(arg for key, value in settings.items() for arg in ("-D", f"{key}={value}"))]
        return spawn(argv, self.log_file, self.pid_file)

    def ready(self) -> bool:
        """The NameNode answers over HTTP and counts a live DataNode (before that, writes fail)."""
        query = f"{self.webhdfs}/jmx?qry=Hadoop:service=NameNode,name=FSNamesystemState"
        try:
            with urllib.request.urlopen(query, timeout=2) as answer:
                beans = json.load(answer).get("beans") or [{}]
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return beans[0].get("NumLiveDataNodes", 0) >= 1
