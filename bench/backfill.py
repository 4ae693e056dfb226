"""`featurectl bench backfill`: events/s through the batch backfill, training-set rows/s, and Feast beside them.

Synthetic history (feature_repo.sample_data) goes into a scratch data folder; the backfill runs over all of it
for every view of the example repo (Flink batch job, windows, Parquet), timed from the call to the recorded
range, JVM start included. Then a point-in-time training set of the `asset_ranking` service for random entity
rows (assets uniform, times uniform after the first day).

The peer is Feast's own `get_historical_features` (file offline store) over our offline tables, in its own
process with a time limit. It joins every entity row with every offline row of its entity before filtering,
so it cannot run a million rows: it runs on the first `--peer-rows` of the same entity rows, and ours runs on
that sample too: `ratio` compares ours at `--entity-rows` with Feast at `--peer-rows`, and params hold the
same-sample ratio. Feast cannot compute sliding windows from raw events (its local compute engine rejects
time-window aggregations), so events/s has no peer.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pandas as pd
import yaml

from bench._cli import featurectl
from bench._report import emit

ROOT = Path(__file__).resolve().parents[1]
SERVICE = "asset_ranking"
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


class StageClock:
    """A backfill progress sink that keeps how long each stage took."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def stage(self, name: str, total: int, unit: str) -> None:
        self.stop()
        self._current = (name, time.monotonic())

    def advance(self, n: int) -> None:
        pass

    def stop(self) -> None:
        if self._current:
            name, began = self._current
            self.seconds[name] = round(time.monotonic() - began, 2)
            self._current = None


def _write_repo(scratch: Path) -> Path:
    repo = scratch / "repo"
    repo.mkdir()
    (repo / "features.py").write_text((ROOT / "feature_repo" / "features.py").read_text())
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["registry"]["path"] = f"sqlite:///{scratch / 'registry.db'}"
    settings["platform"]["data_dir"] = str(scratch / "data")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def _entity_rows(n: int, n_assets: int, days: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng([seed, 3])
    first_ms = int(START.timestamp() * 1000) + 86_400_000
    times = rng.integers(first_ms, first_ms + (days - 1) * 86_400_000, n)
    return pd.DataFrame({"asset_id": np.char.add("asset_", np.char.zfill(rng.integers(0, n_assets, n).astype(str), 6)),
                         "event_timestamp": pd.to_datetime(times, unit="ms", utc=True)})


def run_feast(repo: Path, entities: Path) -> dict:
    """The peer, in this process: Feast's get_historical_features of the service for the entity rows."""
    from feast import FeatureStore

    store = FeatureStore(repo_path=str(repo))
    entity_df = pd.read_parquet(entities)
    began = time.monotonic()
    frame = store.get_historical_features(entity_df=entity_df, features=store.get_feature_service(SERVICE)).to_df()
    seconds = time.monotonic() - began
    return {"rows": len(entity_df), "rows_returned": len(frame), "seconds": seconds}


def _feast_peer(repo: Path, entities: Path, timeout: float) -> dict | None:
    code = ("import json, sys; from pathlib import Path; from bench.backfill import run_feast; "
            "print(json.dumps(run_feast(Path(sys.argv[1]), Path(sys.argv[2]))))")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(repo), str(entities)], capture_output=True, text=True,
                              cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode:
        raise click.ClickException(f"Feast's get_historical_features failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--events", default=10_000_000, show_default=True, help="synthetic interactions in the history")
@click.option("--days", default=10, show_default=True, help="days they span")
@click.option("--entity-rows", default=1_000_000, show_default=True, help="rows of the training set")
@click.option("--peer-rows", default=20_000, show_default=True, help="entity rows Feast gets (a sample)")
@click.option("--peer-timeout", default=600.0, show_default=True, help="seconds before Feast is given up on")
@click.option("--parallelism", default=2, show_default=True, help="Flink parallelism of the backfill")
@click.option("--seed", default=7, show_default=True)
def command(events: int, days: int, entity_rows: int, peer_rows: int, peer_timeout: float, parallelism: int,
            seed: int) -> None:
    """Batch backfill events/s and training-set rows/s, beside Feast's get_historical_features."""
    from batch.backfill import BackfillTarget, backfill
    from batch.training import get_historical_features
    from dsl import load_repo
    from feature_repo.sample_data import SampleSpec, write_history

    with tempfile.TemporaryDirectory(prefix="bench-backfill-") as folder:
        scratch = Path(folder)
        repo_dir = _write_repo(scratch)
        spec = SampleSpec(seed=seed)
        click.echo(f"writing {events:,} events over {days} days ...", err=True)
        write_history(spec, scratch / "data", int(START.timestamp() * 1000), days, events // days)
        repo = load_repo(repo_dir)

        clock = StageClock()
        summary = backfill(repo.views, START, START + dt.timedelta(days=days),
                           BackfillTarget(scratch / "data", f"sqlite:///{scratch / 'registry.db'}", "assets"),
                           parallelism=parallelism, progress=clock)
        clock.stop()
        click.echo(f"backfill: {summary.events_read:,} events in {summary.seconds:.1f} s", err=True)

        entity_df = _entity_rows(entity_rows, spec.n_assets, days, seed)
        began = time.monotonic()
        training = get_historical_features(entity_df, SERVICE, repo, scratch / "data")
        training_s = time.monotonic() - began
        sample = entity_df.iloc[:peer_rows]
        began = time.monotonic()
        get_historical_features(sample, SERVICE, repo, scratch / "data")
        sample_s = time.monotonic() - began
        click.echo(f"training set: {len(training):,} rows in {training_s:.1f} s", err=True)

        featurectl(repo_dir, "apply")
        sample.to_parquet(scratch / "entities.parquet")
        peer_run = _feast_peer(repo_dir, scratch / "entities.parquet", peer_timeout)

    ours = {"events_per_s": round(summary.events_read / summary.seconds),
            "training_rows_per_s": round(entity_rows / training_s)}
    peer = {"training_rows_per_s": round(peer_run["rows"] / peer_run["seconds"])} if peer_run else {}
    emit("backfill", ours, peer, {
        "events": summary.events_read, "days": days, "views": [v.name for v in repo.views],
        "rows_written": summary.rows_written, "backfill_s": round(summary.seconds, 1), "stage_s": clock.seconds,
        "flink_parallelism": parallelism, "entity_rows": entity_rows, "service": SERVICE,
        "training_s": round(training_s, 2),
        "peer": "Feast get_historical_features, file offline store, on our offline tables",
        "peer_rows": len(sample), "peer_rows_returned": peer_run["rows_returned"] if peer_run else None,
        "peer_s": round(peer_run["seconds"], 2) if peer_run else f"gave up after {peer_timeout:g} s",
        "ours_rows_per_s_on_peer_sample": round(len(sample) / sample_s),
        "ratio_on_peer_sample": round(peer_run["seconds"] / sample_s, 2) if peer_run else None,
        "events_per_s_peer": "none: Feast computes no sliding windows from raw events",
    })
