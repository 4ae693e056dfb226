"""`featurectl bench feature_log`: what feature logging costs the server, logging on and off in one run.

One `featurectl serve` serves two feature services of the same 20 features over the same assets, one with
`logging=FeatureLogging(sample_rate=1.0)` and one without. The open-loop load (`bench/_http_load.py`, its own
process) sends `--rate` requests/s of one entity each, `--load-seconds` to each service, in segments that
alternate off, on, on, off (`bench/_alternating_load.py`); the target is checked on the median of each side's
segment p99s. `ours` is logging on, `peer` logging off (so a ratio below 1 is what logging costs), with the
server's CPU per request answered on each side (its feature log writer process included, as a child). Also
reported: rows logged, dropped because the queue was full, and written, counted from the files once the server has
stopped (its last flush), and the writer process's own CPU per logged row until then (its last write excluded); the
logs go to a scratch data folder, removed after the run.
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

from bench._alternating_load import Side, alternate, differences, figures, load_options
from bench._report import emit
from bench._serve_env import apply_repo, bench_repo, free_port, load_assets, running_server

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


def _writer_cpu_s(server_pid: int) -> float:
    """CPU seconds of the server's feature log writer processes so far (`serving.feature_log_writer`)."""
    import psutil

    writers = [p for p in psutil.Process(server_pid).children(recursive=True)
               if "serving.feature_log_writer" in p.cmdline()]
    return sum(sum(p.cpu_times()[:2]) for p in writers)


def _written(folder: Path) -> tuple[int, int, int]:
    """Rows, files and bytes of the service's logs on disk."""
    import pyarrow.dataset as ds

    if not folder.exists():
        return 0, 0, 0
    dataset = ds.dataset(folder, format="parquet", partitioning="hive", ignore_prefixes=["."])
    return dataset.count_rows(), len(dataset.files), sum(Path(f).stat().st_size for f in dataset.files)


@click.command()
@click.option("--assets", default=10_000, show_default=True, help="assets written to Redis by Feast")
@load_options
@click.option("--workers", default=1, show_default=True, help="server worker processes")
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def command(ctx, assets: int, rate: float, load_seconds: float, segments: int, workers: int, seed: int) -> None:
    """Feature logging: the server's tail latency with logging on (sample rate 1.0) against off, same run."""
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
            sides = {side: Side(port, pid, bodies[side]) for side in SERVICES}
            for side in sides.values():  # warm-up, both services
                side.warm_up(500)
            measured = alternate(sides, rate, load_seconds, segments, scratch, "logging")
            time.sleep(1.1)  # workers share their counters every second
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as reply:
                counts = json.loads(reply.read())["feature_log"].get(SERVICES["on"], {})
            writer_cpu_s = _writer_cpu_s(pid)
        rows, files, size = _written(scratch / "data" / "feature_logs" / SERVICES["on"])
    ours, peer = figures(measured["on"]), figures(measured["off"])
    ours.update({**differences(ours, peer), "logged_rows": counts.get("logged", 0),
                 "dropped_rows": counts.get("dropped", 0), "written_rows": rows, "log_files": files, "log_bytes": size,
                 "writer_cpu_us_per_logged_row": round(writer_cpu_s / max(1, counts.get("logged", 0)) * 1e6, 1)})
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

