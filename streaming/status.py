"""The job's status file (`<state>/stream/<job>/status.json`): written by the running job, read by
`featurectl stream --status`, `featurectl status` and the feature server's freshness metrics. Written whole to a
temporary file and renamed, so a reader never sees half of it. Light on purpose (no Flink, no Kafka): readers
outside the stream import it."""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

STATUS_FILE = "status.json"


@dataclass(frozen=True)
class ViewLag:
    """What the stream writing a view says of it: its job, whether it runs, its event-to-Redis lag (last minute;
    None without samples) and the view's clock."""

    job: str
    running: bool
    state: str
    p50_ms: Optional[float]
    p99_ms: Optional[float]
    clock: Optional[str]


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


def stream_cutovers(state_dir: Path, project: str, sources: Mapping[str, str],
                    running: bool = False) -> dict[str, int]:
    """View -> the cutover (epoch ms) of its source in the streams of `project` that write it (with `running`,
    only those running now; the earliest when several do), for the views of `sources` (view -> source name): from
    there on the stream's values are the served ones, and before it no stream writes."""
    out: dict[str, int] = {}
    for home, status in read_statuses(state_dir):
        if status.get("project") != project or (running and not is_running(home)):
            continue
        cutovers = (status.get("generation") or {}).get("cutovers_ms") or {}
        for view in status.get("views") or {}:
            if view in sources and sources[view] in cutovers:
                out[view] = min(int(cutovers[sources[view]]), out.get(view, 2**63 - 1))
    return out


def is_running(home: Path) -> bool:
    """Whether a runner holds the job's lock right now."""
    path = home / "lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def view_lags(state_dir: Path, project: str) -> dict[str, ViewLag]:
    """Per view of `project` that a stream under `state_dir` writes or wrote: that stream's figures. A view in
    several jobs' files (streamed alone, then with others) takes a running job's, else the latest updated."""
    found: dict[str, tuple[tuple[bool, str], ViewLag]] = {}
    for home, status in read_statuses(state_dir):
        if status.get("project") != project:
            continue
        running = is_running(home)
        fresh = status.get("freshness") or {}
        state = status.get("state", "unknown") if running else f"not running (last state: {status.get('state')})"
        rank = (running, status.get("updated_at") or "")
        for view, figures in (status.get("views") or {}).items():
            if view in found and found[view][0] >= rank:
                continue
            lag = ViewLag(status.get("job", home.name), running, state, fresh.get("p50_ms") if running else None,
                          fresh.get("p99_ms") if running else None, figures.get("head_event_time"))
            found[view] = (rank, lag)
    return {view: lag for view, (_, lag) in found.items()}
