"""Fixtures shared by every suite. Integration tests use the real local services that `featurectl` starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from featurectl.config import ProjectConfig, load_config

ROOT = Path(__file__).resolve().parent.parent


def featurectl(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the CLI of the interpreter running pytest (the project's venv), from the repo root."""
    return subprocess.run([sys.executable, "-m", "featurectl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def run_featurectl():
    """`featurectl` as a subprocess: `run_featurectl("services", "status", env=...)`."""
    return featurectl


@pytest.fixture(scope="session")
def local_services() -> ProjectConfig:
    """Redis, Kafka and PostgreSQL up (started if needed, never stopped here: scripts/test.sh or CI stops them)."""
    done = featurectl("services", "up", "--postgres")
    if done.returncode != 0:
        pytest.fail(f"`featurectl services up --postgres` failed (exit {done.returncode}):\n"
                    f"{done.stdout}{done.stderr}")
    return load_config(ROOT / "feature_repo")
