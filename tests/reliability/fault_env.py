"""What the reliability tests share: private Redis, Kafka and PostgreSQL instances (their own free ports and
state folders, started and stopped through featurectl's own service classes, so faults never touch the shared
services), a streaming repo pointed at them, our HTTP servers as subprocesses, and readers of served values.

The streaming helpers that do not depend on ports (the stream subprocess, the oracle comparison) are the
streaming suite's own, loaded from `tests/streaming/stream_env.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import cli_helpers
from cli_helpers import copy_example_repo, featurectl, free_port, sibling
from common.config import ProjectConfig, load_config
from dsl.feature_view import FeatureView
from featurectl.services import KafkaBroker, PostgresServer, RedisServer
from featurectl.services.process import LocalService


stream_env = sibling("stream_env", "streaming")


SERVICES_YAML = """\
project: reliability_services
provider: local
registry:
  registry_type: sql
  path: sqlite:///{folder}/registry.db
online_store:
  type: redis
  connection_string: "127.0.0.1:{redis}"
offline_store:
  type: file
entity_key_serialization_version: 3
platform:
  state_dir: {folder}/state
  kafka:
    bootstrap_servers: "127.0.0.1:{kafka}"
    controller_port: {controller}
  postgres:
    port: {postgres}
    database: reliability
    user: reliability
"""


class PrivateServices:
    """Redis, Kafka and PostgreSQL of one test module, on free ports under `folder`; only what is asked for is
    started, and `down` stops exactly those (by their pid files, as `featurectl services down` does)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "feature_store.yaml").write_text(SERVICES_YAML.format(
            folder=folder, redis=free_port(), kafka=free_port(), controller=free_port(), postgres=free_port()))
        self.config: ProjectConfig = load_config(folder)
        self.redis: LocalService = RedisServer(self.config)
        self.kafka: LocalService = KafkaBroker(self.config)
        self.postgres: LocalService = PostgresServer(self.config)

    @property
    def redis_port(self) -> int:
        return self.redis.ports[0]

    @property
    def bootstrap(self) -> str:
        return self.kafka.address

    def kill(self, service: LocalService) -> None:
        """SIGKILL: no shutdown hook runs, as when a machine loses a process."""
        pid = service.pid()
        assert pid is not None, f"the private {service.name} is not running"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while service.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.pid() is None, f"the private {service.name} (pid {pid}) outlived SIGKILL"

    def down(self) -> None:
        for service in (self.postgres, self.kafka, self.redis):
            if service.pid() is not None:
                service.down()


def stream_repo(folder: Path, services: PrivateServices, views: tuple[str, ...]):
    """The example views on a topic of their own, against the private Redis and Kafka, registered (for the
    feature server); returns a `stream_env.StreamRepo` (its `cleanup` is for shared services and not needed)."""
    repo = stream_env.StreamRepo.create(folder, views, services.redis_port, services.bootstrap, "reliability")
    applied = featurectl("--repo", str(folder), "apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return repo


def example_repo(folder: Path, project: str, registry: dict, redis_port: int) -> Path:
    """The example repo's definitions under `project`, registry settings `registry` (Feast's, merged), values in
    the Redis on `redis_port`, applied."""
    repo = copy_example_repo(folder, project, registry,
                             {"type": "redis", "connection_string": f"127.0.0.1:{redis_port}"})
    applied = featurectl("--repo", str(repo), "apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return repo


def wait_exact(port: int, project: str, view: FeatureView, on_time: list[dict], timeout_s: float = 60.0) -> list:
    """Until Redis holds the oracle's values for every entity of `on_time` (the writer may still be rewriting);
    returns the mismatches left at the deadline (empty: exact)."""
    keys = sorted({e["asset_id"] for e in on_time})
    want = stream_env.expected(view, on_time)
    deadline = time.monotonic() + timeout_s
    while True:
        wrong = stream_env.mismatches(want, stream_env.served(project, view, keys, port), view.feature_names)
        if not wrong or time.monotonic() > deadline:
            return wrong
        time.sleep(0.5)


def http(method: str, url: str, body: Optional[dict] = None, timeout: float = 5.0) -> tuple[int, dict]:
    """(status, JSON body) of one request; a refused connection is status 0."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}


@contextlib.contextmanager
def cli_server(repo: Path, command: str, *args: str) -> Iterator[str]:
    """`featurectl COMMAND --port P ARGS` on a free port until the block ends; yields its base URL once /health
    answers."""
    with cli_helpers.cli_server(repo, command, *args) as server:
        yield server.url


def feature_server(repo: Path, *args: str) -> contextlib.AbstractContextManager[str]:
    """`featurectl serve` on a free port (see `cli_server`)."""
    return cli_server(repo, "serve", *args)
