"""`featurectl bench feature_log`: what feature logging costs the server, logging on and off in one run.

One `featurectl serve` serves two feature services of the same 20 features over the same assets, one with
`logging=FeatureLogging(sample_rate=1.0)` and one without. The open-loop load (`bench/_http_load.py`, its own
process) sends `--rate` requests/s of one entity each, `--load-seconds` to each service, in segments that
alternate off, on, on, off (repeated), so that a drift of the host's load weighs on both sides alike; each side's
percentiles are taken over the latencies of all its segments, and the median of its segments' p99s is reported
too: a burst of the host's other work that spans a segment or two moves the first, hardly the second, which the
target is checked on. `ours` is logging on, `peer` logging off (so a ratio below 1 is what logging costs), with
the server's CPU per request answered on each side. Also reported: rows
logged, dropped because the queue was full, and written, counted from the files once the server has stopped (its
last flush); the logs go to a scratch data folder, removed after the run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import click
import numpy as np

from bench._cpu import process_cpu_s
from bench._http_load import sequential
from bench._report import emit, percentiles
from bench._serve_env import apply_repo, bench_repo, free_port, load_assets, open_loop, running_server

PROJECT = "logbench"
ATTRIBUTES = ["category", "style", "bbox_x", "polygon_count"]
DEFINITIONS = f"""
from dsl import FeatureLogging

_bench_features = [asset_activity, asset_attributes[{ATTRIBUTES!r}]]
bench_unlogged = FeatureService("bench_unlogged", features=_bench_features)
bench_logged = FeatureService("bench_logged", features=_bench_features, logging=FeatureLogging(sample_rate=1.0))
"""
SERVICES = {"off": "bench_unlogged", "on": "bench_logged"}
TARGET_P99_DELTA_MS = 0.2


def _bodies(scratch: Path, assets: int, rng: np.random.Generator) -> dict[str, Path]:
    """Per side, a file of 2,000 one-entity requests to its service (the same entities on both sides)."""
    ids = [f"asset_{i:06d}" for i in rng.integers(0, assets, 2000)]
    files = {}
    for side, service in SERVICES.items():
        files[side] = scratch / f"bodies-{side}.json"
        files[side].write_text(json.dumps([{"feature_service": service, "entities": {"asset_id": [i]}} for i in ids]))
    return files


def _segments(port: int, pid: int, bodies: dict[str, Path], rate: float, seconds: float, segments: int,
              scratch: Path) -> dict[str, dict]:
    """The load, side by side: off, on, on, off, ...; per side its latencies, counts and CPU seconds."""
    sides = {side: {"latencies": [], "p99s": [], "ok": 0, "errors": 0, "cpu_s": 0.0, "seconds": 0.0}
             for side in SERVICES}
    each = seconds / (segments / 2)
    for i in range(segments):
        side = "off" if i % 4 in (0, 3) else "on"
        samples = scratch / f"samples-{i}.json"
        cpu_before = process_cpu_s(pid)
        result = open_loop(port, bodies[side], rate, each, samples)
        out = sides[side]
        out["cpu_s"] += process_cpu_s(pid) - cpu_before
        out["latencies"] += json.loads(samples.read_text())
        out["p99s"].append(result["p99_ms"])
        out["ok"] += result["ok"]
        out["errors"] += result["errors"]
        out["seconds"] += each
        click.echo(f"segment {i + 1}/{segments}, logging {side}: {json.dumps(result)}", err=True)
    return sides


def _figures(side: dict) -> dict:
    marks = percentiles(side["latencies"])
    return {"http_load_rps": round(side["ok"] / side["seconds"], 1), "http_load_errors": side["errors"],
            "http_load_p50_ms": round(marks["p50"], 3), "http_load_p99_ms": round(marks["p99"], 3),
            "http_load_p999_ms": round(marks["p99.9"], 3),
            "http_load_segment_p99_median_ms": round(float(np.median(side["p99s"])), 3),
            "cpu_us_per_request": round(side["cpu_s"] / max(1, side["ok"]) * 1e6, 1)}


def _written(folder: Path) -> tuple[int, int, int]:
    """Rows, files and bytes of the service's logs on disk."""
    import pyarrow.dataset as ds

    if not folder.exists():
        return 0, 0, 0
    dataset = ds.dataset(folder, format="parquet", partitioning="hive", ignore_prefixes=["."])
    return dataset.count_rows(), len(dataset.files), sum(Path(f).stat().st_size for f in dataset.files)


