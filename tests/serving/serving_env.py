"""Helpers of the serving tests: a private feature repo, private redis-servers (single or a 3-node cluster)
started on free ports and stopped by pid, Feast's own writes, and our server as a subprocess."""

from __future__ import annotations

import contextlib
import json
import datetime as dt
import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from cli_helpers import cli_server, copy_example_repo, free_port, register_repo, stop_process


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(100):
        port = random.randint(20000, 45000)
        with contextlib.suppress(OSError), socket.socket() as first, socket.socket() as bus:
            first.bind(("127.0.0.1", port))
            bus.bind(("127.0.0.1", port + 10000))
            return port
    raise RuntimeError("no free port pair for a redis cluster node")


def make_repo(folder: Path, project: str, connection_string: str, redis_type: str = "redis"):
    """The example repo's definitions under `project`, registered in a SQLite registry; returns (repo, store)."""
    repo = copy_example_repo(folder, project, {"path": f"sqlite:///{folder / project}.db"},
                             {"type": "redis", "redis_type": redis_type, "connection_string": connection_string})
    return repo, register_repo(repo)


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
    """A redis-server of the test's own, on its own port and folder; stopped (or frozen) by its pid."""

    def __init__(self, folder: Path, port: Optional[int] = None, cluster: bool = False):
        self.port = port or (_free_cluster_port() if cluster else free_port())
        self.folder = folder / f"redis-{self.port}"
        self.folder.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.folder)]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", str(self.folder / "nodes.conf")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_ping(self.port)
        except RuntimeError:
            self.stop()
            raise

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            stop_process(self.process, 10)


@contextlib.contextmanager
def redis_cluster(folder: Path, nodes: int = 3) -> Iterator[list[RedisServer]]:
    """Three cluster-enabled redis-servers joined with `redis-cli --cluster create`, masters only."""
    servers: list[RedisServer] = []
    try:
        for _ in range(nodes):
            servers.append(RedisServer(folder, cluster=True))
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in servers),
                        "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while b"cluster_state:ok" not in subprocess.run(
                ["redis-cli", "-p", str(servers[0].port), "cluster", "info"], capture_output=True).stdout:
            if time.monotonic() > deadline:
                raise RuntimeError("the test redis cluster did not reach cluster_state:ok in 30s")
            time.sleep(0.2)
        yield servers
    finally:
        for server in servers:
            server.stop()


def feast_rows(store, view_name: str, values: dict[str, dict], event_time: Optional[dt.datetime] = None):
    """Write rows with Feast's own `write_to_online_store`: `values` maps asset_id -> {feature: value}."""
    import pandas as pd

    view = store.get_feature_view(view_name)
    when = event_time or dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    frame = pd.DataFrame({"asset_id": list(values), "event_timestamp": [when] * len(values),
                          **{f.name: [row.get(f.name) for row in values.values()] for f in view.features}})
    store.write_to_online_store(view_name, frame)


@contextlib.contextmanager
def feature_server(repo: Path, port: int, *args: str) -> Iterator[str]:
    """`featurectl serve` on `port` until the block ends, its output in `server-PORT.log` beside the repo; yields
    its base URL once /health answers."""
    with cli_server(repo, "serve", *args, port=port, ready_s=120, log=repo.parent / f"server-{port}.log") as server:
        yield server.url


def post(url: str, body, path: str = "/get-online-features") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
