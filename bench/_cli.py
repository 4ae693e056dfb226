"""The benchmarks drive featurectl as a user does: its CLI, in a subprocess of the same interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]


def featurectl(repo: Path, *args: str) -> str:
    """`featurectl --repo REPO ARGS...`; its output, or a ClickException with the end of its error output."""
    done = subprocess.run([sys.executable, "-m", "featurectl", "--repo", str(repo), *args], capture_output=True,
                          text=True, cwd=ROOT)
    if done.returncode:
        raise click.ClickException(f"featurectl {' '.join(args)} failed:\n{(done.stdout + done.stderr)[-2000:]}")
    return done.stdout
