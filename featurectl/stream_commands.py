"""`featurectl stream`: feature views from Kafka through Flink into Redis, until stopped; `--status` reports."""

from __future__ import annotations

import datetime as dt
import signal
import threading
from pathlib import Path
from typing import Optional

import click


def _views(cfg, names: tuple[str, ...]):
    from dsl import load_repo

    repo = load_repo(cfg.repo_path)
    chosen = [repo.view(n) for n in names] if names else [v for v in repo.views if v.source.kafka_topic]
    return chosen, repo.views


def _record_online_versions(cfg, views, sources) -> None:
    """The versions this stream writes to Redis, which the feature server compares with the applied ones."""
    from common.version_log import VersionLog
    from dsl.compile_flink import compile_view
    from dsl.view_version import view_version

    version_log = VersionLog(cfg.registry_url)
    try:
        version_log.record_online(cfg.project, {v.name: view_version(v, compile_view(v, sources)) for v in views},
                                  "featurectl stream", dt.datetime.now(dt.timezone.utc))
    finally:
        version_log.close()


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
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _print_status(home: Path, status: dict) -> None:
    from streaming.status import is_running

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
    click.echo("  " + _progress_line(status, alive))
    generation = status.get("generation") or {}
    cutovers = ", ".join(f"{source} at {at}" for source, at in (generation.get("cutovers") or {}).items())
    history = (generation.get("history") or {}).get("views") or {}
    loaded = ", ".join(f"{name} {n['entities']:,} entities ({n['tiles']:,} tiles)" for name, n in history.items())
    counted = f"Kafka events count from the cutover: {cutovers}" if cutovers else "none (Kafka only)"
    click.echo(f"  history: {counted}"
               + (f"; started from {loaded} (loaded in {generation['history']['load_s']} s)" if loaded else ""))
    checkpoint = status.get("checkpoint") or {}
    click.echo(f"  checkpoint {checkpoint.get('path', 'none yet')} {checkpoint.get('at', '')}".rstrip()
               + (f"; resumed from {status['restored_from']}" if status.get("restored_from") else ""))
    dead = status.get("dead_letters") or {}
    reasons = ", ".join(f"{k} {v:,}" for k, v in (dead.get("by_reason") or {}).items())
    click.echo(f"  dead letters {dead.get('total', 0):,}" + (f" ({reasons})" if reasons else "")
               + f" in {', '.join(status.get('topics', {}).get('dead_letters', []))}")
    writers = status.get("writers") or []
    if writers:
        click.echo(f"  parallelism {status.get('parallelism', 1)}; window writers: "
                   + "; ".join(_writer_text(w, alive) for w in writers))
    for name, view in (status.get("views") or {}).items():
        click.echo(f"  view {name}: {view['events']:,} events ({view['events_per_s']:,.0f}/s), "
                   f"{view.get('entities', 0):,} entities, clock {view.get('head_event_time') or '-'}, "
                   f"{view['redis_writes']:,} Redis writes ({view['redis_refused_older']:,} refused as older)")


def _writer_text(writer: dict, alive: bool) -> str:
    state = writer["state"] if writer["alive"] and alive else "not running"
    restarts = f", restarted {writer['restarts']}x" if writer["restarts"] else ""
    return f"{writer['writer']} pid {writer['pid']} {state} ({', '.join(writer['partitions']) or '-'}){restarts}"


def _progress_line(status: dict, alive: bool) -> str:
    """Whether every event produced so far is applied: `caught up` with the offsets, or how far behind."""
    lag = status.get("lag")
    if not alive or not lag:
        return f"progress: unknown ({'not running' if not alive else status.get('state')})"
    offsets = ", ".join(f"{o['topic']}[{o['partition']}] {o['applied']:,}/{o['end']:,}" for o in lag["offsets"])
    if lag["caught_up"]:
        return f"caught up: every event produced so far is applied and in Redis (offsets {offsets})"
    if not lag.get("writers_answered", True):
        return "behind: a window writer is starting (reading its tile partitions back) or did not answer in time"
    return (f"behind: {lag['source_events']:,} events not yet applied by Flink (offsets applied/end {offsets}), "
            f"{lag['tile_updates']:,} tile updates not yet read, {lag['unwritten_entities']:,} entities not yet "
            "written to Redis")


