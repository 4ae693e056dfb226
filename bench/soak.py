"""`featurectl bench soak`: the feature server under steady load while the streaming job ingests, for minutes.

A scratch repo (own project and topics, as `bench stream` makes) runs `featurectl stream` on the example asset
views and `featurectl serve` on a free port. For `--minutes`: a producer sends `--events-per-s` live events
(event time = now) into Kafka, and the open-loop load generator (`bench/_http_load.py`, one run per minute)
sends `--rps` requests/s for 1 to 10 of the assets being streamed, from the moment the stream keeps up with the
live events (its clock within 3 s of the wall clock). Every 5 s it samples each process (server,
stream runner, its Flink JVM): resident memory, open file descriptors, TCP connections.

Reported (`ours`): `errors` (non-200 or unanswered requests, all minutes), `p99_ms_max_minute` (the worst
minute's p99), `rss_growth_pct` (the largest growth of any process's resident memory from the end of the warm-up
to the end of the run), and per minute p99, plus file-descriptor and connection growth per process. There is no
peer: a soak has nothing to compare with but itself.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from statistics import median

import click
import psutil

from bench._cli import featurectl
from bench._report import emit
from bench.stream import ROOT, Bench

SAMPLE_EVERY_S = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Producer(threading.Thread):
    """`rate` interactions/s stamped with the wall clock, for assets asset_000000..asset_000999, until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float):
        from confluent_kafka import Producer as KafkaProducer

        super().__init__(daemon=True)
        self.kafka = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                                    "queue.buffering.max.messages": 2_000_000})
        self.topic, self.rate = topic, rate
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        rng = random.Random(7)
        kinds = ("view", "view", "view", "like", "download", "generate")
        templates = [json.dumps({"asset_id": f"asset_{rng.randrange(1000):06d}",
                                 "user_id": f"user_{rng.randrange(5000):06d}", "event_type": rng.choice(kinds),
                                 "dwell_ms": rng.randrange(60_000)})[:-1].encode() + b', "event_time": '
                     for _ in range(10_007)]  # JSON up to the event time: the stamp and `}` are appended
        per_tick = max(1, int(self.rate / 100))  # 10 ms of events at a time
        started = time.time()
        while not self.stop.is_set():
            stamp = b"%d}" % int(time.time() * 1000)
            for _ in range(per_tick):
                self.kafka.produce(self.topic, templates[self.sent % len(templates)] + stamp)
                self.sent += 1
            self.kafka.poll(0)
            time.sleep(max(0.0, started + self.sent / self.rate - time.time()))
        self.kafka.flush(60)


class Sampler(threading.Thread):
    """Resident memory (MB), open fds and TCP connections of named processes (with their children), every 5 s."""

    def __init__(self, processes: dict[str, int]):
        super().__init__(daemon=True)
        self.processes = processes
        self.samples: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in processes}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            for name, pid in self.processes.items():
                try:
                    procs = [psutil.Process(pid)]
                    procs += procs[0].children(recursive=True)
                    rss = sum(p.memory_info().rss for p in procs) / 2**20
                    fds = sum(p.num_fds() for p in procs)
                    conns = sum(len(p.net_connections(kind="tcp")) for p in procs)
                except psutil.Error:
                    continue
                self.samples[name].append((time.monotonic(), rss, fds, conns))

    def growth(self, warm_until: float) -> dict[str, dict[str, float]]:
        """Per process: RSS growth (%) and fd / connection growth (counts) from the first 30 s after the warm-up to
        the last 30 s (medians, so one sample caught mid-allocation does not decide)."""
        out = {}
        for name, rows in self.samples.items():
            after = [r for r in rows if r[0] >= warm_until]
            if len(after) < 2:
                continue
            first = [r for r in after if r[0] < after[0][0] + 30]
            last = [r for r in after if r[0] > after[-1][0] - 30]
            rss0, rss1 = median(r[1] for r in first), median(r[1] for r in last)
            out[name] = {"rss_mb": round(rss1, 1), "rss_growth_pct": round(100 * (rss1 - rss0) / rss0, 2),
                         "fd_growth": median(r[2] for r in last) - median(r[2] for r in first),
                         "connection_growth": median(r[3] for r in last) - median(r[3] for r in first)}
        return out


