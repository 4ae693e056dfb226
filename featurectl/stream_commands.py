"""`featurectl stream`: feature views from Kafka through Flink into Redis, until stopped; `--status` reports."""

from __future__ import annotations

import datetime as dt
import signal
import threading
from pathlib import Path
from typing import Optional

import click


def _views(cfg, names: tuple[str, ...]):
    from dsl import DefinitionError, load_repo

    try:
        repo = load_repo(cfg.repo_path)
        chosen = [repo.view(n) for n in names] if names else [v for v in repo.views if v.source.kafka_topic]
    except DefinitionError as exc:
        raise click.ClickException(str(exc)) from exc
    return chosen, repo.views


def _stop_on_signals(stop: threading.Event) -> None:
    """First Ctrl-C (or SIGTERM) asks for a clean stop; a second Ctrl-C interrupts at once."""
    def handler(signum, _frame):
        click.echo("\nstopping: cancelling the Flink job (its checkpoint stays) ...", err=True)
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _age(iso: Optional[str]) -> str:
    if not iso:
        return "-"
    seconds = int((dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(iso)).total_seconds())
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _print_status(home: Path, status: dict) -> None:
    from streaming.runner import is_running

    alive = is_running(home)
    state = status.get("state") if alive else f"not running (last state: {status.get('state')})"
    click.secho(f"stream {status['job']}: {state}", bold=True)
    click.echo(f"  pid {status.get('pid')}, flink job {status.get('flink_job_id')} {status.get('flink_status') or ''}"
               f", started {_age(status.get('started_at'))} ago, updated {_age(status.get('updated_at'))} ago")
    fresh = status.get("freshness") or {}
    click.echo(f"  {'throughput' if alive else 'last throughput'} {status.get('events_per_s', 0):,.0f} events/s; "
               f"event-to-Redis lag p50 "
               f"{_ms(fresh.get('p50_ms'))}, p99 {_ms(fresh.get('p99_ms'))} ({fresh.get('samples', 0):,} tile "
               f"writes, last 60 s)")
    checkpoint = status.get("checkpoint") or {}
    click.echo(f"  checkpoint {checkpoint.get('path', 'none yet')} {checkpoint.get('at', '')}".rstrip()
               + (f"; resumed from {status['restored_from']}" if status.get("restored_from") else ""))
    dead = status.get("dead_letters") or {}
    reasons = ", ".join(f"{k} {v:,}" for k, v in (dead.get("by_reason") or {}).items())
    click.echo(f"  dead letters {dead.get('total', 0):,}" + (f" ({reasons})" if reasons else "")
               + f" in {', '.join(status.get('topics', {}).get('dead_letters', []))}")
    for name, view in (status.get("views") or {}).items():
        click.echo(f"  view {name}: {view['events']:,} events ({view['events_per_s']:,.0f}/s), "
                   f"{view.get('entities', 0):,} entities, clock {view.get('head_event_time') or '-'}, "
                   f"{view['redis_writes']:,} Redis writes ({view['redis_refused_older']:,} refused as older)")


@click.command()
@click.option("--view", "names", multiple=True, help="a feature view to stream (repeatable; default: every view "
              "whose source has a kafka_topic)")
@click.option("--jobmanager", default=None, help="host:port of a Flink cluster (default: platform.flink.jobmanager, "
              "else a local mini-cluster)")
@click.option("--status", "show_status", is_flag=True, help="report the streams of this repo and exit")
@click.option("--checkpoint-interval", type=float, default=None, help="seconds between Flink checkpoints [10]")
@click.option("--mini-batch-latency", type=int, default=None, help="ms an event may wait in a tile mini-batch [500]")
@click.pass_obj
def stream(ctx, names: tuple[str, ...], jobmanager: Optional[str], show_status: bool,
           checkpoint_interval: Optional[float], mini_batch_latency: Optional[int]) -> None:
    """Stream feature views: Kafka -> Flink (tiles, dead letters) -> window values in Redis, in Feast's layout.

    Runs until stopped; Ctrl-C stops cleanly and a later run resumes from the latest checkpoint, as it does after
    a crash.
    """
    from streaming.status import read_statuses

    cfg = ctx.config()
    if show_status:
        found = read_statuses(cfg.state_dir)
        if not found:
            click.echo(f"no stream has run with state folder {cfg.state_dir}")
        for home, status in found:
            _print_status(home, status)
        return
    from dsl.compile_flink import SourceSettings
    from streaming.config import StreamSettings
    from streaming.flink_job import StreamJobError
    from confluent_kafka import KafkaException

    from streaming.job_sql import StreamDefinitionError
    from streaming.redis_sink import RedisUnavailable
    from streaming.runner import StreamError, StreamRunner, Target

    overrides = {k: v for k, v in (("checkpoint_interval_s", checkpoint_interval),
                                   ("mini_batch_latency_ms", mini_batch_latency)) if v is not None}
    settings = StreamSettings(parallelism=cfg.platform.flink.parallelism, **overrides)
    target = Target(cfg.project, cfg.redis_settings(), SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_dir),
                    cfg.state_dir, jobmanager or cfg.platform.flink.jobmanager, cfg.key_ttl_seconds)
    views, all_views = _views(cfg, names)
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        runner = StreamRunner(target, views, all_views, settings)
        click.echo(f"stream {runner.plan.name}: {', '.join(v.view.name for v in runner.plan.views)} -> Redis "
                   f"{':'.join(map(str, cfg.redis_host_port))}; status: featurectl stream --status")
        runner.run(stop)
    except (StreamError, StreamJobError, StreamDefinitionError, RedisUnavailable, KafkaException) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stream {runner.plan.name} stopped; the next run resumes from its latest checkpoint")


COMMANDS = [stream]
