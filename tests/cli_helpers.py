"""What several suites share outside fixtures: the repo root, the CLI as a subprocess, stopping a server.

Tests import this module, never `conftest` (two conftest files make `import conftest` ambiguous).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def featurectl(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the CLI of the interpreter running pytest (the project's venv), from the repo root."""
    return subprocess.run([sys.executable, "-m", "featurectl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def stop_process(process: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `grace_s`: how every test stops the server it started."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
