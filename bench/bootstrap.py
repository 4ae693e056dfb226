"""`featurectl bench bootstrap`: how long a stream takes to start over history, against replaying it from Kafka.

The example's `asset_activity` view (windows 10m, 1h, 24h) over two days of interactions for `--entities` assets
(every asset has some; `--events` in all), ending a minute ago.
- Ours: the history in Parquet; `featurectl stream` from its start until it runs with every entity's windows
  filled from the history (the Flink batch export of the tiles before the cutover, their load into the window
  writer, the first write of every entity to Redis) and its Flink job running.
- Peer: no history, the same events in Kafka: `featurectl stream` from its start until it has applied the
  longest window's worth of them, which is how a stream fills its windows without a batch side.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._report import emit
from bench.stream import Bench, _producer

MINUTE, DAY = 60_000, 86_400_000
EVENT_TYPES = np.array(["view", "view", "view", "like", "download", "generate"])


def history(entities: int, events: int, end_ms: int, seed: int = 7) -> pa.Table:
    """Interactions over the two days before `end_ms`: one per asset in the last day (so every asset has windows
    to start from), the rest spread over both days by a Zipf law."""
    rng = np.random.default_rng(seed)
    extra = max(events - entities, 0)
    assets = np.concatenate([np.arange(entities), rng.zipf(1.3, extra) % entities])
    times = np.concatenate([rng.integers(end_ms - DAY, end_ms, entities),
                            rng.integers(end_ms - 2 * DAY, end_ms, extra)])
    order = np.argsort(times, kind="stable")
    assets, times = assets[order], times[order]
    kinds = EVENT_TYPES[rng.integers(0, len(EVENT_TYPES), len(assets))]
    dwell = rng.lognormal(np.log(8_000), 1.0, len(assets)).astype(np.int64)
    return pa.table({
        "asset_id": pa.array(np.char.add("asset_", np.char.zfill(assets.astype(str), 6))),
        "user_id": pa.array(np.char.add("user_", rng.integers(0, 50_000, len(assets)).astype(str))),
        "event_type": pa.array(kinds),
        "dwell_ms": pa.array(dwell, mask=kinds != "view"),
        "event_time": pa.array(times),
    })


def _started(bench: Bench, ready, what: str) -> tuple[float, dict]:
    began = time.monotonic()
    bench.start_stream()
    status = bench.wait(ready, what, timeout_s=1_800)
    return time.monotonic() - began, status


def ours(cfg, folder: Path, table: pa.Table) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="history-", dir=folder))
    (data / "asset_interactions").mkdir()
    pq.write_table(table, data / "asset_interactions" / "history.parquet")
    bench = Bench(cfg, folder, data_dir=data, views=("asset_activity",))
    try:
        seconds, status = _started(bench, lambda s: s.get("state") == "running", "the stream to start over history")
    finally:
        bench.close(keep=False)
        shutil.rmtree(data, ignore_errors=True)
    history = status["generation"]["history"]
    loaded = history["views"]["asset_activity"]
    return {"bootstrap_s": round(seconds, 1), "entities": loaded["entities"], "tiles": loaded["tiles"],
            "export_s": history["export_s"], "load_s": history["load_s"], "catch_up_s": history["catch_up_s"],
            "redis_writes": status["views"]["asset_activity"]["redis_writes"]}


def peer(cfg, folder: Path, table: pa.Table, lookback_ms: int, end_ms: int) -> dict:
    bench = Bench(cfg, folder, views=("asset_activity",))
    try:
        recent = table.filter(pc.greater_equal(table["event_time"], end_ms - lookback_ms))
        producer = _producer(bench.bootstrap)
        for row in recent.to_pylist():
            producer.produce(bench.events_topic, json.dumps({k: v for k, v in row.items() if v is not None}).encode())
            producer.poll(0)
        producer.flush(300)
        n = recent.num_rows
        seconds, status = _started(bench, lambda s: s.get("views", {}).get("asset_activity", {}).get("events") == n,
                                   f"the stream to apply the {n:,} events of its longest window")
    finally:
        bench.close(keep=False)
    return {"bootstrap_s": round(seconds, 1), "events_replayed": n,
            "entities_held": status["views"]["asset_activity"].get("entities")}


@click.command()
@click.option("--entities", default=100_000, show_default=True, help="assets, each with some history")
@click.option("--events", default=2_000_000, show_default=True, help="events over the two days of history")
@click.option("--peer/--no-peer", "with_peer", default=True, help="also replay the longest window from Kafka")
@click.pass_obj
def command(ctx, entities: int, events: int, with_peer: bool) -> None:
    """A stream's start over two days of history: from Parquet (ours) against a replay from Kafka (peer)."""
    cfg = ctx.config()
    folder = cfg.state_dir / "bench-bootstrap"
    end_ms = int(time.time() * 1000) - MINUTE
    table = history(entities, events, end_ms)
    click.echo(f"history: {table.num_rows:,} events of {entities:,} assets over two days")
    mine = ours(cfg, folder, table)
    click.echo(f"from Parquet: {mine}")
    theirs = {}
    if with_peer:
        from dsl.compile_flink import SourceSettings, compile_view
        from feature_repo.features import asset_activity

        compiled = compile_view(asset_activity, SourceSettings("", cfg.data_dir))
        theirs = peer(cfg, folder, table, compiled.lookback_ms, end_ms)  # what a stream reads back
        click.echo(f"replayed from Kafka: {theirs}")
    params = {"entities": entities, "events": table.num_rows, "view": "asset_activity",
              "load_average": [round(x, 1) for x in psutil.getloadavg()]}
    emit("bootstrap", mine, theirs, params)
