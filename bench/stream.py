"""`featurectl bench stream`: the streaming path on this machine, Kafka -> Flink -> Redis, beside Feast's `push`.

The example repo's asset views (`asset_activity`: windows 10m, 1h, 24h; `asset_attributes`) on topics of their
own, under a project of their own, through `featurectl stream` with its default settings, as a subprocess.
1. Sustained ingest: `--events` interactions (50 per ms of event time, ending now) are in Kafka before the job
   starts; events/s is the slope of the events the job has applied to Redis, from 10 % to 95 % of them
   (start-up excluded). The job's CPU per event is printed beside it, whole and split: its JVM, and its Python
   (the stream process and its window writers). Repeated per `--parallelism N` (each on fresh topics of N
   partitions); phases 2 and 3 run at the first one.
2. Freshness: `--live-rate` events/s produced live for `--live-seconds` (event time = now), among them a probe
   every `1 / --probes-per-s` s: a new asset whose key a poller reads from Redis every 5 ms. Produced-to-visible
   time of the probes gives p50/p99.
3. Keeping up: `--max-rate` events/s live for `--max-seconds`; the job keeps up when its clock (the newest event
   time it has written) stays within a few seconds of the wall clock.
Peer: the same events as rows of the view's push source through Feast's `FeatureStore.push` (online), 1,000 rows
per call: what a stream processor writing through Feast's API would get.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import click
import psutil
import redis
import yaml

from bench._cli import featurectl
from bench._cpu import process_cpu_s
from bench._report import emit, percentiles

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
EVENTS_PER_MS = 50  # event-time density of the backlog: 50,000 events per second
FEATURES_PY = """\
import dataclasses

from feature_repo import features as example

interactions = dataclasses.replace(example.interactions, kafka_topic={events!r})
catalog = dataclasses.replace(example.catalog, kafka_topic={catalog!r})
"""
VIEWS = ("asset_activity", "asset_attributes")
SOURCES = {"asset_activity": "interactions", "asset_attributes": "catalog"}


class Cpu(NamedTuple):
    """CPU seconds of a stream's processes: its own JVM (the whole job on the mini-cluster, the client on a
    session cluster), its Python processes, and the session cluster's JVMs."""

    jvm: float
    python: float
    cluster: float = 0.0


