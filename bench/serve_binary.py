"""`featurectl bench serve_binary`: one `featurectl serve`, its Arrow IPC route (`ours`) beside its JSON route
(`peer`), same data and requests as `bench serve` (20 features over 2 views, its repo and Redis rows).

For 1 and 100 entities: sequential requests on one keep-alive connection (`http_N_p50_ms`, `_p99_ms`), then
`--rounds` open-loop load phases per route (`bench._http_load`, from a separate process; `--rate` requests/s with
1 entity, `--batch-rate` with 100), the two routes alternating and the order swapped every round so that the
host's noise falls on both: `load_N_cpu_us_per_request` (server user + system CPU per request answered, the median
of the rounds), `load_N_p50_ms` / `_p99_ms` over every round's latencies, `load_N_errors`. The ratio is JSON over
Arrow: above 1, the Arrow route is cheaper or faster.

`--flame FILE.svg` then records a py-spy flame graph of the server (`py-spy record --nonblocking -r 250`, the
`bench` extra) under one more JSON 1-entity load phase of `--flame-seconds`, not counted in the figures.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import click
import numpy as np

from bench._cpu import process_cpu_s
from bench._http_load import ARROW_HEADERS, JSON_HEADERS, arrow_body, sequential
from bench._report import emit, percentiles
from bench._serve_env import apply_repo, bench_repo, free_port, load_assets, open_loop, running_server
from bench.serve import ATTRIBUTES, ON_DEMAND, PROJECT

ROUTES = {"ours": True, "peer": False}  # Arrow, JSON


def _bodies(features: list[str], ids: list[str], rows: int, count: int, rng: np.random.Generator) -> list[dict]:
    return [{"features": features, "entities": {"asset_id": [ids[i] for i in rng.integers(0, len(ids), rows)]}}
            for _ in range(count)]


def _sequential(port: int, bodies: list[dict], count: int) -> dict[str, dict]:
    """Each route's sequential p50/p99 (ms), after a warm-up of each."""
    out = {}
    for side, arrow in ROUTES.items():
        encoded = [arrow_body(b) if arrow else json.dumps(b).encode() for b in bodies]
        headers = ARROW_HEADERS if arrow else JSON_HEADERS
        sequential("127.0.0.1", port, encoded, min(count, 200), headers=headers)
        out[side] = percentiles(sequential("127.0.0.1", port, encoded, count, headers=headers), (50, 99))
    return out


def _loaded(port: int, pid: int, bodies_file: Path, rate: float, seconds: float, rounds: int,
            scratch: Path) -> dict[str, dict]:
    """Each route's load figures over `rounds` alternating phases."""
    cpu: dict[str, list[float]] = {side: [] for side in ROUTES}
    samples: dict[str, list[float]] = {side: [] for side in ROUTES}
    errors = dict.fromkeys(ROUTES, 0)
    for turn in range(rounds):
        for side in list(ROUTES)[::1 if turn % 2 else -1]:
            before = process_cpu_s(pid)
            result = open_loop(port, bodies_file, rate, seconds, scratch / "samples.json", arrow=ROUTES[side])
            cpu[side].append((process_cpu_s(pid) - before) / max(1, result["ok"]) * 1e6)
            samples[side] += json.loads((scratch / "samples.json").read_text())
            errors[side] += result["errors"]
    return {side: {"cpu_us_per_request": round(statistics.median(cpu[side]), 1),
                   **{f"{k}_ms": round(v, 4) for k, v in percentiles(samples[side], (50, 99)).items()},
                   "errors": errors[side], "cpu_us_rounds": [round(c, 1) for c in cpu[side]]} for side in ROUTES}


