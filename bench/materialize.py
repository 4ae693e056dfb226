"""`featurectl bench materialize`: our materializer and Feast's own `materialize`, same offline data, same Redis.

Each side runs in its own process so that its peak resident memory is its own; both write a fresh project.
"""

from __future__ import annotations

import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import click
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import yaml

from bench._cli import featurectl
from bench._report import emit

ROOT = Path(__file__).resolve().parents[1]
VIEW = "bench_assets"
INT_COLUMNS = [f"i{i}" for i in range(10)]
FLOAT_COLUMNS = [f"f{i}" for i in range(8)]
STRING_COLUMNS = ["category", "creator"]

FEATURES_PY = f'''
from dsl import Attribute, Entity, EventSource, FeatureView, Float64, Int64, String, Timestamp
asset = Entity("asset", join_keys={{"asset_id": String}})
columns = {{"asset_id": String, "updated_at": Timestamp,
           **{{c: Int64 for c in {INT_COLUMNS!r}}}, **{{c: Float64 for c in {FLOAT_COLUMNS!r}}},
           **{{c: String for c in {STRING_COLUMNS!r}}}}}
source = EventSource("bench_source", columns, timestamp_field="updated_at", path="bench_source")
view = FeatureView("{VIEW}", asset, source, tile="1h", ttl="365d",
                   features=[Attribute(c) for c in columns if c not in ("asset_id", "updated_at")])
'''


def write_repo(folder: Path, project: str, online_store: Optional[dict] = None) -> Path:
    """The benchmark's repo under `folder`; `online_store`: Feast's settings (default: the example's Redis)."""
    repo = folder / project
    repo.mkdir(parents=True)
    (repo / "features.py").write_text(FEATURES_PY)
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = project
    if online_store is not None:
        settings["online_store"] = {"type": "redis", **online_store}
    settings["registry"]["path"] = f"sqlite:///{folder / project}.db"
    settings["platform"]["data_dir"] = str(folder / "data")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def offline_table(entities: int, end: dt.datetime, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    stamps = [end - dt.timedelta(seconds=int(s)) for s in rng.integers(60, 86_400, entities)]
    columns = {"asset_id": pa.array([f"asset_{i:07d}" for i in range(entities)]),
               "event_timestamp": pa.array(stamps, pa.timestamp("ms", "UTC"))}
    columns.update({c: pa.array(rng.integers(0, 1_000_000, entities)) for c in INT_COLUMNS})
    columns.update({c: pa.array(rng.normal(0, 1_000, entities)) for c in FLOAT_COLUMNS})
    columns.update({c: pa.array(rng.choice(["character", "vehicle", "building", "plant"], entities))
                    for c in STRING_COLUMNS})
    return pa.table(columns)


def run_side(side: str, repo: Path, start: str, end: str) -> dict:
    """One side, in this process: returns rows/s and this process's peak RSS (each side imports only what it
    runs: Feast's FeatureStore alone holds several hundred MB)."""
    from batch.materialize import materialize_view
    from dsl import load_repo
    from dsl.compile_feast import offline_table_path
    from common.config import load_config
    from redis_store.settings import RedisSettings

    cfg = load_config(repo)
    start_at, end_at = dt.datetime.fromisoformat(start), dt.datetime.fromisoformat(end)
    rows = ds.dataset(offline_table_path(cfg.data_dir, load_repo(repo).view(VIEW))).count_rows()
    began, cpu_before = time.perf_counter(), time.process_time()
    if side == "ours":
        view = load_repo(repo).view(VIEW)
        materialize_view(RedisSettings.from_config(cfg), view, cfg.project, offline_table_path(cfg.data_dir, view),
                         start_at, end_at)
    else:
        from feast import FeatureStore

        FeatureStore(config=cfg.feast_repo_config()).materialize(start_date=start_at, end_date=end_at,
                                                                 feature_views=[VIEW])
    seconds, cpu_s = time.perf_counter() - began, time.process_time() - cpu_before
    return {"rows": rows, "seconds": round(seconds, 3), "rows_per_s": round(rows / seconds, 1),
            "cpu_per_row_us": round(cpu_s / rows * 1e6, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def run_in_process(side: str, repo: Path, start: dt.datetime, end: dt.datetime) -> dict:
    code = ("import json, sys; from bench.materialize import run_side; "
            "print(json.dumps(run_side(*sys.argv[1:])))")
    done = subprocess.run([sys.executable, "-c", code, side, str(repo), start.isoformat(), end.isoformat()],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise click.ClickException(f"{side} materialization failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _drop_project(project: str, host_port: tuple[str, int]) -> None:
    import redis

    client = redis.Redis(*host_port)
    suffix = project.encode()
    for key in client.scan_iter(count=10_000):
        if key.endswith(suffix):
            client.delete(key)


@click.command()
@click.option("--entities", default=100_000, show_default=True)
@click.option("--seed", default=5, show_default=True)
def command(entities: int, seed: int) -> None:
    """100,000 entities x 20 features into the local Redis: ours vs Feast's materialize."""
    from dsl import load_repo
    from dsl.compile_feast import offline_table_path
    from common.config import load_config

    end = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    start = end - dt.timedelta(days=2)
    table = offline_table(entities, end, seed)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-materialize-") as scratch:
        for side in ("ours", "peer"):
            project = f"bench_mat_{side}_{int(time.time())}"
            repo = write_repo(Path(scratch), project)
            cfg = load_config(repo)
            path = offline_table_path(cfg.data_dir, load_repo(repo).view(VIEW))
            ds.write_dataset(table, path, format="parquet", existing_data_behavior="delete_matching")
            featurectl(repo, "apply")
            click.echo(f"{side}: materializing {entities:,} entities x 20 features ...", err=True)
            results[side] = run_in_process(side, repo, start, end)
            click.echo(f"{side}: {json.dumps(results[side])}", err=True)
            _drop_project(project, cfg.redis_host_port)
    metrics = ("rows_per_s", "peak_rss_mb")
    emit("materialize", {m: results["ours"][m] for m in metrics}, {m: results["peer"][m] for m in metrics},
         {"entities": entities, "features": 20, "seconds_ours": results["ours"]["seconds"],
          "seconds_peer": results["peer"]["seconds"], "peer_name": "feast 0.67 FeatureStore.materialize"})
