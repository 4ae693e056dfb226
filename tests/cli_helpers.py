"""What several suites share outside fixtures: the repo root, the CLI as a subprocess, a scratch copy of the
example repo, stopping a server.

Tests import this module, never `conftest` (two conftest files make `import conftest` ambiguous).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent


def featurectl(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the CLI of the interpreter running pytest (the project's venv), from the repo root."""
    return subprocess.run([sys.executable, "-m", "featurectl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def copy_example_repo(folder: Path, project: str, registry: dict, online_store: Optional[dict] = None,
                      data_dir: Optional[Path] = None) -> Path:
    """The example repo's definitions as `folder/project`, not applied. Its feature_store.yaml gets `project`, the
    `registry` settings merged in, `online_store` instead of its own when given, and its `platform` section with
    `data_dir` (or none at all: the defaults)."""
    repo = folder / project
    repo.mkdir(parents=True)
    shutil.copyfile(ROOT / "feature_repo" / "features.py", repo / "features.py")
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = project
    settings["registry"].update(registry)
    if online_store is not None:
        settings["online_store"] = online_store
    if data_dir is None:
        settings.pop("platform", None)
    else:
        settings["platform"]["data_dir"] = str(data_dir)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def stop_process(process: subprocess.Popen, grace_s: float = 20) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `grace_s`: how every test stops the server it started."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
