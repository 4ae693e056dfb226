"""Synthetic but realistic data for the example repo, reproducible from a seed.

Asset popularity and user activity follow Zipf laws (a few assets take most views), event types are mostly
views (80 %), then likes, downloads and generations; dwell times are log-normal (median 8 s) and only set for
views; traffic follows a day/night cycle. The same generator writes Parquet history (one file per day) and
produces live events into Kafka, so backfills and streams see the same kind of data.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

EVENT_TYPES = np.array(["view", "like", "download", "generate"])
EVENT_TYPE_P = np.array([0.80, 0.10, 0.06, 0.04])
CATEGORIES = np.array(["character", "vehicle", "building", "weapon", "furniture", "plant", "accessory", "terrain"])
STYLES = np.array(["realistic", "low_poly", "cartoon", "voxel", "sci_fi", "medieval"])
DAY_MS = 86_400_000


@dataclass(frozen=True)
class SampleSpec:
    n_assets: int = 10_000
    n_users: int = 50_000
    n_creators: int = 2_000
    seed: int = 7


def asset_id(index: np.ndarray) -> np.ndarray:
    return np.char.add("asset_", np.char.zfill(index.astype(str), 6))


def user_id(index: np.ndarray) -> np.ndarray:
    return np.char.add("user_", np.char.zfill(index.astype(str), 6))


def _zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return weights / weights.sum()


def catalog_table(spec: SampleSpec, as_of_ms: int):
    """One row per asset: category, creator, style, bounding box (metres), polygon count, last update."""
    import pyarrow as pa

    rng = np.random.default_rng([spec.seed, 1])
    n = spec.n_assets
    bbox = rng.lognormal(mean=0.0, sigma=0.6, size=(n, 3)).round(3)
    return pa.table({
        "asset_id": asset_id(np.arange(n)),
        "category": rng.choice(CATEGORIES, n),
        "creator_id": np.char.add("creator_", rng.integers(0, spec.n_creators, n).astype(str)),
        "style": rng.choice(STYLES, n),
        "bbox_x": bbox[:, 0], "bbox_y": bbox[:, 1], "bbox_z": bbox[:, 2],
        "polygon_count": rng.lognormal(9.0, 1.0, n).astype(np.int64),
        "updated_at": as_of_ms - rng.integers(0, 30 * DAY_MS, n),
    })


def _diurnal_times(rng: np.random.Generator, start_ms: int, end_ms: int, n: int) -> np.ndarray:
    """Event times with more traffic in the (UTC) evening than at night, sorted."""
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        t = rng.integers(start_ms, end_ms, size=2 * (n - out.size))
        hour = (t % DAY_MS) / 3_600_000
        keep = rng.random(t.size) < (1 + 0.6 * np.sin(2 * np.pi * (hour - 12) / 24)) / 1.6
        out = np.concatenate([out, t[keep]])
    return np.sort(out[:n])


def interaction_columns(spec: SampleSpec, start_ms: int, end_ms: int, n_events: int, part: int) -> dict:
    """`n_events` interactions in [start_ms, end_ms), as numpy columns; `part` varies the seed."""
    rng = np.random.default_rng([spec.seed, 2, part])
    asset_rank = rng.choice(spec.n_assets, n_events, p=_zipf_probabilities(spec.n_assets, 1.1))
    user_rank = rng.choice(spec.n_users, n_events, p=_zipf_probabilities(spec.n_users, 0.8))
    kinds = rng.choice(EVENT_TYPES, n_events, p=EVENT_TYPE_P)
    dwell = rng.lognormal(np.log(8_000), 1.0, n_events).astype(np.int64)
    return {
        "asset_id": asset_id(asset_rank),
        "user_id": user_id(user_rank),
        "event_type": kinds,
        "dwell_ms": np.where(kinds == "view", dwell, -1),
        "event_time": _diurnal_times(rng, start_ms, end_ms, n_events),
    }


def interactions_table(spec: SampleSpec, start_ms: int, end_ms: int, n_events: int, part: int = 0):
    import pyarrow as pa

    cols = interaction_columns(spec, start_ms, end_ms, n_events, part)
    dwell = cols.pop("dwell_ms")
    table = pa.table({k: cols[k] for k in ("asset_id", "user_id", "event_type")})
    table = table.append_column("dwell_ms", pa.array(dwell, mask=dwell < 0, type=pa.int64()))
    return table.append_column("event_time", pa.array(cols["event_time"], type=pa.int64()))


def write_history(spec: SampleSpec, data_dir: Path, start_ms: int, days: int, events_per_day: int,
                  on_day: Optional[Callable[[int], None]] = None) -> dict:
    """Parquet history: `asset_interactions/day-YYYYMMDD.parquet` per day and `asset_catalog/catalog.parquet`.

    Replaces the history written before, so the folder always holds exactly one generated data set.
    """
    import pyarrow.parquet as pq

    events_dir, catalog_dir = data_dir / "asset_interactions", data_dir / "asset_catalog"
    events_dir.mkdir(parents=True, exist_ok=True)
    catalog_dir.mkdir(parents=True, exist_ok=True)
    for old in events_dir.glob("day-*.parquet"):
        old.unlink()
    pq.write_table(catalog_table(spec, start_ms), catalog_dir / "catalog.parquet")
    for day in range(days):
        day_start = start_ms + day * DAY_MS
        table = interactions_table(spec, day_start, day_start + DAY_MS, events_per_day, part=day)
        stamp = time.strftime("%Y%m%d", time.gmtime(day_start / 1000))
        pq.write_table(table, events_dir / f"day-{stamp}.parquet", row_group_size=256_000)
        if on_day:
            on_day(events_per_day)
    return {"assets": spec.n_assets, "days": days, "events": days * events_per_day, "path": str(data_dir)}


def live_events(spec: SampleSpec, chunk: int = 1_000) -> Iterator[list[dict]]:
    """Endless chunks of events stamped with the current wall-clock time, as JSON-ready dicts."""
    part = 1_000_000
    while True:
        now = int(time.time() * 1000)
        cols = interaction_columns(spec, now, now + 1, chunk, part)
        part += 1
        rows = []
        for i in range(chunk):
            row = {"asset_id": str(cols["asset_id"][i]), "user_id": str(cols["user_id"][i]),
                   "event_type": str(cols["event_type"][i]), "event_time": now}
            if cols["dwell_ms"][i] >= 0:
                row["dwell_ms"] = int(cols["dwell_ms"][i])
            rows.append(row)
        yield rows


def produce_live(spec: SampleSpec, bootstrap_servers: str, topic: str, rate: float, seconds: float,
                 on_chunk: Optional[Callable[[int], None]] = None) -> int:
    """Produce events at `rate` per second for `seconds`; returns how many were produced."""
    from common.event_producer import EventProducer

    producer = EventProducer(bootstrap_servers)
    chunk = max(1, min(1_000, int(rate / 20)))
    sent, started = 0, time.monotonic()
    for rows in live_events(spec, chunk):
        elapsed = time.monotonic() - started
        if elapsed >= seconds:
            break
        producer.produce(topic, rows, ("asset_id",))
        sent += len(rows)
        if on_chunk:
            on_chunk(len(rows))
        ahead = sent / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    producer.flush(30)
    return sent
