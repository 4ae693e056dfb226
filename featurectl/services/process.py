"""What every local service shares: pid files, detached start, readiness waits, and stopping only our own pids.

A pid alone is not proof: pids are reused. A process counts as ours only while its command line still holds
the service's marker (a path under our state folder where the program allows it), so `down` never signals a
stranger that happens to have inherited an old pid.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable, ClassVar, Optional

from common.config import ProjectConfig
from common.errors import FeaturectlError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"


class LocalServiceError(FeaturectlError):
    """A local service cannot start or stop; the message names the missing piece and what to do."""


def command_line(pid: int) -> Optional[str]:
    """The process's command line, or None when it is gone (a zombie has an empty one)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or None


def is_ours(pid: int, marker: str) -> bool:
    cmd = command_line(pid)
    return cmd is not None and marker in cmd


def read_pid(pid_file: Path, marker: str) -> Optional[int]:
    """The pid in `pid_file` if that process still runs our program; a stale file is removed."""
    try:
        first = pid_file.read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None
    if first.isdigit() and is_ours(int(first), marker):
        return int(first)
    logger.info("removing stale pid file %s (pid %r is not running %s)", pid_file, first, marker)
    pid_file.unlink(missing_ok=True)
    return None


def port_open(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def require_java(needs: str) -> None:
    """Refuse to start a JVM service when there is no `java` (`needs`: which Java the service needs)."""
    if shutil.which("java") is None:
        raise LocalServiceError(f"java not found on PATH: run scripts/setup.sh ({needs})")


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(f"    {line}" for line in text) or f"(empty log at {path})"


def spawn(argv: list[str], log_file: Path, pid_file: Path, env: Optional[dict[str, str]] = None) -> subprocess.Popen:
    """Start `argv` in its own session (so Ctrl-C in the shell does not reach it), output to `log_file`."""
    with log_file.open("w") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    pid_file.write_text(f"{proc.pid}\n")
    return proc


def wait_until(ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: float, what: str,
               log_file: Path) -> None:
    """Poll `ready` until it holds; fail early when the process died, with the log's tail either way."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise LocalServiceError(f"{what} exited during start-up; last lines of {log_file}:\n{log_tail(log_file)}")
        time.sleep(0.3)
    raise LocalServiceError(f"{what} did not answer within {timeout_s:.0f} s; last lines of {log_file}:\n"
                            f"{log_tail(log_file)}")


def stop_pid(pid: int, marker: str, sig: int, timeout_s: float) -> bool:
    """Send `sig`, wait up to `timeout_s`, then SIGKILL; True when SIGKILL was needed."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_ours(pid, marker):
            return False
        time.sleep(0.2)
    logger.warning("pid %d did not stop within %.0f s of signal %d: sending SIGKILL", pid, timeout_s, sig)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


class LocalService(ABC):
    """One service we start on 127.0.0.1 with its state in `<state_dir>/<name>/`."""

    name: ClassVar[str]
    ready_timeout_s: ClassVar[float] = 30.0
    stop_signal: ClassVar[int] = signal.SIGTERM
    stop_timeout_s: ClassVar[float] = 20.0

    def __init__(self, cfg: ProjectConfig):
        self.cfg = cfg
        self.dir = cfg.state_dir / self.name

    @property
    def pid_file(self) -> Path:
        return self.dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    @abstractmethod
    def marker(self) -> str:
        """A string found in our process's command line and in nobody else's."""

    @property
    @abstractmethod
    def ports(self) -> list[int]:
        """Ports we listen on; the first one is the service's address."""

    @property
    def address(self) -> str:
        return f"{HOST}:{self.ports[0]}"

    @abstractmethod
    def check_installed(self) -> None:
        """Raise LocalServiceError naming the missing program or jar."""

    @abstractmethod
    def start(self) -> Optional[subprocess.Popen]:
        """Launch the service; return the process when we are its parent."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether the service answers a real request."""

    def after_ready(self) -> None:
        """Provisioning that needs the service up (roles, databases); must be idempotent."""

    def pid(self) -> Optional[int]:
        return read_pid(self.pid_file, self.marker)

    def up(self) -> str:
        pid = self.pid()
        if pid is not None:
            wait_until(self.ready, lambda: self.pid() is not None, self.ready_timeout_s, self.name, self.log_file)
            self.after_ready()
            return f"{self.name}: already running (pid {pid}) on {self.address}"
        busy = [port for port in self.ports if port_open(port)]
        if busy:
            raise LocalServiceError(
                f"{self.name}: port {busy[0]} on {HOST} is in use by a process featurectl did not start: "
                f"stop it, or change the port in feature_store.yaml")
        self.check_installed()
        self.dir.mkdir(parents=True, exist_ok=True)
        proc = self.start()
        alive = (lambda: proc.poll() is None) if proc is not None else (lambda: self.pid() is not None)
        wait_until(self.ready, alive, self.ready_timeout_s, self.name, self.log_file)
        self.after_ready()
        return f"{self.name}: started (pid {self.pid()}) on {self.address}, log {self.log_file}"

    def down(self) -> str:
        pid = self.pid()
        if pid is None:
            return f"{self.name}: not running"
        killed = stop_pid(pid, self.marker, self.stop_signal, self.stop_timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return f"{self.name}: stopped (pid {pid}{', killed with SIGKILL' if killed else ''})"

    def status(self) -> str:
        pid = self.pid()
        state = "up" if pid is not None else "down"
        return f"{self.name:<19} {state:<5} pid {pid if pid is not None else '-':<8} {self.address}"
