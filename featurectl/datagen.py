"""`featurectl datagen history | live | assets`: synthetic data for the example repo, from a fixed seed."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
from tqdm import tqdm

from featurectl.checkout import checkout_module


def _spec(seed: int, assets: int, users: int):
    return checkout_module("feature_repo.sample_data").SampleSpec(n_assets=assets, n_users=users, seed=seed)


@click.group()
def datagen() -> None:
    """Write synthetic history to Parquet, or produce live events into Kafka."""


@datagen.command()
@click.option("--start", default=None, help="first day, YYYY-MM-DD (default: DAYS days before today, UTC)")
@click.option("--days", default=3, show_default=True)
@click.option("--events-per-day", default=200_000, show_default=True)
@click.option("--assets", default=10_000, show_default=True)
@click.option("--users", default=50_000, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def history(ctx, start: str | None, days: int, events_per_day: int, assets: int, users: int, seed: int) -> None:
    """Parquet files of interactions (one per day) and the asset catalog, under the data folder."""
    write_history = checkout_module("feature_repo.sample_data").write_history

    cfg = ctx.config()
    today = dt.datetime.now(dt.timezone.utc).date()
    first = dt.date.fromisoformat(start) if start else today - dt.timedelta(days=days)
    start_ms = int(dt.datetime(first.year, first.month, first.day, tzinfo=dt.timezone.utc).timestamp() * 1000)
    data_dir = cfg.local_data_dir("featurectl datagen history")
    with tqdm(total=days * events_per_day, unit="ev", unit_scale=True, desc="history") as bar:
        stats = write_history(_spec(seed, assets, users), data_dir, start_ms, days, events_per_day,
                              on_day=bar.update)
    click.echo(f"wrote {stats['events']:,} events over {days} days from {first} and {assets:,} assets "
               f"to {stats['path']}")


@datagen.command()
@click.option("--rate", default=1_000.0, show_default=True, help="events per second")
@click.option("--seconds", default=30.0, show_default=True)
@click.option("--topic", default="asset_interactions", show_default=True)
@click.option("--assets", default=10_000, show_default=True)
@click.option("--users", default=50_000, show_default=True)
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def live(ctx, rate: float, seconds: float, topic: str, assets: int, users: int, seed: int) -> None:
    """Produce interactions into Kafka at a steady rate, stamped with the current time."""
    produce_live = checkout_module("feature_repo.sample_data").produce_live

    cfg = ctx.config()
    with tqdm(total=int(rate * seconds), unit="ev", unit_scale=True, desc=f"-> {topic}") as bar:
        sent = produce_live(_spec(seed, assets, users), cfg.platform.kafka.bootstrap_servers, topic, rate,
                            seconds, on_chunk=bar.update)
    click.echo(f"produced {sent:,} events to {topic} in {seconds:g}s")


@datagen.command()
@click.argument("n", type=click.IntRange(min=1))
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="folder for the meshes and assets.parquet (default: DATA_DIR/assets)")
@click.option("--seed", default=7, show_default=True)
@click.pass_obj
def assets(ctx, n: int, out: Path | None, seed: int) -> None:
    """N meshes of varied shapes (GLB/OBJ/PLY) and their list, assets.parquet."""
    write_assets = checkout_module("feature_repo.sample_meshes").write_assets

    out = out or ctx.config().data_dir / "assets"
    now_ms = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    with tqdm(total=n, unit="asset", desc="meshes") as bar:
        listing = write_assets(n, out, now_ms, seed, on_asset=bar.update)
    click.echo(f"wrote {n:,} meshes and their list {listing}")


COMMANDS = [datagen]