@click.command()
@click.option("--assets", default=10_000, show_default=True, help="assets written to Redis by Feast")
@click.option("--rate", default=2000.0, show_default=True, help="requests/s of the load")
@click.option("--load-seconds", default=30.0, show_default=True, help="seconds of load per side")
@click.option("--segments", default=12, show_default=True, type=click.IntRange(2, 40),
              help="load segments in all, alternating off, on, on, off, ... (even): short ones spread the host's "
                   "bursts over both sides")
@click.option("--workers", default=1, show_default=True, help="server worker processes")
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def command(ctx, assets: int, rate: float, load_seconds: float, segments: int, workers: int, seed: int) -> None:
    """Feature logging: the server's tail latency with logging on (sample rate 1.0) against off, same run."""
    if segments % 2:
        raise click.BadParameter("give an even number of segments, half of them per side", param_hint="--segments")
    cfg = ctx.config()
    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="bench-feature-log-") as scratch_dir:
        scratch = Path(scratch_dir)
        repo = bench_repo(cfg.state_dir / "bench-feature-log", PROJECT, DEFINITIONS,
                          platform={"data_dir": str(scratch / "data")})
        load_assets(apply_repo(repo), assets, seed)
        bodies = _bodies(scratch, assets, rng)
        port = free_port()
        command_line = [sys.executable, "-m", "featurectl", "--repo", str(repo), "serve", "--port", str(port),
                        "--workers", str(workers)]
        with running_server(command_line, port, scratch / "server.log") as pid:
            for side in SERVICES:  # warm-up, both services
                sequential("127.0.0.1", port, [b.encode() for b in _request_bodies(bodies[side])], 500)
            sides = _segments(port, pid, bodies, rate, load_seconds, segments, scratch)
            time.sleep(1.1)  # workers share their counters every second
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
                counts = json.loads(reply.read())["feature_log"].get(SERVICES["on"], {})
        rows, files, size = _written(scratch / "data" / "feature_logs" / SERVICES["on"])
    ours, peer = _figures(sides["on"]), _figures(sides["off"])
    median = "http_load_segment_p99_median_ms"
    ours.update({"p99_delta_ms": round(ours["http_load_p99_ms"] - peer["http_load_p99_ms"], 3),
                 "segment_p99_median_delta_ms": round(ours[median] - peer[median], 3),
                 "logged_rows": counts.get("logged", 0), "dropped_rows": counts.get("dropped", 0),
                 "written_rows": rows, "log_files": files, "log_bytes": size})
    met = {f"segment_p99_median_delta_ms<={TARGET_P99_DELTA_MS}":
           ours["segment_p99_median_delta_ms"] <= TARGET_P99_DELTA_MS,
           "dropped_rows==0": ours["dropped_rows"] == 0, "written_rows==logged_rows": rows == ours["logged_rows"],
           "http_load_errors==0": ours["http_load_errors"] == peer["http_load_errors"] == 0}
    emit("feature_log", ours, peer, {"assets": assets, "features": 20, "load_rate": rate,
                                     "load_seconds_per_side": load_seconds, "segments": segments,
                                     "server_workers": workers, "warmup_requests_per_side": 500,
                                     "cpus": os.cpu_count(),
                                     "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                     "targets_met": met})


def _request_bodies(path: Path) -> list[str]:
    return [json.dumps(body) for body in json.loads(path.read_text())]
