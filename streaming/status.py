"""The job's status file (`<state>/stream/<job>/status.json`): written by the running job, read by
`featurectl stream --status`. Written whole to a temporary file and renamed, so a reader never sees half of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

STATUS_FILE = "status.json"


def stream_root(state_dir: Path) -> Path:
    return state_dir / "stream"


def write_status(home: Path, status: dict) -> None:
    path = home / STATUS_FILE
    tmp = path.with_suffix(f".tmp.{os.getpid()}")
    tmp.write_text(json.dumps(status, indent=1, default=str))
    os.replace(tmp, path)


def read_statuses(state_dir: Path) -> list[tuple[Path, dict]]:
    """(job folder, status) of every job that ever ran under `state_dir`, by job name."""
    out = []
    for path in sorted(stream_root(state_dir).glob(f"*/{STATUS_FILE}")):
        try:
            out.append((path.parent, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue  # being replaced right now, or left half-written by a crash: skip it
    return out
