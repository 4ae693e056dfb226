"""`featurectl bench storage`: the same backfill and materialize with the data on local disk and in S3.

One synthetic history (feature_repo.sample_data, the example repo's sources) is written to a local folder and
copied to an S3 server; then, for each side in turn, `featurectl apply`, `featurectl backfill` of every view over
the whole history (Flink reads the history, featurectl writes the offline tables) and `featurectl materialize` of
every online view (featurectl reads the offline tables, writes Redis). The local side keeps the history, tiles and
tables in a folder (`platform.data_dir`); the S3 side puts them in the bucket (`platform.data_storage` and
`platform.shared_storage`), as `tests/reliability/test_shared_storage.py` does.

The S3 server is the run's own S3Proxy (what `featurectl services up --s3` starts, here on a free port under the
scratch folder, with a key pair of the run's), on this machine: its figure is the cost of going through the S3
API, its client libraries and Flink's S3 filesystem, not of a network or of a remote store's latency. `ours` is
the data in S3, `peer` the same on local disk, so `ratio` is S3's rows/s over local disk's. Backfill events/s are
the backfill's own timing (from the call to the recorded range, JVM start included, as `bench backfill`);
materialize rows/s are offline rows read over the materializer's seconds, summed over the views; table rows/s
are featurectl's own reads of the offline tables (pyarrow datasets, as `materialize` and `training-set` read them)
and writes of them (one Parquet file each, as `Storage.write_parquet`), without Redis or Flink in the way, in
`--table-rounds` rounds per side with the sides alternating. On a host busy with other work, one backfill per
side sees different minutes: compare the table figures, which share them, and repeat runs for the others.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import tempfile
import time
import uuid
from pathlib import Path

import click
import yaml

from bench._cli import featurectl
from bench._report import emit

ROOT = Path(__file__).resolve().parents[1]
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
BUCKET = "bench-storage"
# S3Proxy checks every request against one key pair; the run's own (its server answers nobody else)
KEYS = {"AWS_ACCESS_KEY_ID": "bench-storage", "AWS_SECRET_ACCESS_KEY": "bench-storage-secret"}
# botocore (s3fs, under Feast's offline store) asks for checksums S3Proxy does not implement unless told not to
BOTOCORE_CHECKSUMS = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                      "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}
BACKFILL_LINE = re.compile(r"backfilled \d+ views .*: ([\d,]+) rows read, ([\d,]+) rows written, ([\d.]+) s")
MATERIALIZE_LINE = re.compile(r"^(\w+): .*: ([\d,]+) rows read, .* ([\d.]+)s \(", re.MULTILINE)


def _write_repo(scratch: Path, side: str, platform: dict) -> Path:
    """The example repo as side `side`: its own project, registry and state folder, `platform` merged in."""
    repo = scratch / side / "repo"
    repo.mkdir(parents=True)
    (repo / "features.py").write_text((ROOT / "feature_repo" / "features.py").read_text())
    settings = yaml.safe_load((ROOT / "feature_repo" / "feature_store.yaml").read_text())
    settings["project"] = f"bench_storage_{side}_{uuid.uuid4().hex[:6]}"
    settings["registry"]["path"] = f"sqlite:///{scratch / side / 'registry.db'}"
    settings["platform"].update(state_dir=str(scratch / side / "state"), data_dir=str(scratch / side / "data"),
                                **platform)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    return repo


def _run_side(repo: Path, days: int, parallelism: int) -> dict:
    """apply, backfill and materialize; the figures each command printed."""
    end = START + dt.timedelta(days=days)
    featurectl(repo, "apply")
    out = featurectl(repo, "backfill", "--start", START.isoformat(), "--end", end.isoformat(),
                     "--parallelism", str(parallelism))
    found = BACKFILL_LINE.search(out)
    if not found:
        raise click.ClickException(f"no summary line in the backfill's output:\n{out[-2000:]}")
    events, written, backfill_s = int(found[1].replace(",", "")), int(found[2].replace(",", "")), float(found[3])
    out = featurectl(repo, "materialize", START.isoformat(), end.isoformat())
    views = {m[1]: (int(m[2].replace(",", "")), float(m[3])) for m in MATERIALIZE_LINE.finditer(out)}
    if not views:
        raise click.ClickException(f"no view lines in the materialization's output:\n{out[-2000:]}")
    rows, materialize_s = sum(r for r, _ in views.values()), sum(s for _, s in views.values())
    click.echo(f"{repo.parent.name}: backfill {events:,} events in {backfill_s:.1f} s; materialize {rows:,} rows "
               f"in {materialize_s:.1f} s", err=True)
    return {"backfill_events_per_s": round(events / backfill_s), "materialize_rows_per_s": round(rows / materialize_s),
            "backfill_s": backfill_s, "materialize_s": round(materialize_s, 2), "events": events,
            "rows_written": written, "rows_materialized": rows}


def _table_round(repo: Path) -> dict:
    """featurectl's own reads and writes of the offline tables (what `materialize` and `training-set` read through,
    without Redis or joins): every table the backfill wrote (an asset view has none) read whole, then written back
    as one Parquet file each beside them (left for the scratch folder's removal)."""
    from common.config import load_config
    from dsl import load_repo
    from dsl.compile_feast import offline_table_location

    storage = load_config(repo).data_storage
    began = time.monotonic()
    found = {view.name: offline_table_location(storage, view).dataset() for view in load_repo(repo).views}
    tables = {name: dataset.to_table() for name, dataset in found.items() if dataset is not None}
    read_s = time.monotonic() - began
    began = time.monotonic()
    for name, table in tables.items():
        storage.child("bench-copy").write_parquet(f"{name}.parquet", table)
    return {"table_rows": sum(t.num_rows for t in tables.values()), "table_read_s": read_s,
            "table_write_s": time.monotonic() - began, "table_mb": sum(t.nbytes for t in tables.values()) / 1e6}


def _table_io(repos: dict[str, Path], rounds: int) -> dict[str, dict]:
    """`rounds` table rounds per side, the sides alternating (local, S3, S3, local, ...) so that both see the
    same minutes of a busy host; rows/s over the summed seconds."""
    summed = ("table_rows", "table_read_s", "table_write_s")
    totals: dict[str, dict] = {name: dict.fromkeys(summed, 0) for name in repos}
    for i in range(rounds):
        for name in (list(repos) if i % 2 == 0 else list(repos)[::-1]):
            done = _table_round(repos[name])
            for key in summed:
                totals[name][key] += done[key]
            totals[name]["table_mb_per_round"] = round(done["table_mb"], 1)
    for name, t in totals.items():
        click.echo(f"{name}: tables read {rounds} times, {t['table_rows']:,} rows, in {t['table_read_s']:.1f} s, "
                   f"written in {t['table_write_s']:.1f} s", err=True)
        t.update(table_read_rows_per_s=round(t["table_rows"] / t["table_read_s"]),
                 table_write_rows_per_s=round(t["table_rows"] / t["table_write_s"]),
                 table_read_s=round(t["table_read_s"], 2), table_write_s=round(t["table_write_s"], 2))
    return totals


def _upload(folder: Path, storage) -> float:
    """Copy the history's files to shared storage; seconds taken."""
    from pyarrow import fs

    filesystem, path = storage.located()
    began = time.monotonic()
    fs.copy_files(str(folder), path, source_filesystem=fs.LocalFileSystem(), destination_filesystem=filesystem)
    return time.monotonic() - began


@click.command()
@click.option("--events", default=600_000, show_default=True, help="synthetic interactions in the history")
@click.option("--days", default=3, show_default=True, help="days they span")
@click.option("--parallelism", default=2, show_default=True, help="Flink parallelism of the backfill")
@click.option("--table-rounds", default=5, show_default=True, help="times the offline tables are read and written")
@click.option("--seed", default=7, show_default=True)
def command(events: int, days: int, parallelism: int, table_rounds: int, seed: int) -> None:
    """Backfill events/s and materialize rows/s with the data in S3 (S3Proxy) against local disk."""
    from common.config import load_config
    from featurectl.services.s3_server import S3Server
    from featurectl.services.scratch_redis import free_port
    from feature_repo.sample_data import SampleSpec, write_history

    os.environ.update({**KEYS, **BOTOCORE_CHECKSUMS})
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as folder:
        scratch = Path(folder)
        local = _write_repo(scratch, "local", {})
        port = free_port()
        s3 = _write_repo(scratch, "s3", {"s3": {"endpoint": f"http://127.0.0.1:{port}", "local_port": port,
                                                "path_style_access": True},
                                         "shared_storage": f"s3://{BUCKET}/shared",
                                         "data_storage": f"s3://{BUCKET}/data"})
        click.echo(f"writing {events:,} events over {days} days ...", err=True)
        history_dir = load_config(local).data_dir
        write_history(SampleSpec(seed=seed), history_dir, int(START.timestamp() * 1000), days, events // days)
        history_mb = sum(p.stat().st_size for p in history_dir.rglob("*") if p.is_file()) / 1e6
        server = S3Server(load_config(s3))
        click.echo(server.up(), err=True)
        try:
            upload_s = _upload(history_dir, load_config(s3).data_storage)
            repos, sides = {"local": local, "s3": s3}, {}
            try:
                for name, repo in repos.items():
                    sides[name] = _run_side(repo, days, parallelism)
                for name, figures in _table_io(repos, table_rounds).items():
                    sides[name].update(figures)
            finally:
                for repo in repos.values():
                    featurectl(repo, "teardown", "--yes")
        finally:
            click.echo(server.down(), err=True)
    figures = ("backfill_events_per_s", "materialize_rows_per_s", "table_read_rows_per_s", "table_write_rows_per_s")
    emit("storage", {k: sides["s3"][k] for k in figures}, {k: sides["local"][k] for k in figures}, {
        "ours": "data in S3 (S3Proxy on 127.0.0.1, filesystem backend)", "peer": "the same on local disk",
        "events": events, "days": days, "history_mb": round(history_mb, 1), "flink_parallelism": parallelism,
        "upload_mb_per_s": round(history_mb / upload_s, 1), "local": sides["local"], "s3": sides["s3"],
        "order": "backfill and materialize: local, then S3, once each; table rounds alternating",
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]})
