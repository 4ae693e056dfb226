"""Per search, the time a Milvus server took by its own access log, against the client's time for the same search.

Milvus's metrics (`bench._milvus_metrics`) count whole milliseconds into wide buckets and say nothing per request;
its access log (`proxy.accessLog`, on in the server `featurectl bench search` starts) writes one line per request
with the time its gRPC handler took, in microseconds. Read in order, the `Search` lines of a loop of sequential
searches pair one to one with the client's timings: the server's exact p99, and per search the time outside its
handler (our process, the gRPC transport both ways and the server's gRPC front door), whose tail says how much of
the client's p99 the server's handler does not explain. Only on a server that nobody else searches meanwhile.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# A line as Milvus 2.3 writes it: `... <user: addr> Search [status: OK] ... [timeCost: 1.234ms] ...`.
SEARCH_LINE = re.compile(r"> Search \[status: [^\]]*\].*?\[timeCost: ([0-9.]+)(ns|µs|us|ms|s)\]")
TO_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}


def log_size(path: Path) -> int:
    """Where the log ends now: read the searches of a loop from here."""
    return path.stat().st_size if path.exists() else 0


def search_times_ms(path: Path, since: int = 0) -> list[float]:
    """The time (ms) of each search the log records after byte `since`, in the order the server answered them."""
    with path.open("rb") as log:
        log.seek(since)
        text = log.read().decode("utf-8", errors="replace")
    return [float(value) * TO_MS[unit] for value, unit in SEARCH_LINE.findall(text)]


def split_figures(client_ms: list[float], server_ms: list[float]) -> dict:
    """The server's p50/p99 by its access log and the p50/p99 of the rest (client minus server per search); empty,
    with a warning, when the counts differ (someone else searched, or the log missed lines), as pairs would lie."""
    if len(client_ms) != len(server_ms) or not client_ms:
        logger.warning("the access log has %d searches for %d timed ones: no per-search split", len(server_ms),
                       len(client_ms))
        return {}
    server, outside = np.asarray(server_ms), np.asarray(client_ms) - np.asarray(server_ms)
    marks = {"server_log": server, "outside_server": outside}
    return {f"{name}_p{q}_ms": round(float(np.percentile(values, q)), 3)
            for name, values in marks.items() for q in (50, 99)}
