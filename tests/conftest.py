"""Fixtures shared by every suite. Integration tests use the real local services that `featurectl` starts."""

from __future__ import annotations

import pytest

from cli_helpers import ROOT, featurectl
from common.config import ProjectConfig, load_config


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
