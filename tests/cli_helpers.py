"""What several suites share outside fixtures: the repo root and the CLI as a subprocess.

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