def _clock_lag_s(status: dict) -> float:
    """How far the stream's clock (newest event time written) is behind the wall clock; inf before it has one."""
    head = status.get("views", {}).get("asset_activity", {}).get("head_event_time")
    try:
        return time.time() - dt.datetime.fromisoformat(head).timestamp()
    except (TypeError, ValueError):
        return float("inf")


def _serve(repo: Path, port: int) -> subprocess.Popen:
    log = (repo / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "featurectl", "--repo", str(repo), "serve", "--port",
                                str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(f"`featurectl serve` did not start; see {repo / 'serve.log'}")
            time.sleep(0.5)


def _minute_of_load(port: int, bodies: Path, rps: float, seconds: float) -> dict:
    done = subprocess.run([sys.executable, "-m", "bench._http_load", "--port", str(port), "--bodies", str(bodies),
                           "--rate", str(rps), "--seconds", str(seconds)],
                          cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise click.ClickException(f"the load generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _bodies(path: Path) -> Path:
    rng = random.Random(11)
    features = [f"asset_activity:{f}" for f in ("views_10m", "views_1h", "views_24h", "likes_24h",
                                                "unique_users_24h", "dwell_ms_mean_1h")]
    bodies = [{"features": features, "entities": {"asset_id": [f"asset_{rng.randrange(1000):06d}"
                                                                for _ in range(rng.randint(1, 10))]}}
              for _ in range(500)]
    path.write_text(json.dumps(bodies))
    return path


@click.command()
@click.option("--minutes", default=10, show_default=True, type=click.IntRange(1, 24 * 60), help="length of the run")
@click.option("--rps", default=2_000.0, show_default=True, help="requests/s to the feature server")
@click.option("--events-per-s", default=5_000.0, show_default=True, help="events/s into the streaming job")
@click.option("--warmup-minutes", default=1.0, show_default=True,
              help="excluded from the memory comparison (at most half the run)")
@click.option("--keep", is_flag=True, help="keep the scratch repo and its stream state")
@click.pass_obj
def command(ctx, minutes: int, rps: float, events_per_s: float, warmup_minutes: float, keep: bool) -> None:
    """Soak: the feature server under load while the stream ingests; errors, p99 per minute, memory, fds."""
    cfg = ctx.config()
    bench = Bench(cfg, cfg.state_dir / "bench-soak")
    server = None
    try:
        featurectl(bench.folder, "apply")
        bench.start_stream()
        bench.wait(lambda s: s.get("flink_status") == "RUNNING", "the job to run", 300)
        port = _free_port()
        server = _serve(bench.folder, port)
        producer = Producer(bench.bootstrap, bench.events_topic, events_per_s)
        sampler = Sampler({"server": server.pid, "stream": bench.stream.pid})
        producer.start()
        sampler.start()
        bench.wait(lambda s: _clock_lag_s(s) < 3.0, "the stream to keep up with the live events", 300)
        started = time.monotonic()
        warm_until = started + 60 * min(warmup_minutes, minutes / 2)
        bodies = _bodies(bench.folder / "bodies.json")
        per_minute = []
        for minute in range(minutes):
            result = _minute_of_load(port, bodies, rps, 60.0)
            status = bench.status()
            per_minute.append({"minute": minute + 1, "p99_ms": result["p99_ms"], "errors": result["errors"],
                               "rps": result["rps"], "stream_events_per_s": status.get("events_per_s"),
                               "stream_lag_p99_ms": (status.get("freshness") or {}).get("p99_ms")})
            click.echo(json.dumps(per_minute[-1]))
        producer.stop.set()
        sampler.stop.set()
        producer.join(120)
        processes = sampler.growth(warm_until)
        dead = bench.status().get("dead_letters", {}).get("total", 0)
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        bench.close(keep)
    ours = {"errors": sum(m["errors"] for m in per_minute),
            "p99_ms_max_minute": max(m["p99_ms"] for m in per_minute),
            "rss_growth_pct": max(p["rss_growth_pct"] for p in processes.values()),
            "fd_growth_max": max(p["fd_growth"] for p in processes.values()),
            "connection_growth_max": max(p["connection_growth"] for p in processes.values()),
            "p99_ms_per_minute": [m["p99_ms"] for m in per_minute], "processes": processes,
            "events_produced": producer.sent, "dead_letters": dead}
    params = {"minutes": minutes, "rps": rps, "events_per_s": events_per_s, "warmup_minutes": warmup_minutes,
              "load_average": [round(x, 1) for x in psutil.getloadavg()]}
    emit("soak", ours, {}, params)
