"""Redis servers of a run's own, for tests and benchmarks: one node, or a cluster (masters, optionally with
replicas), started on free ports of 127.0.0.1 in a folder of the caller's and stopped (or frozen, or killed) by
pid. Unlike `featurectl services`, nothing here outlives the process that started it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `grace_s`."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(100):
        port = random.randint(20000, 45000)
        with contextlib.suppress(OSError), socket.socket() as first, socket.socket() as bus:
            first.bind(("127.0.0.1", port))
            bus.bind(("127.0.0.1", port + 10000))
            return port
    raise RuntimeError("no free port pair for a redis cluster node")


def _wait_for_ping(port: int, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer PING within {timeout_s}s")


class RedisServer:
    """A redis-server of the caller's own, on its own port and folder; stopped (or frozen) by its pid."""

    def __init__(self, folder: Path, port: Optional[int] = None, cluster: bool = False, extra: Sequence[str] = ()):
        self.port = port or (_free_cluster_port() if cluster else free_port())
        self.folder = folder / f"redis-{self.port}"
        self.folder.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.folder), *extra]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(self.folder / "nodes.conf")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_ping(self.port)
        except RuntimeError:
            self.stop()
            raise

    def cli(self, *args: str) -> str:
        """`redis-cli -p PORT ARGS`'s output."""
        return subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True,
                              timeout=10).stdout

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the process dies at once, as in a crash."""
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            stop_process(self.process, 10)


def _wait_until(check, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the scratch redis cluster: {what} within {timeout_s:g}s")
        time.sleep(0.2)


@contextlib.contextmanager
def redis_cluster(folder: Path, nodes: int = 3, replicas: int = 0,
                  node_timeout_ms: Optional[int] = None) -> Iterator[list[RedisServer]]:
    """`nodes` cluster-enabled masters, each with `replicas` replicas, joined with
    `redis-cli --cluster create`; a short `node_timeout_ms` makes a replica take over from a dead master fast."""
    servers: list[RedisServer] = []
    extra = ("--cluster-node-timeout", str(node_timeout_ms)) if node_timeout_ms else ()
    try:
        for _ in range(nodes * (1 + replicas)):
            servers.append(RedisServer(folder, cluster=True, extra=extra))
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
                        "--cluster-replicas", str(replicas), "--cluster-yes"], check=True, capture_output=True,
                       timeout=60)
        _wait_until(lambda: all("cluster_state:ok" in s.cli("cluster", "info") for s in servers),
                    "every node did not reach cluster_state:ok")
        _wait_until(lambda: all("master_link_status:up" in s.cli("info", "replication")
                                for s in servers if "role:slave" in s.cli("info", "replication")),
                    "the replicas did not sync with their masters")
        yield servers
    finally:
        for server in servers:
            server.stop()


def master_with_replica(servers: Sequence[RedisServer]) -> tuple[RedisServer, RedisServer]:
    """A master of the cluster and its replica."""
    by_port = {s.port: s for s in servers}
    for server in servers:
        info = dict(line.split(":", 1) for line in server.cli("info", "replication").split() if ":" in line)
        if info.get("role") == "slave":
            return by_port[int(info["master_port"])], server
    raise RuntimeError("the scratch redis cluster has no replica")
