"""The demo's streaming step: `featurectl stream` as a subprocess, live events for three assets into Kafka, and
their online values read through the SDK while the job moves them; then a clean stop (Ctrl-C's path).

A subprocess, as a user runs it: its Flink mini-cluster and window writer stay out of the demo's process, and
SIGINT exercises the same clean stop (cancel, keep the checkpoint) that Ctrl-C does.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import click

from featurectl.checkout import checkout_module

VIEW = "asset_activity"
ASSETS = ("asset_000000", "asset_000001", "asset_000002")  # SampleSpec(n_assets=3) draws its events among these
FEATURES = ("views_10m", "likes_10m", "unique_users_1h", "last_user_24h")
START_TIMEOUT_S = 300.0
SETTLE_TIMEOUT_S = 60.0


def stream_live(cfg, global_args: list[str], seconds: float, rate: float) -> None:
    """Start the stream, produce `rate` events/s for `seconds` for `ASSETS`, print their values as they change."""
    from serving import OnlineClient

    log_path = cfg.state_dir / "demo_stream.log"
    stream = _start(global_args, log_path)
    try:
        status = _wait(cfg, stream, log_path, lambda s: s.get("flink_status") == "RUNNING", "the Flink job to run",
                       START_TIMEOUT_S)
        click.echo(f"stream {status['job']} running (Flink job {status['flink_job_id']}); log: {log_path}")
        with OnlineClient.from_repo(cfg.repo_path, registry=cfg.registry_url) as client:
            before = _read(client)
            ended_at = _produce_and_watch(cfg, client, seconds, rate)
            _wait(cfg, stream, log_path, lambda s: _clock_ms(s) >= ended_at - 1_000,
                  "the job to apply the live events", SETTLE_TIMEOUT_S)
            time.sleep(1.0)  # the last tile batch: one mini-batch latency, then the writer
            _print_table(before, _read(client))
    finally:
        _stop(stream)


def _start(global_args: list[str], log_path: Path) -> subprocess.Popen:
    with log_path.open("w") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "featurectl", *global_args, "stream", "--view", VIEW],
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _status(cfg, pid: int) -> dict:
    from streaming.status import read_statuses

    return next((s for _, s in read_statuses(cfg.state_dir) if s.get("pid") == pid), {})


def _wait(cfg, stream: subprocess.Popen, log_path: Path, ready: Callable[[dict], bool], what: str,
          timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = _status(cfg, stream.pid)
        if status and ready(status):
            return status
        if stream.poll() is not None:
            raise click.ClickException(f"`featurectl stream` exited while waiting for {what}; see {log_path}")
        time.sleep(0.25)
    raise click.ClickException(f"waited {timeout_s:.0f}s for {what}; see {log_path} and `featurectl stream "
                               "--status`")


def _clock_ms(status: dict) -> float:
    head = status.get("views", {}).get(VIEW, {}).get("head_event_time")
    return dt.datetime.fromisoformat(head).timestamp() * 1000 if head else 0.0


def _read(client) -> dict[str, list]:
    return client.get_features([f"{VIEW}:{f}" for f in FEATURES], {"asset_id": list(ASSETS)})


def _produce_and_watch(cfg, client, seconds: float, rate: float) -> float:
    """Produce in a thread, print views_10m of each asset every few seconds; returns when the last event was made
    (epoch ms)."""
    sample_data = checkout_module("feature_repo.sample_data")
    SampleSpec, produce_live = sample_data.SampleSpec, sample_data.produce_live

    topic = _topic(cfg)
    done: dict[str, Optional[BaseException]] = {"error": None}

    def produce() -> None:
        try:
            spec = SampleSpec(n_assets=len(ASSETS), seed=int(time.time()))  # new users on every run
            produce_live(spec, cfg.platform.kafka.bootstrap_servers, topic, rate, seconds)
        except BaseException as exc:  # reported in the demo's thread
            done["error"] = exc

    click.echo(f"producing {rate:,.0f} events/s for {seconds:g}s to `{topic}` (assets {', '.join(ASSETS)}); "
               f"views_10m as the SDK reads it:")
    producer = threading.Thread(target=produce, daemon=True)
    started = time.monotonic()
    producer.start()
    while producer.is_alive():
        producer.join(timeout=3.0)
        if producer.is_alive():
            views = _read(client)["views_10m"]
            click.echo(f"  t+{time.monotonic() - started:4.1f}s  "
                       + "  ".join(f"{a}={_cell(v)}" for a, v in zip(ASSETS, views)))
    if done["error"] is not None:
        raise click.ClickException(f"producing live events to `{topic}` failed: {done['error']}")
    return time.time() * 1000


def _topic(cfg) -> str:
    from dsl import load_repo

    return load_repo(cfg.repo_path).view(VIEW).source.kafka_topic


def _print_table(before: dict[str, list], after: dict[str, list]) -> None:
    width = max(len(f) for f in FEATURES)
    click.echo(f"  {'feature':<{width}}  " + "  ".join(f"{a:>28}" for a in ASSETS))
    for feature in FEATURES:
        cells = [f"{_cell(b)} -> {_cell(a)}" for b, a in zip(before[feature], after[feature])]
        click.echo(f"  {feature:<{width}}  " + "  ".join(f"{c:>28}" for c in cells))
    click.echo("  (before: what Redis held, the values materialized from the history or those of an earlier stream;")
    click.echo("   after: the stream's windows, started from the Parquet history, with the live events in Kafka)")


def _cell(value) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def _stop(stream: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C: the stream cancels its Flink job and keeps its checkpoint."""
    if stream.poll() is None:
        stream.send_signal(signal.SIGINT)
        try:
            stream.wait(timeout=120)
        except subprocess.TimeoutExpired:
            stream.kill()
            stream.wait()
    click.echo(f"stream stopped (exit status {stream.returncode})")
