"""Local Milvus server: the vector index on a real server (HNSW), for `platform.vectors.uri` on one machine.

The `milvus` package (PyPI) carries a full Milvus 2.3 standalone (embedded etcd, RocksMQ, local storage) as one
compressed binary; we unpack it once per package version into the user's cache (no download), write its config under
`<state_dir>/milvus/` and run it detached like the other services, through a link in that folder (our marker). It takes
`platform.vectors.local_port` for its gRPC and REST API and the 11 ports after it for its inner services (etcd,
coordinators, nodes, health). Milvus 2.3 listens on every interface for those gRPC ports (only etcd takes an address):
keep the host behind a firewall, or use a managed Milvus for anything shared. Rows still in a growing segment are
searched by brute force (the interim index, whose fixed nprobe costs recall, is off); `VectorIndex.seal` flushes after a
bulk load so the rows get the HNSW index.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from common.config import ProjectConfig
from featurectl.services.process import HOST, LocalService, LocalServiceError, port_open, spawn

# Milvus's config keys of its inner ports, in the order they follow `local_port`.
INNER_PORTS = ("proxy_internal_port", "root_coord_port", "query_coord_port", "query_node_port", "index_coord_port",
               "index_node_port", "data_coord_port", "data_node_port", "etcd_port")
PRIVATE_PORTS_FROM = 20000  # scratch servers' ports: above the usual fixed ones, below the ephemeral range
COMPONENTS = ("rootCoord", "proxy", "queryCoord", "queryNode", "indexCoord", "indexNode", "dataCoord", "dataNode")


def local_milvus_uri(port: int) -> str:
    return f"http://{HOST}:{port}"


class MilvusServer(LocalService):
    name = "milvus"
    ready_timeout_s = 120.0  # start-up takes 8 to 20 s on a quiet 2-core host, far longer on a busy one
    # Milvus 2.3 standalone stops its coordinators first, then its nodes hang retrying them (minutes); flushed
    # segments are on disk and the rest replays from RocksMQ's log at the next start, so after 1 s it is killed,
    # as the `milvus` package's own `stop` does.
    stop_timeout_s = 1.0

    def __init__(self, cfg: ProjectConfig, access_log: bool = False):
        """`access_log`: write a line per request with the time its handler took (`access_log_file`), unbuffered,
        for benchmarks that split a search's time (`bench._milvus_access_log`); off for everyday use."""
        super().__init__(cfg)
        self.access_log = access_log

    @property
    def access_log_file(self) -> Path:
        return self.dir / "access.log"

    @property
    def binary(self) -> Path:
        """A link to the unpacked binary: the command line names it, so it marks this service's process."""
        return self.dir / "milvus"

    @property
    def marker(self) -> str:
        return str(self.binary)

    @property
    def ports(self) -> list[int]:
        first = self.cfg.platform.vectors.local_port
        return list(range(first, first + 12))

    @property
    def uri(self) -> str:
        return local_milvus_uri(self.ports[0])

    @property
    def metrics_url(self) -> str:
        """Its Prometheus metrics (Milvus serves them beside `/healthz`, on the port given as METRICS_PORT)."""
        return f"http://{HOST}:{self.ports[10]}/metrics"

    def check_installed(self) -> None:
        if importlib.util.find_spec("milvus") is None:
            raise LocalServiceError("the `milvus` package (Milvus standalone server) is not installed: run "
                                    "scripts/setup.sh, or pip install 'milvus>=2.3.5,<2.4'")

    def start(self) -> subprocess.Popen:
        from milvus import MilvusServerConfig

        (proxy, *inner), health, etcd_peer = self.ports[:10], self.ports[10], self.ports[11]
        template = MilvusServerConfig(data_dir=str(self.dir))
        for key, port in [("proxy_port", proxy), *zip(INNER_PORTS, inner)]:
            template.set(key, port)
        template.resolve_storage()
        template.write_config()  # the package's template with our ports and folders filled in
        config_file = self.dir / "configs" / "milvus.yaml"
        settings = yaml.safe_load(config_file.read_text())
        etcd_config = self.dir / "configs" / "etcd.yaml"
        etcd_config.write_text(yaml.safe_dump(_etcd(inner[-1], etcd_peer, self.dir / "data" / "etcd.data")))
        _set(settings, "etcd.config.path", str(etcd_config))
        _set(settings, "etcd.endpoints", f"{HOST}:{inner[-1]}")
        _set(settings, "queryNode.segcore.interimIndex.enableIndex", False)
        _set(settings, "queryCoord.checkHandoffInterval", 1000)  # ms; sealed segments are served indexed sooner
        for component in COMPONENTS:
            _set(settings, f"{component}.ip", HOST)
        if self.access_log:
            for key, value in [("enable", True), ("localPath", str(self.dir)), ("filename", self.access_log_file.name),
                               ("cacheSize", 0)]:
                _set(settings, f"proxy.accessLog.{key}", value)
        config_file.write_text(yaml.safe_dump(settings, sort_keys=False))
        programs = unpacked()
        self.binary.unlink(missing_ok=True)
        self.binary.symlink_to(programs / "milvus")
        env = {**os.environ, "DEPLOY_MODE": "STANDALONE", "METRICS_PORT": str(health),
               "MILVUS_RUN_DIR": str(self.dir / "run"), "MILVUSCONF": str(config_file.parent),
               "LD_LIBRARY_PATH": ":".join(filter(None, [str(programs), os.environ.get("LD_LIBRARY_PATH")]))}
        return spawn([str(self.binary), "run", "standalone"], self.log_file, self.pid_file, env=env)

    def up(self) -> str:
        """Start it, once more if the first start-up crashes: Milvus 2.3 has been seen to panic while wiring its
        index node (`NewIndexNode`), a fault of that start only; a second crash is reported with the log's tail."""
        try:
            return super().up()
        except LocalServiceError as first:
            if "exited during start-up" not in str(first):
                raise
            self.down()
            return super().up() + " (second start: the first crashed, see the log)"

    def down(self) -> str:
        """Stop it, then wait (up to 10 s) until its ports are closed: a killed Milvus takes a moment to die, and an
        `up` right after would find them taken."""
        said = super().down()
        deadline = time.monotonic() + 10.0
        while any(port_open(port) for port in self.ports) and time.monotonic() < deadline:
            time.sleep(0.1)
        return said

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ports[10]}/healthz", timeout=1) as answer:
                return b"OK" in answer.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False


