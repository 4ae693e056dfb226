"""`featurectl bench monitoring`: what the freshness and data-quality monitoring costs `featurectl serve` under
load, on and off in one run.

Two `featurectl serve` processes over the same registry, project and Redis data: one with the default
`platform.serving.monitoring: true` (rows served per view counted per request, the views' newest event times and
stream lags read every second, up to 256 served rows a second sampled and binned for drift against the profiles,
recorded as a backfill records them), one with `monitoring: false`. Every request reads the 20 features of one
asset that `bench serve` reads (16 of `asset_activity`, 4 of `asset_attributes`), the same requests on both
sides. The open-loop load sends `--rate` requests/s, `--load-seconds` to each server, in segments alternating off,
on, on, off (`bench/_alternating_load.py`); the server not under load idles meanwhile (the monitored one keeps
its once-a-second reads). `ours` is monitoring on, `peer` off (so a ratio below 1 is what monitoring costs), with
each server's CPU per request answered over its own segments; the target is checked on the median of each side's
segment p99s. Also reported, from each server's /metrics and /stats after the load: the features the monitored
one computed drift for and the rows it counted, and that the other exports none of those families.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path

import click
import numpy as np

from bench._alternating_load import Side, alternate, differences, figures, load_options
from bench._report import emit
from bench._serve_env import apply_repo, bench_repo, free_port, load_assets, record_profiles, running_server

PROJECT = "monitorbench"
ATTRIBUTES = ["category", "style", "bbox_x", "polygon_count"]
TARGET_P99_DELTA_MS = 0.2
FAMILIES = ("featurectl_view_served_rows", "featurectl_view_newest_value_age_seconds", "featurectl_feature_drift")


def _bodies(store, scratch: Path, assets: int, seed: int) -> Path:
    """2,000 one-entity requests of the 20 features, asked of both servers."""
    features = ([f"asset_activity:{f.name}" for f in store.get_feature_view("asset_activity").features]
                + [f"asset_attributes:{name}" for name in ATTRIBUTES])
    ids = [f"asset_{i:06d}" for i in np.random.default_rng(seed).integers(0, assets, 2000)]
    path = scratch / "bodies.json"
    path.write_text(json.dumps([{"features": features, "entities": {"asset_id": [i]}} for i in ids]))
    return path


def _read(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        return reply.read()


def _monitored(port: int) -> dict:
    """What one server's /metrics and /stats show of the monitoring after the load."""
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(_read(port, "/metrics").decode())}
    served = json.loads(_read(port, "/stats"))["served_rows"]
    drift = families.get("featurectl_feature_drift")
    return {"families": sum(name in families for name in FAMILIES),
            "drift_features": len(drift.samples) if drift else 0,
            "served_rows": sum(view["rows"] for view in served.values())}


@click.command()
@click.option("--assets", default=10_000, show_default=True, help="assets written to Redis by Feast")
@load_options
@click.option("--workers", default=1, show_default=True, help="worker processes of each server")
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def command(ctx, assets: int, rate: float, load_seconds: float, segments: int, workers: int, seed: int) -> None:
    """Freshness and quality monitoring: the server's tail latency and CPU with it on against off, same run."""
    cfg = ctx.config()
    load_before = os.getloadavg()[0]
    folder = cfg.state_dir / "bench-monitoring"
    repos = {side: bench_repo(folder, PROJECT, platform={"serving": {"monitoring": side == "on"}}, name=f"repo-{side}")
             for side in ("off", "on")}
    store = apply_repo(repos["on"])
    load_assets(store, assets, seed)
    record_profiles(store, repos["on"], assets, seed)
    with tempfile.TemporaryDirectory(prefix="bench-monitoring-") as scratch_dir:
        scratch = Path(scratch_dir)
        bodies = _bodies(store, scratch, assets, seed)
        ports = {side: free_port() for side in repos}
        lines = {side: [sys.executable, "-m", "featurectl", "--repo", str(repo), "serve", "--port", str(ports[side]),
                        "--workers", str(workers)] for side, repo in repos.items()}
        with running_server(lines["off"], ports["off"], scratch / "server-off.log") as off_pid, \
                running_server(lines["on"], ports["on"], scratch / "server-on.log") as on_pid:
            sides = {"off": Side(ports["off"], off_pid, bodies), "on": Side(ports["on"], on_pid, bodies)}
            for side in sides.values():
                side.warm_up(500)
            measured = alternate(sides, rate, load_seconds, segments, scratch, "monitoring")
            shown = {side: _monitored(port) for side, port in ports.items()}
    ours, peer = figures(measured["on"]), figures(measured["off"])
    ours.update(differences(ours, peer))
    met = {f"segment_p99_median_delta_ms<={TARGET_P99_DELTA_MS}":
           ours["segment_p99_median_delta_ms"] <= TARGET_P99_DELTA_MS,
           "http_load_errors==0": ours["http_load_errors"] == peer["http_load_errors"] == 0,
           "monitoring_on_exports_it": shown["on"]["families"] == len(FAMILIES) and shown["on"]["drift_features"] > 0,
           "monitoring_off_exports_none": shown["off"]["families"] == 0}
    emit("monitoring", ours, peer, {"assets": assets, "features": 20, "load_rate": rate,
                                    "load_seconds_per_side": load_seconds, "segments": segments,
                                    "server_workers": workers, "warmup_requests_per_side": 500,
                                    "monitored": shown, "cpus": os.cpu_count(),
                                    "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                    "targets_met": met})