class Bench:
    """A scratch repo (own project and topics), its stream subprocess, and the clean-up of both."""

    def __init__(self, cfg, folder: Path, data_dir: Optional[Path] = None, views: tuple[str, ...] = VIEWS,
                 jobmanager: Optional[str] = None, cluster_pids: Sequence[int] = ()):
        """`jobmanager`: run the job on that session cluster instead of the mini-cluster; `cluster_pids`: its
        JobManager's and TaskManagers' JVMs, whose CPU is the job's there (they are not the stream's children)."""
        self.cfg = cfg
        self.jobmanager = jobmanager
        self.cluster_pids = tuple(cluster_pids)
        run = uuid.uuid4().hex[:8]
        self.project, self.events_topic, self.catalog_topic = f"streambench_{run}", f"bench-events-{run}", \
            f"bench-catalog-{run}"
        self.folder = folder / run
        self.folder.mkdir(parents=True)
        settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
        settings["project"] = self.project
        settings["registry"]["path"] = f"sqlite:///{self.folder / 'registry.db'}"
        settings["platform"]["state_dir"] = str(self.folder / "state")
        settings["platform"]["data_dir"] = str(data_dir or self.folder / "data")  # no history unless given
        (self.folder / "feature_store.yaml").write_text(yaml.safe_dump(settings))
        (self.folder / "features.py").write_text(FEATURES_PY.format(events=self.events_topic,
                                                                    catalog=self.catalog_topic) + "".join(
            f"{view} = dataclasses.replace(example.{view}, source={SOURCES[view]})\n" for view in views))
        self.bootstrap = cfg.platform.kafka.bootstrap_servers
        self.redis = redis.Redis(*cfg.redis_host_port)
        self.stream: Optional[subprocess.Popen] = None

    def create_topics(self, partitions: int) -> None:
        """The source topics with `partitions` partitions (the producer would create them with the broker's
        default, and a stream refuses a source topic with fewer partitions than its parallelism)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        topics = [NewTopic(t, partitions, 1) for t in (self.events_topic, self.catalog_topic)]
        for future in admin.create_topics(topics).values():
            future.result()

    def start_stream(self, parallelism: int = 1) -> None:
        log_file = (self.folder / "stream.log").open("w")
        target = ["--jobmanager", self.jobmanager] if self.jobmanager else []
        self.stream = subprocess.Popen([sys.executable, "-m", "featurectl", "--repo", str(self.folder), "stream",
                                        "--parallelism", str(parallelism), *target],
                                       cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def stop_stream(self) -> None:
        if self.stream is not None and self.stream.poll() is None:
            self.stream.send_signal(signal.SIGINT)
            self.stream.wait(timeout=120)

    def status(self) -> dict:
        path = next((self.folder / "state" / "stream").glob("*/status.json"), None)
        try:
            return json.loads(path.read_text()) if path else {}
        except ValueError:
            return {}

    def wait(self, ready, what: str, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if status and ready(status):
                return status
            if self.stream.poll() is not None:
                raise click.ClickException(f"`featurectl stream` exited while waiting for {what}; see "
                                           f"{self.folder / 'stream.log'}")
            time.sleep(0.25)
        raise click.ClickException(f"timed out waiting for {what}; see {self.folder / 'stream.log'}")

    def cpu_seconds(self) -> Cpu:
        """CPU time so far of the stream's JVM, of its Python processes (the stream and its window writers), and of
        the session cluster's JVMs with their children (none on the mini-cluster, which is the stream's JVM)."""
        proc = psutil.Process(self.stream.pid)
        jvm = python = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                seconds = sum(p.cpu_times()[:2])
                jvm, python = (jvm + seconds, python) if p.name() == "java" else (jvm, python + seconds)
            except psutil.NoSuchProcess:
                continue
        return Cpu(jvm, python, sum(process_cpu_s(pid) for pid in self.cluster_pids))

    def close(self, keep: bool) -> None:
        from confluent_kafka.admin import AdminClient

        self.stop_stream()
        status = self.status()
        topics = [self.events_topic, self.catalog_topic, f"{self.events_topic}.dead-letters",
                  f"{self.catalog_topic}.dead-letters", *status.get("topics", {}).get("tiles", [])]
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = list(admin.delete_topics(topics).values())
        if status.get("consumer_groups"):
            futures += list(admin.delete_consumer_groups(status["consumer_groups"]).values())
        for future in futures:
            try:
                future.result()
            except Exception as exc:  # one that was never created
                log.debug("cleaning up after the bench: %s", exc)
        for key in self.redis.scan_iter(match=b"*" + self.project.encode(), count=10_000):
            self.redis.delete(key)
        if not keep:
            shutil.rmtree(self.folder, ignore_errors=True)


def _producer(bootstrap: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4",
                     "queue.buffering.max.messages": 2_000_000, "batch.num.messages": 10_000})


def _templates(n: int, part: int) -> list[bytes]:
    """`n` interactions from the example data generator as JSON up to their event time: append it and `}`."""
    from feature_repo.sample_data import SampleSpec, interaction_columns

    cols = interaction_columns(SampleSpec(), 0, 1, n, part)
    assets, users, kinds, dwell = (cols[c].tolist() for c in ("asset_id", "user_id", "event_type", "dwell_ms"))
    out = []
    for i in range(n):
        event = {"asset_id": assets[i], "user_id": users[i], "event_type": kinds[i]}
        if dwell[i] >= 0:
            event["dwell_ms"] = dwell[i]
        out.append(json.dumps(event)[:-1].encode() + b', "event_time": ')
    return out


def produce_backlog(bench: Bench, n: int) -> None:
    """The events and the asset catalog, in Kafka before the job starts."""
    from feature_repo.sample_data import SampleSpec, catalog_table

    producer = _producer(bench.bootstrap)
    now = int(time.time() * 1000)
    for row in catalog_table(SampleSpec(), now - 60_000).to_pylist():
        producer.produce(bench.catalog_topic, json.dumps(row).encode())
    start = now - n // EVENTS_PER_MS
    for lo in range(0, n, 100_000):
        for i, template in enumerate(_templates(min(100_000, n - lo), lo), start=lo):
            producer.produce(bench.events_topic, template + str(start + i // EVENTS_PER_MS).encode() + b"}")
        producer.poll(0)
    producer.flush(120)


def sustained_rate(bench: Bench, n: int, timeout_s: float) -> dict:
    """Events/s the job applies while working through the backlog, and its CPU per event."""
    samples = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = bench.status().get("views", {}).get("asset_activity", {}).get("events", 0)
        samples.append((time.monotonic(), events, bench.cpu_seconds()))
        if events >= n:
            break
        time.sleep(0.5)
    started = [s for s in samples if s[1] >= 0.10 * n]
    if len(started) < 2:
        raise click.ClickException(f"the job applied {samples[-1][1]:,} of {n:,} events in {timeout_s:.0f}s; see "
                                   f"{bench.folder / 'stream.log'}")
    t1, e1, c1 = started[0]
    t2, e2, c2 = next((s for s in started if s[1] >= 0.95 * n), started[-1])
    per_event = lambda seconds: round(seconds / (e2 - e1) * 1e6, 1)  # noqa: E731
    jvm, python, cluster = (b - a for a, b in zip(c1, c2))
    out = {"events_per_s": round((e2 - e1) / (t2 - t1)), "cpu_us_per_event": per_event(jvm + python + cluster),
           "jvm_us_per_event": per_event(jvm + cluster), "writers_us_per_event": per_event(python),
           "applied": samples[-1][1]}
    if bench.cluster_pids:  # the JVM figure split: the job's TaskManagers (and JobManager), the stream's client JVM
        out.update(cluster_jvms_us_per_event=per_event(cluster), client_jvm_us_per_event=per_event(jvm))
    return out


class ProbePoller(threading.Thread):
    """Polls Redis every 5 ms for the probe assets produced so far; records produced-to-visible times."""

    def __init__(self, bench: Bench):
        super().__init__(daemon=True)
        from redis_store import layout as redis_layout
        from dsl import String

        self.encoder = redis_layout.KeyEncoder(bench.project, {"asset_id": String})
        self.field = redis_layout.ts_field("asset_activity")
        self.client = bench.redis
        self.pending: dict[bytes, float] = {}
        self.latencies_ms: list[float] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def add(self, asset: str, produced_at: float) -> None:
        with self.lock:
            self.pending[self.encoder.key([asset])] = produced_at

    def run(self) -> None:
        while not (self.done.is_set() and not self.pending):
            with self.lock:
                keys = list(self.pending)
            if keys:
                pipe = self.client.pipeline(transaction=False)
                for key in keys:
                    pipe.hexists(key, self.field)
                seen = time.time()
                for key, there in zip(keys, pipe.execute()):
                    if there:
                        with self.lock:
                            self.latencies_ms.append((seen - self.pending.pop(key)) * 1000)
            time.sleep(0.005)


def live(bench: Bench, rate: float, seconds: float, probes_per_s: float, part: int) -> dict:
    """Produce `rate` events/s stamped with the wall clock, with probes if asked; what the job showed meanwhile."""
    producer = _producer(bench.bootstrap)
    poller = ProbePoller(bench)
    poller.start()
    chunk = max(1, int(rate / 100))  # 10 ms of events at a time
    templates = _templates(int(rate * seconds) + chunk, part)
    started = time.time()
    sent = probes = 0
    next_look, lags = started, []
    while (now := time.time()) - started < seconds:
        stamp = str(int(now * 1000)).encode() + b"}"
        for template in templates[sent:sent + chunk]:
            producer.produce(bench.events_topic, template + stamp)
        sent += chunk
        if probes < (now - started) * probes_per_s:
            asset = f"probe_{part}_{probes:05d}"
            producer.produce(bench.events_topic, f'{{"asset_id": "{asset}", "user_id": "user_probe", '
                             f'"event_type": "view", "event_time": '.encode() + stamp)
            producer.poll(0)
            poller.add(asset, time.time())
            probes += 1
        producer.poll(0)
        if now >= next_look:
            head = bench.status().get("views", {}).get("asset_activity", {}).get("head_event_time")
            if head:
                lags.append(now - dt.datetime.fromisoformat(head).timestamp())
            next_look = now + 1.0
        time.sleep(max(0.0, started + sent / rate - time.time()))
    producer.flush(60)
    poller.done.set()
    poller.join(timeout=30)
    out = {"produced_per_s": round(sent / (time.time() - started)),
           "clock_lag_s": [round(x, 1) for x in lags[::max(1, len(lags) // 6)]],
           "keeps_up": bool(lags) and lags[-1] < 5.0}  # the job's clock within 5 s of the wall clock at the end
    if probes_per_s:
        figures = percentiles(poller.latencies_ms, (50, 99))
        out.update(probes=len(poller.latencies_ms), probes_not_seen=len(poller.pending),
                   p50_ms=round(figures["p50"], 1), p99_ms=round(figures["p99"], 1))
    return out


def feast_push_rate(bench: Bench, events: int) -> float:
    """Events/s through Feast's `FeatureStore.push` (online), one row per event, 1,000 rows per call."""
    import pandas as pd
    from feast import FeatureStore
    from feast.data_source import PushMode

    from common.config import load_config

    cfg = load_config(bench.folder)
    store = FeatureStore(config=cfg.feast_repo_config())
    view = store.get_feature_view("asset_activity")
    templates = _templates(events, 7)
    now = pd.Timestamp.now(tz="UTC")
    frames = []
    for lo in range(0, events, 1_000):
        rows = [json.loads(t + b"0}") for t in templates[lo:lo + 1_000]]
        frame = {"asset_id": [r["asset_id"] for r in rows], "event_timestamp": [now] * len(rows)}
        for feature in view.features:  # each event as a row of values (what a naive stream writer pushes)
            if feature.name.startswith("last_user"):
                frame[feature.name] = [r["user_id"] for r in rows]
            elif "mean" in feature.name:
                frame[feature.name] = [float(r.get("dwell_ms", 0)) for r in rows]
            else:
                frame[feature.name] = [1] * len(rows)
        frames.append(pd.DataFrame(frame))
    started = time.perf_counter()
    for frame in frames:
        store.push("asset_activity_push", frame, to=PushMode.ONLINE)
    return events / (time.perf_counter() - started)


