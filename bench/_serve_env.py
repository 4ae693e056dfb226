"""What the serving benchmarks share: the example repo under a project of their own, its assets written into Redis
by Feast, our server (or Feast's) as a subprocess, and the open-loop load generator run as its own process."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

import click
import numpy as np
import yaml

from bench._cli import featurectl

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


def bench_repo(folder: Path, project: str, definitions: str = "", platform: Optional[dict] = None,
               name: str = "repo") -> Path:
    """The example repo's definitions (plus `definitions`, Python appended to them) under `project`, as
    `folder/name`, its registry in `folder` (repos of other names there share it); without `platform` the yaml has
    no `platform` section, so that Feast's own server reads it."""
    repo = folder / name
    repo.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "feature_repo" / "features.py", repo / "features.py")
    if definitions:
        with (repo / "features.py").open("a") as out:
            out.write(definitions)
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings.pop("platform", None)
    if platform is not None:
        settings["platform"] = platform
    settings["project"] = project
    settings["registry"]["path"] = f"sqlite:///{folder / 'registry.db'}"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def apply_repo(repo: Path):
    """`featurectl apply`, then Feast's own store over the same registry."""
    from feast import FeatureStore

    from common.config import load_config

    featurectl(repo, "apply")
    return FeatureStore(config=load_config(repo).feast_repo_config())


def asset_frame(view, assets: int, rng: np.random.Generator):
    import pandas as pd

    from serving.catalog import value_type
    from dsl.types import ValueType

    now = pd.Timestamp.now(tz="UTC")
    frame = {"asset_id": [f"asset_{i:06d}" for i in range(assets)],
             "event_timestamp": now - pd.to_timedelta(rng.integers(60, 3600, assets), unit="s")}
    for feature in view.features:
        kind = value_type(feature.dtype)
        if kind is ValueType.STRING:
            frame[feature.name] = [f"{feature.name}_{v}" for v in rng.integers(0, 50, assets)]
        elif kind in (ValueType.FLOAT64, ValueType.FLOAT32):
            frame[feature.name] = rng.random(assets) * 1000
        else:
            frame[feature.name] = rng.integers(0, 5000, assets)
    return pd.DataFrame(frame)


def load_assets(store, assets: int, seed: int) -> None:
    """Feast's own write path fills Redis with `assets` assets of both asset views (the peer's write, our read:
    the compatibility direction); kept for 6 h per project."""
    import redis

    host, _, port = store.config.online_store.connection_string.split(",")[0].rpartition(":")
    client = redis.Redis(host=host, port=int(port))
    marker = f"featurectl:bench:serve:{store.project}"
    stored = json.loads(client.get(marker) or b"{}")
    if stored.get("assets") == assets and time.time() - stored.get("loaded_s", 0) < 6 * 3600:
        log.info("bench data already in Redis (%d assets)", assets)
        return
    rng = np.random.default_rng(seed)
    for name in ("asset_activity", "asset_attributes"):
        frame = asset_frame(store.get_feature_view(name), assets, rng)
        for start in range(0, assets, 20_000):
            started = time.perf_counter()
            store.write_to_online_store(name, frame.iloc[start:start + 20_000])
            log.info("%s: wrote rows %d..%d with Feast (%.0f rows/s)", name, start,
                     min(start + 20_000, assets), 20_000 / (time.perf_counter() - started))
    client.set(marker, json.dumps({"assets": assets, "loaded_s": time.time()}))


def _codes(column) -> tuple[list, np.ndarray]:
    import pandas as pd

    codes, seen = pd.factorize(column)
    return list(seen), codes


def record_profiles(store, repo: Path, assets: int, seed: int) -> None:
    """The profiles of the data `load_assets` writes (the same frames, from the same seed) as a backfill records them,
    so that the server samples and bins what it serves for its drift metrics, as it would in production."""
    import datetime as dt

    from common.config import load_config
    from common.feature_profile import categorical_profile, numeric_profile
    from common.quality_log import QualityLog, QualityRecord

    cfg, rng, now = load_config(repo), np.random.default_rng(seed), dt.datetime.now(dt.timezone.utc)
    quality_log = QualityLog(cfg.registry_url)
    try:
        for name in ("asset_activity", "asset_attributes"):
            frame, weights = asset_frame(store.get_feature_view(name), assets, rng), np.ones(assets)
            profiles = {f: (categorical_profile(*_codes(frame[f]), weights) if frame[f].dtype == object
                            else numeric_profile(frame[f].to_numpy(), weights)) for f in frame.columns[2:]}
            quality_log.record(QualityRecord(store.project, name, now - dt.timedelta(days=1), now, now, assets,
                                             profiles=profiles))
    finally:
        quality_log.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(command: list[str], port: int, log_path: Path) -> Iterator[int]:
    """The server's pid once it answers /health; stopped by SIGTERM (a graceful shutdown) when the block ends."""
    with log_path.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException(f"server `{' '.join(command)}` did not start; see {log_path}")
                time.sleep(0.5)
        yield process.pid
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()


def open_loop(port: int, bodies_file: Path, rate: float, seconds: float, samples: Optional[Path] = None,
              path: str = "/get-online-features", arrow: bool = False) -> dict:
    """`bench._http_load` in its own process: its JSON figures; `samples`, where it writes every latency (ms);
    `arrow`: Arrow IPC requests and answers instead of JSON."""
    extra = (["--samples", str(samples)] if samples else []) + ["--path", path] + (["--arrow"] if arrow else [])
    done = subprocess.run([sys.executable, "-m", "bench._http_load", "--port", str(port), "--bodies",
                           str(bodies_file), "--rate", str(rate), "--seconds", str(seconds), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise click.ClickException(f"load generator failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