def unpacked() -> Path:
    """The folder of the `milvus` package's binary and libraries, unpacked once per package version into the user's
    cache (5 s of decompression); a lock keeps two starts from writing the same files."""
    import fcntl

    from milvus import __version__, _initialize_data_files

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "featurectl" / f"milvus-{__version__}"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "unpack.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _initialize_data_files(str(cache))  # skips files whose packed copy it already unpacked (by md5)
    return cache / "bin"


def _etcd(client_port: int, peer_port: int, data: Path) -> dict[str, Any]:
    """The embedded etcd's own config: it listens on the loopback, on our ports, not etcd's 2379 and 2380."""
    client, peer = f"http://{HOST}:{client_port}", f"http://{HOST}:{peer_port}"
    return {"name": "milvus", "data-dir": str(data), "listen-client-urls": client, "advertise-client-urls": client,
            "listen-peer-urls": peer, "initial-advertise-peer-urls": peer, "initial-cluster": f"milvus={peer}"}


def _set(settings: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        settings = settings.setdefault(part, {})
    settings[last] = value


def free_port_block(count: int = 12, attempts: int = 100) -> int:
    """The first of `count` consecutive ports free on the loopback now (for a scratch server: tests, benches),
    below the kernel's range of ephemeral ports: a port from that range can be taken by any outgoing connection,
    Milvus's own among them, between our check and its bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(attempts):
        first = random.randrange(PRIVATE_PORTS_FROM, low - count)
        if not any(port_open(port) for port in range(first, first + count)):
            return first
    raise LocalServiceError(f"found no {count} consecutive free ports on {HOST} in {attempts} tries")
