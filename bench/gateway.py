"""`featurectl bench gateway`: what `featurectl gateway` adds to each request, and how much of its traffic a slow
replica still gets, against round robin on the same replicas.

Three stand-in replicas (`bench._replica`: generate-server's HTTP API on the servers' own protocol, answering
`POST /generate` after an injected delay, without the model, whose seconds of work would hide the gateway's
microseconds), the gateway as `featurectl gateway` runs it, keys off.
- Added latency: `--requests` sequential `POST /generate` on a keep-alive connection each, straight to a replica
  (the peer) and through the gateway (ours), alternating request by request, every replica answering at once;
  `p50_ms`, `p99_ms` of each side; `added_p50_ms`, the difference of the p50s; `added_p99_ms`, the median over 10
  segments of the run of the difference of the segment's p99s (on a shared host a stall lands on one side at a
  time and sways the p99 of the whole run either way: `added_p99_whole_run_ms` is that difference).
- Slow replica: two replicas at `--fast-ms`, one at `--slow-ms`; an open-loop load of `--rate` requests/s for
  `--seconds` through the gateway (`bench._http_load`, its own process), first with `--balance latency` (ours)
  then `--balance round-robin` (the peer), a fresh gateway on the same replicas each. `slow_share_pct`: the share
  of the requests the replicas answered that the slow one answered (counted by the replicas themselves);
  `load_p50_ms`, `load_p99_ms`, `load_errors` as the load generator saw them.
Goals on this host: `added_p99_ms` <= 1, `slow_share_pct` <= 5.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import click
import numpy as np

from bench._http_load import http_request, keep_alive, timed_request
from bench._report import emit, percentiles
from bench._serve_env import free_port, open_loop, running_server

GOALS = {"added_p99_ms": 1.0, "slow_share_pct": 5.0}
SEGMENTS = 10  # the added p99 is the median over segments of the run: one stall of the host sways one segment
BODY = b'{"prompt": "a wooden chair"}'
HOST = "127.0.0.1"


def _post(port: int, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://{HOST}:{port}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def _generated(port: int) -> int:
    with urllib.request.urlopen(f"http://{HOST}:{port}/count", timeout=10) as reply:
        return json.loads(reply.read())["generated"]


@contextlib.contextmanager
def _replicas(scratch: Path, count: int = 3) -> Iterator[list[int]]:
    """The stand-in replicas' ports, running until the block ends."""
    ports = [free_port() for _ in range(count)]
    with contextlib.ExitStack() as stack:
        for i, port in enumerate(ports):
            stack.enter_context(running_server([sys.executable, "-m", "bench._replica", "--port", str(port),
                                                "--name", f"r{i}"], port, scratch / f"replica{i}.log"))
        yield ports


@contextlib.contextmanager
def _gateway(repo: Path, replicas: list[int], balance: str, scratch: Path) -> Iterator[int]:
    port = free_port()
    command = [sys.executable, "-m", "featurectl", "--repo", str(repo), "gateway", "--port", str(port),
               "--balance", balance, "--no-require-api-key",
               *[arg for p in replicas for arg in ("--replica", f"http://{HOST}:{p}")]]
    with running_server(command, port, scratch / f"gateway-{balance}.log"):
        yield port


def _added_latency(gateway: int, replica: int, requests: int) -> tuple[dict, dict]:
    """p50/p99 straight to one replica and through the gateway, on a keep-alive connection each, the two sides
    alternating request by request (and which goes first), so that the host's stalls fall on both alike."""
    direct: list[float] = []
    through: list[float] = []
    with keep_alive(HOST, replica) as to_replica, keep_alive(HOST, gateway) as to_gateway:
        sides = [(to_replica, http_request(HOST, replica, BODY, "/generate"), direct),
                 (to_gateway, http_request(HOST, gateway, BODY, "/generate"), through)]
        for sock, request, _ in sides:
            for _ in range(200):  # warm-up, untimed
                timed_request(sock, request)
        for i in range(requests):
            for sock, request, samples in sides if i % 2 else sides[::-1]:
                samples.append(timed_request(sock, request))
    ours, peer = percentiles(through, (50, 99)), percentiles(direct, (50, 99))
    size = max(100, requests // SEGMENTS)
    added = [percentiles(through[i:i + size], (99,))["p99"] - percentiles(direct[i:i + size], (99,))["p99"]
             for i in range(0, requests - size + 1, size)]
    return ({"p50_ms": round(ours["p50"], 4), "p99_ms": round(ours["p99"], 4),
             "added_p50_ms": round(ours["p50"] - peer["p50"], 4), "added_p99_ms": round(float(np.median(added)), 4),
             "added_p99_whole_run_ms": round(ours["p99"] - peer["p99"], 4)},
            {"p50_ms": round(peer["p50"], 4), "p99_ms": round(peer["p99"], 4)})


def _slow_share(repo: Path, replicas: list[int], balance: str, rate: float, seconds: float, scratch: Path) -> dict:
    """Load through a fresh gateway; the slow replica (the last) answered what share of it."""
    bodies = scratch / "bodies.json"
    bodies.write_text(json.dumps([json.loads(BODY)]))
    with _gateway(repo, replicas, balance, scratch) as port:
        before = [_generated(p) for p in replicas]
        load = open_loop(port, bodies, rate, seconds, path="/generate")
        served = [_generated(p) - b for p, b in zip(replicas, before)]
    return {"slow_share_pct": round(100 * served[-1] / max(1, sum(served)), 2), "load_p50_ms": load["p50_ms"],
            "load_p99_ms": load["p99_ms"], "load_errors": load["errors"]}


@click.command()
@click.option("--requests", type=click.IntRange(500, 10_000_000), default=10_000, show_default=True,
              help="sequential requests per side (added latency)")
@click.option("--rate", type=click.FloatRange(1, 100_000), default=300.0, show_default=True,
              help="requests/s of the slow-replica load")
@click.option("--seconds", type=click.FloatRange(1, 3600), default=15.0, show_default=True,
              help="length of each slow-replica load")
@click.option("--fast-ms", type=click.FloatRange(0, 60_000), default=2.0, show_default=True,
              help="delay of the two fast replicas")
@click.option("--slow-ms", type=click.FloatRange(0, 60_000), default=20.0, show_default=True,
              help="delay of the slow replica")
@click.pass_obj
def command(ctx, requests: int, rate: float, seconds: float, fast_ms: float, slow_ms: float) -> None:
    """The gateway: p99 it adds per request (against straight to a replica), and the slow replica's share of
    traffic (against round robin)."""
    repo = ctx.config().repo_path
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as folder, _replicas(Path(folder)) as replicas:
        scratch = Path(folder)
        with _gateway(repo, replicas, "latency", scratch) as port:
            ours, peer = _added_latency(port, replicas[0], requests)
        for replica, delay in zip(replicas, (fast_ms, fast_ms, slow_ms)):
            _post(replica, "/delay", {"ms": delay})
        ours.update(_slow_share(repo, replicas, "latency", rate, seconds, scratch))
        time.sleep(1)
        peer.update(_slow_share(repo, replicas, "round-robin", rate, seconds, scratch))
    met = {f"{k}<={v}": ours[k] <= v for k, v in GOALS.items()}
    emit("gateway", ours, peer, {"replicas": 3, "requests": requests, "rate": rate, "seconds": seconds,
                                 "fast_ms": fast_ms, "slow_ms": slow_ms, "cpus": os.cpu_count(),
                                 "peer": "p50/p99_ms: straight to a replica; slow_share_pct, load_*: round robin",
                                 "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                                 "goals_met": met})