def _flame(pid: int, port: int, bodies_file: Path, rate: float, seconds: float, svg: Path) -> None:
    """A py-spy flame graph of the server under a JSON load phase."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise click.ClickException("--flame needs py-spy: pip install -e '.[bench]'")
    svg.parent.mkdir(parents=True, exist_ok=True)
    recorder = subprocess.Popen([spy, "record", "--nonblocking", "--subprocesses", "-r", "250", "-d",
                                 str(int(seconds) + 1), "-o", str(svg), "--pid", str(pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    open_loop(port, bodies_file, rate, seconds)
    _, err = recorder.communicate(timeout=seconds + 60)
    if recorder.returncode:
        raise click.ClickException(f"py-spy failed: {err[-1000:]}")


@click.command()
@click.option("--assets", default=100_000, show_default=True, help="assets written to Redis by Feast")
@click.option("--http-requests", default=3_000, show_default=True, help="sequential 1-entity requests per route")
@click.option("--http-batch-requests", default=300, show_default=True,
              help="sequential 100-entity requests per route")
@click.option("--rate", default=2000.0, show_default=True, help="1-entity requests/s of a load phase")
@click.option("--batch-rate", default=200.0, show_default=True, help="100-entity requests/s of a load phase")
@click.option("--load-seconds", default=8.0, show_default=True, help="seconds of each load phase")
@click.option("--rounds", default=2, show_default=True, help="load phases per route and entity count")
@click.option("--flame", "flame_svg", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write a py-spy flame graph of the JSON 1-entity load here")
@click.option("--flame-seconds", default=20.0, show_default=True, help="seconds of the flame graph's load phase")
@click.option("--workers", default=1, show_default=True, help="server worker processes")
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def command(ctx, assets: int, http_requests: int, http_batch_requests: int, rate: float, batch_rate: float,
            load_seconds: float, rounds: int, flame_svg: Optional[Path], flame_seconds: float, workers: int,
            seed: int) -> None:
    """The feature server's Arrow IPC route against its JSON route: latency and server CPU, 1 and 100 entities."""
    load_before = os.getloadavg()[0]
    repo = bench_repo(ctx.config().state_dir / "bench-serve", PROJECT, ON_DEMAND)
    store = apply_repo(repo)
    load_assets(store, assets, seed)
    features = ([f"asset_activity:{f.name}" for f in store.get_feature_view("asset_activity").features]
                + [f"asset_attributes:{name}" for name in ATTRIBUTES])
    ids = [f"asset_{i:06d}" for i in range(assets)]
    rng = np.random.default_rng(seed)
    out: dict[str, dict] = {side: {} for side in ROUTES}
    port = free_port()
    command_line = [sys.executable, "-m", "featurectl", "--repo", str(repo), "serve", "--port", str(port),
                    "--workers", str(workers)]
    with tempfile.TemporaryDirectory(prefix="bench-serve-binary-") as folder:
        scratch = Path(folder)
        with running_server(command_line, port, scratch / "server.log") as pid:
            for rows, count, load_rate in ((1, http_requests, rate), (100, http_batch_requests, batch_rate)):
                bodies = _bodies(features, ids, rows, 2000 if rows == 1 else 50, rng)
                bodies_file = scratch / f"bodies_{rows}.json"
                bodies_file.write_text(json.dumps(bodies))
                for side, figures in _sequential(port, bodies, count).items():
                    out[side].update({f"http_{rows}_{k}_ms": round(v, 4) for k, v in figures.items()})
                for side, figures in _loaded(port, pid, bodies_file, load_rate, load_seconds, rounds,
                                             scratch).items():
                    out[side].update({f"load_{rows}_{k}": v for k, v in figures.items()})
            if flame_svg is not None:
                _flame(pid, port, scratch / "bodies_1.json", rate, flame_seconds, flame_svg)
    emit("serve_binary", out["ours"], out["peer"],
         {"ours": "Arrow IPC route", "peer": "JSON route", "assets": assets, "features": len(features),
          "http_requests": http_requests, "http_batch_requests": http_batch_requests, "rate": rate,
          "batch_rate": batch_rate, "load_seconds": load_seconds, "rounds": rounds, "server_workers": workers,
          "cpus": os.cpu_count(), "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
          "flame": str(flame_svg) if flame_svg else None, "flame_seconds": flame_seconds})