@click.command()
@click.option("--view", "names", multiple=True, help="a feature view to stream (repeatable; default: every view "
              "whose source has a kafka_topic)")
@click.option("--jobmanager", default=None, help="REST address host:port of a Flink cluster's JobManager (its REST "
              "port, 8081 by default; default: platform.flink.jobmanager, else a local mini-cluster)")
@click.option("--status", "show_status", is_flag=True, help="report the streams of this repo and exit")
@click.option("--checkpoint-interval", type=float, default=None, help="seconds between Flink checkpoints [10]")
@click.option("--mini-batch-latency", type=int, default=None, help="ms an event may wait in a tile mini-batch [500]")
@click.option("--parallelism", type=click.IntRange(min=1), default=None, help="Flink parallelism and number of "
              "window writer processes; topics the stream creates get this many partitions, and its source and "
              "tile topics need at least this many [platform.flink.parallelism]")
@click.option("--reset", is_flag=True, help="start afresh from the history (a new cutover) instead of resuming "
              "from the latest checkpoint")
@click.pass_obj
def stream(ctx, names: tuple[str, ...], jobmanager: Optional[str], show_status: bool,
           checkpoint_interval: Optional[float], mini_batch_latency: Optional[int], parallelism: Optional[int],
           reset: bool) -> None:
    """Stream feature views: Kafka -> Flink (tiles, dead letters) -> window values in Redis, in Feast's layout.

    A first start (or --reset) starts each window from the Parquet history: events before a source's cutover
    (one past its last event in Parquet) count from there, later ones from Kafka. Runs until stopped; Ctrl-C stops
    cleanly and a later run resumes from the latest checkpoint, as it does after a crash.
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
    from confluent_kafka import KafkaException

    from batch.history import ParquetHistory
    from common.flink_rest import check_jobmanager
    from dsl.compile_flink import SourceSettings
    from redis_store.settings import RedisSettings
    from streaming.config import StreamSettings
    from streaming.runner import StreamRunner, Target

    overrides = {k: v for k, v in (("checkpoint_interval_s", checkpoint_interval),
                                   ("mini_batch_latency_ms", mini_batch_latency)) if v is not None}
    kafka = cfg.platform.kafka
    settings = StreamSettings(parallelism=parallelism or cfg.platform.flink.parallelism, partitions=kafka.partitions,
                              replication_factor=kafka.replication_factor, **overrides)
    sources = SourceSettings(cfg.platform.kafka.bootstrap_servers, cfg.data_storage)
    target = Target(cfg.project, RedisSettings.from_config(cfg), sources, cfg.state_dir,
                    check_jobmanager(jobmanager or cfg.platform.flink.jobmanager), cfg.key_ttl_seconds,
                    cfg.shared_storage)
    views, all_views = _views(cfg, names)
    stop = threading.Event()
    _stop_on_signals(stop)
    try:
        history = ParquetHistory(cfg.data_storage, cfg.registry_url, cfg.project, jobmanager=target.jobmanager,
                                 parallelism=settings.parallelism, storage=target.storage)
        runner = StreamRunner(target, views, all_views, settings, history, reset)
        redis_at = ",".join(f"{host}:{port}" for host, port in target.redis.nodes)
        click.echo(f"stream {runner.plan.name}: {', '.join(v.view.name for v in runner.plan.views)} -> Redis "
                   f"{'cluster ' if target.redis.cluster else ''}{redis_at}; status: featurectl stream --status")
        _record_online_versions(cfg, views, sources)
        runner.run(stop)
    except KafkaException as exc:
        raise click.ClickException(f"Kafka at {cfg.platform.kafka.bootstrap_servers}: {exc}; is it up? "
                                   "(`featurectl services up`)") from exc
    click.echo(f"stream {runner.plan.name} stopped; the next run resumes from its latest checkpoint")


COMMANDS = [stream]
