"""Local Redis: the online store, at the address Feast's `online_store.connection_string` names."""

from __future__ import annotations

import shutil
import subprocess

from featurectl.services.process import HOST, LocalService, LocalServiceError, spawn


class RedisServer(LocalService):
    """A detached `redis-server` without persistence: the online store is rebuilt by materialization."""

    name = "redis"
    ready_timeout_s = 15.0

    @property
    def marker(self) -> str:
        # redis-server rewrites its command line to "redis-server HOST:PORT".
        return f"redis-server {self.address}"

    @property
    def ports(self) -> list[int]:
        return [self.cfg.redis_host_port[1]]

    def check_installed(self) -> None:
        if shutil.which("redis-server") is None:
            raise LocalServiceError("redis-server not found on PATH: run scripts/setup.sh")

    def start(self) -> subprocess.Popen:
        argv = ["redis-server", "--bind", HOST, "--port", str(self.ports[0]), "--protected-mode", "yes",
                "--daemonize", "no", "--dir", str(self.dir), "--save", "", "--appendonly", "no",
                "--logfile", ""]
        return spawn(argv, self.log_file, self.pid_file)

    def ready(self) -> bool:
        import redis

        try:
            with redis.Redis(host=HOST, port=self.ports[0], socket_timeout=1) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False