def start_and_measure(bench: Bench, parallelism: int, events: int) -> dict:
    """The backlog into fresh topics of `parallelism` partitions, a stream at that parallelism, its sustained rate."""
    featurectl(bench.folder, "apply")
    bench.create_topics(parallelism)
    click.echo(f"producing {events:,} events and the catalog to {bench.events_topic} ({parallelism} partitions) ...")
    produce_backlog(bench, events)
    click.echo(f"starting `featurectl stream --parallelism {parallelism}` (default settings otherwise) ...")
    bench.start_stream(parallelism)
    bench.wait(lambda s: s.get("flink_status") == "RUNNING", "the job to run", 300)
    sustained = sustained_rate(bench, events, timeout_s=900)
    click.echo(f"sustained ingest at parallelism {parallelism}: {sustained}")
    return sustained


def sustained_at(cfg, parallelism: int, events: int, keep: bool = False, jobmanager: Optional[str] = None,
                 cluster_pids: Sequence[int] = ()) -> dict:
    """Sustained ingest alone, on a scratch repo of its own (on a session cluster when `jobmanager` is given)."""
    bench = Bench(cfg, cfg.state_dir / "bench-stream", jobmanager=jobmanager, cluster_pids=cluster_pids)
    try:
        return start_and_measure(bench, parallelism, events)
    finally:
        bench.close(keep)


