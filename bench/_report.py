"""The benchmark line of DESIGN.md: {"bench", "machine", "ours", "peer", "ratio", "params"}."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable

# Metrics where a smaller number is better: their ratio is peer / ours; for every other metric it is ours / peer.
LOWER_IS_BETTER_SUFFIXES = ("_ms", "_us", "_s", "_mb", "_errors", "errors", "_pct")


def _lower_is_better(metric: str) -> bool:
    return metric.endswith(LOWER_IS_BETTER_SUFFIXES) and not metric.endswith("_per_s")


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    """For each metric both sides have, a number above 1 when we are better."""
    out: dict[str, float] = {}
    for metric, mine in ours.items():
        theirs = peer.get(metric)
        if not isinstance(mine, (int, float)) or not isinstance(theirs, (int, float)):
            continue
        num, den = (theirs, mine) if _lower_is_better(metric) else (mine, theirs)
        if den:
            out[metric] = round(num / den, 3)
    return out


def machine() -> str:
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus"


def emit(name: str, ours: dict[str, Any], peer: dict[str, Any], params: dict[str, Any],
         results_dir: Path | None = None, card: str | None = None) -> dict[str, Any]:
    """Print the benchmark line last; GPU benchmarks also write it under `bench/results/`."""
    line = {"bench": name, "machine": card or machine(), "ours": ours, "peer": peer,
            "ratio": ratios(ours, peer), "params": params}
    if results_dir is not None and card:
        results_dir.mkdir(parents=True, exist_ok=True)
        slug = card.replace(" ", "_")
        (results_dir / f"{name}-{slug}-{dt.date.today().isoformat()}.json").write_text(json.dumps(line, indent=1))
    print(json.dumps(line), flush=True)
    return line


def percentiles(samples: Iterable[float], points: tuple[float, ...] = (50, 90, 99, 99.9)) -> dict[str, float]:
    import numpy as np

    arr = np.asarray(list(samples), dtype=float)
    if arr.size == 0:
        return {f"p{p:g}": float("nan") for p in points}
    return {f"p{p:g}": float(np.percentile(arr, p)) for p in points}
