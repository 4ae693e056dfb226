"""One question, two sides, one run: the open-loop load (`bench/_http_load.py`, its own process) in segments that
alternate first side, second, second, first (repeated), so that a drift of the host's load weighs on both alike.

Each side's percentiles are taken over the latencies of all its segments, and the medians of its segments' p50s
and p99s are reported too: a burst of the host's other work that spans a segment or two moves the first, hardly
the second. With the server's CPU (its workers included) over the side's segments, per request answered. The
sides may be two services of one server (the same port and pid) or two servers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import click
import numpy as np

from bench._cpu import process_cpu_s
from bench._http_load import sequential
from bench._report import percentiles
from bench._serve_env import open_loop

MEDIAN_P50, MEDIAN_P99 = "http_load_segment_p50_median_ms", "http_load_segment_p99_median_ms"


@dataclass(frozen=True)
class Side:
    """Where one side's load goes: the server's port and pid, and its file of request bodies (a JSON list)."""

    port: int
    pid: int
    bodies: Path

    def warm_up(self, requests: int) -> None:
        bodies = [json.dumps(body).encode() for body in json.loads(self.bodies.read_text())]
        sequential("127.0.0.1", self.port, bodies, requests)


def alternate(sides: dict[str, Side], rate: float, seconds: float, segments: int, scratch: Path,
              what: str) -> dict[str, dict]:
    """`seconds` of load at `rate` per side in `segments` segments in all (even); per side its latencies, each
    segment's p50 and p99, counts and CPU seconds. `what` names the sides in the progress lines."""
    first, second = sides
    out = {name: {"latencies": [], "p50s": [], "p99s": [], "ok": 0, "errors": 0, "cpu_s": 0.0, "seconds": 0.0}
           for name in sides}
    each = seconds / (segments / 2)
    for i in range(segments):
        name = first if i % 4 in (0, 3) else second
        side, samples = sides[name], scratch / f"samples-{i}.json"
        cpu_before = process_cpu_s(side.pid)
        result = open_loop(side.port, side.bodies, rate, each, samples)
        tally = out[name]
        tally["cpu_s"] += process_cpu_s(side.pid) - cpu_before
        tally["latencies"] += json.loads(samples.read_text())
        tally["p50s"].append(result["p50_ms"])
        tally["p99s"].append(result["p99_ms"])
        tally["ok"] += result["ok"]
        tally["errors"] += result["errors"]
        tally["seconds"] += each
        click.echo(f"segment {i + 1}/{segments}, {what} {name}: {json.dumps(result)}", err=True)
    return out


def figures(side: dict) -> dict:
    """One side's benchmark figures from what `alternate` collected; the interquartile range of its segments' p99s
    is the yardstick of the host's noise that a difference of medians is read against."""
    marks = percentiles(side["latencies"])
    return {"http_load_rps": round(side["ok"] / side["seconds"], 1), "http_load_errors": side["errors"],
            "http_load_p50_ms": round(marks["p50"], 3), "http_load_p99_ms": round(marks["p99"], 3),
            "http_load_p999_ms": round(marks["p99.9"], 3),
            MEDIAN_P50: round(float(np.median(side["p50s"])), 3), MEDIAN_P99: round(float(np.median(side["p99s"])), 3),
            "http_load_segment_p99_iqr_ms": round(float(np.subtract(*np.percentile(side["p99s"], [75, 25]))), 3),
            "cpu_us_per_request": round(side["cpu_s"] / max(1, side["ok"]) * 1e6, 1)}


def differences(ours: dict, peer: dict) -> dict:
    """What the first side's figures add to the second's: p99 over all segments, segment medians, CPU."""
    return {"p99_delta_ms": round(ours["http_load_p99_ms"] - peer["http_load_p99_ms"], 3),
            "segment_p50_median_delta_ms": round(ours[MEDIAN_P50] - peer[MEDIAN_P50], 3),
            "segment_p99_median_delta_ms": round(ours[MEDIAN_P99] - peer[MEDIAN_P99], 3),
            "cpu_us_per_request_delta": round(ours["cpu_us_per_request"] - peer["cpu_us_per_request"], 1)}


def _even(ctx: click.Context, param: click.Parameter, segments: int) -> int:
    if segments % 2:
        raise click.BadParameter("give an even number of segments, half of them per side")
    return segments


def load_options(command: Callable) -> Callable:
    """`--rate`, `--load-seconds` (per side) and `--segments` of a benchmark's `alternate` call."""
    options = [click.option("--rate", default=2000.0, show_default=True, help="requests/s of the load"),
               click.option("--load-seconds", default=30.0, show_default=True, help="seconds of load per side"),
               click.option("--segments", default=12, show_default=True, type=click.IntRange(2, 40), callback=_even,
                            help="load segments in all, alternating first side, second, second, first, ... (even): "
                                 "short ones spread the host's bursts over both sides")]
    for option in reversed(options):
        command = option(command)
    return command