@click.command()
@click.option("--events", default=2_000_000, show_default=True, help="backlog for the sustained-ingest figure")
@click.option("--live-rate", default=10_000.0, show_default=True, help="events/s of the freshness phase")
@click.option("--live-seconds", default=60.0, show_default=True)
@click.option("--probes-per-s", default=5.0, show_default=True)
@click.option("--max-rate", default=50_000.0, show_default=True, help="events/s of the keeping-up phase")
@click.option("--max-seconds", default=30.0, show_default=True)
@click.option("--peer-events", default=50_000, show_default=True)
@click.option("--parallelism", "parallelisms", type=click.IntRange(min=1), multiple=True, default=(1,),
              show_default=True, help="the stream's --parallelism; repeat it to measure sustained ingest at each "
              "(e.g. --parallelism 1 --parallelism 2)")
@click.option("--keep", is_flag=True, help="keep the scratch repo and its stream state")
@click.pass_obj
def command(ctx, events: int, live_rate: float, live_seconds: float, probes_per_s: float, max_rate: float,
            max_seconds: float, peer_events: int, parallelisms: tuple[int, ...], keep: bool) -> None:
    """Streaming: sustained events/s and produced-to-visible freshness, against Feast's push."""
    cfg = ctx.config()
    scaling = {p: sustained_at(cfg, p, events, keep) for p in parallelisms[1:]}
    bench = Bench(cfg, cfg.state_dir / "bench-stream")
    try:
        sustained = start_and_measure(bench, parallelisms[0], events)
        scaling = {parallelisms[0]: sustained, **scaling}
        fresh = live(bench, live_rate, live_seconds, probes_per_s, part=1)
        internal = bench.status().get("freshness", {})
        click.echo(f"freshness at {live_rate:,.0f} events/s: {fresh}; as the job reports it: {internal}")
        top = live(bench, max_rate, max_seconds, 0.0, part=2) if max_seconds else {}
        click.echo(f"live at {max_rate:,.0f} events/s: {top}")
        peer_rate = feast_push_rate(bench, peer_events)
        click.echo(f"Feast push: {peer_rate:,.0f} events/s")
    finally:
        bench.close(keep)
    if len(scaling) > 1:
        click.echo("sustained ingest by parallelism: " + ", ".join(
            f"p{p}: {s['events_per_s']:,} events/s, {s['cpu_us_per_event']} µs CPU/event" for p, s in scaling.items()))
    ours = {"events_per_s": sustained["events_per_s"], "freshness_p50_ms": fresh.get("p50_ms"),
            "freshness_p99_ms": fresh.get("p99_ms"), "cpu_us_per_event": sustained["cpu_us_per_event"],
            "job_reported_lag_p99_ms": internal.get("p99_ms"), f"live_{max_rate:.0f}_per_s": top,
            "sustained_by_parallelism": {f"p{p}": s for p, s in scaling.items()}}
    params = {"events": events, "live_rate": live_rate, "live_seconds": live_seconds, "probes": fresh.get("probes"),
              "views": ["asset_activity", "asset_attributes"], "peer_events": peer_events,
              "parallelism": list(parallelisms), "cpus": psutil.cpu_count(),
              "load_average": [round(x, 1) for x in psutil.getloadavg()]}
    emit("stream", ours, {"events_per_s": round(peer_rate)}, params)
