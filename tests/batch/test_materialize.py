"""Materialization into the real Redis: Feast's semantics, read back by Feast; Feast's writes read back by us."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import redis

from cli_helpers import copy_example_repo, featurectl, sibling
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.types import ValueType
from redis_store import layout
from redis_store.freshness import record_key
from redis_store.freshness_history import history_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
in_process = sibling("version_env", "featurectl").run  # the CLI in this process: a subprocess costs seconds of imports
NOW = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
VIEW = "asset_activity"


def _make_repo(tmp: Path, project: str) -> Path:
    return copy_example_repo(tmp, project, {"path": f"sqlite:///{tmp / project}.db"}, data_dir=tmp / "data")


def _random_column(rng: np.random.Generator, kind: ValueType, n: int) -> pa.Array:
    """Random values, 10 % NULL except in integer columns: Feast's own materialize reads a nullable integer
    column through pandas as float64 and then rejects it, so such data could not take the Feast -> us path."""
    if kind is ValueType.INT64:
        return pa.array(rng.integers(0, 100_000, n))
    if kind is ValueType.FLOAT64:
        return pa.array(rng.normal(5_000, 2_000, n), mask=rng.random(n) < 0.1)
    return pa.array([f"user_{i}" for i in rng.integers(0, 1_000, n)], mask=rng.random(n) < 0.1)


def _offline_table(view, n_entities: int, rows_per_entity: int, seed: int) -> pa.Table:
    """Several rows per entity at distinct hours within the last day, shuffled."""
    rng = np.random.default_rng(seed)
    n = n_entities * rows_per_entity
    ids = np.repeat([f"asset_{i:06d}" for i in range(n_entities)], rows_per_entity)
    hours = np.concatenate([rng.choice(np.arange(1, 24), rows_per_entity, replace=False)
                            for _ in range(n_entities)])
    stamps = pa.array([NOW - dt.timedelta(hours=int(h)) for h in hours], pa.timestamp("ms", "UTC"))
    columns = {"asset_id": pa.array(ids), EVENT_TIMESTAMP: stamps}
    for name, kind in view.output_schema().items():
        columns[name] = _random_column(rng, kind, n)
    table = pa.table(columns).take(pa.array(rng.permutation(n)))
    dates = pa.array([t.strftime("%Y-%m-%d") for t in table.column(EVENT_TIMESTAMP).to_pylist()])
    return table.append_column("date", dates)


def _write_offline(table: pa.Table, path: Path) -> None:
    ds.write_dataset(table, path, format="parquet", partitioning=ds.partitioning(pa.schema([("date", pa.string())])),
                     existing_data_behavior="delete_matching")


def expected_latest(table: pa.Table, start: dt.datetime, end: dt.datetime) -> dict[str, dict]:
    latest: dict[str, dict] = {}
    for row in table.to_pylist():
        if start <= row[EVENT_TIMESTAMP] <= end:
            current = latest.get(row["asset_id"])
            if current is None or row[EVENT_TIMESTAMP] >= current[EVENT_TIMESTAMP]:
                latest[row["asset_id"]] = row
    return latest


@pytest.fixture(scope="module")
def setup(tmp_path_factory, local_services):
    tmp = tmp_path_factory.mktemp("materialize")
    view = load_repo(ROOT / "feature_repo").view(VIEW)
    table = _offline_table(view, n_entities=300, rows_per_entity=4, seed=11)
    return tmp, view, table


def _apply(repo: Path) -> None:
    in_process(repo, "apply")


def read_ours(client, project: str, view, ids: list[str]) -> list[dict]:
    encoder = layout.KeyEncoder(project, view.entity.join_keys)
    names = list(view.output_schema())
    fields = layout.hash_fields(view.name, names)
    pipe = client.pipeline(transaction=False)
    for key in encoder.keys([ids]):
        pipe.hmget(key, fields)
    return [dict(zip(names, map(layout.decode_value, values[:-1]))) for values in pipe.execute()]


def test_our_materializer_is_read_identically_by_feast(setup, local_services):
    from feast import FeatureStore

    tmp, view, table = setup
    project = f"mat_ours_{uuid.uuid4().hex[:8]}"
    repo = _make_repo(tmp, project)
    _write_offline(table, offline_table_path(tmp / "data", view))
    _apply(repo)
    start, end = NOW - dt.timedelta(hours=20), NOW - dt.timedelta(hours=2)
    done = in_process(repo, "materialize", start.isoformat(), end.isoformat(), "--view", VIEW)
    assert "rows read" in done.stdout

    expected = expected_latest(table, start, end)
    ids = sorted(expected) + ["asset_missing"]
    store = FeatureStore(repo_path=str(repo))
    names = list(view.output_schema())
    got = store.get_online_features(features=[f"{VIEW}:{n}" for n in names],
                                    entity_rows=[{"asset_id": i} for i in ids]).to_dict()
    for row_index, asset_id in enumerate(ids):
        for name in names:
            want = expected.get(asset_id, {}).get(name)
            assert got[name][row_index] == want, (asset_id, name)
    view_record = store.get_feature_view(VIEW)
    assert view_record.materialization_intervals[-1][1] == end

    client = redis.Redis(*local_services.redis_host_port)
    in_process(repo, "materialize", (NOW - dt.timedelta(hours=23)).isoformat(),
               (NOW - dt.timedelta(hours=21)).isoformat(), "--view", VIEW)
    assert read_ours(client, project, view, sorted(expected)) == [
        {n: expected[i][n] for n in names} for i in sorted(expected)], "an older row overwrote a newer one"
    cleanup(client, project)


def test_key_ttl_seconds_from_feature_store_yaml_expires_materialized_keys(setup, local_services):
    tmp, view, table = setup
    project = f"mat_ttl_{uuid.uuid4().hex[:8]}"
    host, port = local_services.redis_host_port
    repo = copy_example_repo(tmp, project, {"path": f"sqlite:///{tmp / project}.db"},
                             {"type": "redis", "connection_string": f"{host}:{port}", "key_ttl_seconds": 3600},
                             data_dir=tmp / "data")
    _write_offline(table, offline_table_path(tmp / "data", view))
    _apply(repo)
    start, end = NOW - dt.timedelta(hours=20), NOW - dt.timedelta(hours=2)
    in_process(repo, "materialize", start.isoformat(), end.isoformat(), "--view", VIEW)
    client = redis.Redis(host, port)
    keys = list(client.scan_iter(match=f"*{project}".encode(), count=1_000))
    assert len(keys) == len(expected_latest(table, start, end))
    ttls = [client.ttl(k) for k in keys]
    assert min(ttls) >= 3500 and max(ttls) <= 3600, (min(ttls), max(ttls))
    cleanup(client, project)


def test_feast_materialize_is_read_identically_by_us(setup, local_services):
    from feast import FeatureStore

    tmp, view, table = setup
    project = f"mat_feast_{uuid.uuid4().hex[:8]}"
    repo = _make_repo(tmp, project)
    _write_offline(table, offline_table_path(tmp / "data", view))
    _apply(repo)
    start, end = NOW - dt.timedelta(hours=20), NOW - dt.timedelta(hours=2)
    store = FeatureStore(repo_path=str(repo))
    store.materialize(start_date=start, end_date=end, feature_views=[VIEW])

    expected = expected_latest(table, start, end)
    client = redis.Redis(*local_services.redis_host_port)
    ids = sorted(expected)
    names = list(view.output_schema())
    assert read_ours(client, project, view, ids) == [{n: expected[i][n] for n in names} for i in ids]
    cleanup(client, project)


def test_missing_offline_table_says_what_to_run(tmp_path, local_services):
    repo = _make_repo(tmp_path, f"mat_none_{uuid.uuid4().hex[:8]}")
    _apply(repo)
    done = featurectl("--repo", str(repo), "materialize", "2026-01-01", "2026-01-02", "--view", VIEW)
    assert done.returncode != 0
    assert "has no offline table" in done.stderr and "featurectl backfill" in done.stderr


def cleanup(client, project: str) -> None:
    client.delete(record_key(project), history_key(project))
    suffix = project.encode()
    keys = [key for key in client.scan_iter(count=10_000) if key.endswith(suffix)]
    for lo in range(0, len(keys), 1_000):
        client.delete(*keys[lo:lo + 1_000])


def test_a_recomputed_offline_table_reaches_redis_when_its_range_is_materialized_again(setup, local_services):
    """A backfill that recomputes values without moving any boundary (an event pushed into the history within a
    tile already counted) leaves every `_ts` as it was: materializing the range again must still serve the new
    values (no stream writes this view, so an equal `_ts` is only the earlier materialization's)."""
    tmp, view, table = setup
    project = f"mat_again_{uuid.uuid4().hex[:8]}"
    repo = _make_repo(tmp, project)
    path = offline_table_path(tmp / "data", view)
    _write_offline(table, path)
    _apply(repo)
    start, end = NOW - dt.timedelta(hours=23), NOW
    in_process(repo, "materialize", start.isoformat(), end.isoformat(), "--view", VIEW)
    rng = np.random.default_rng(99)
    recomputed = table
    for name, kind in view.output_schema().items():
        index = recomputed.schema.get_field_index(name)
        recomputed = recomputed.set_column(index, name, _random_column(rng, kind, table.num_rows))
    _write_offline(recomputed, path)
    again = in_process(repo, "materialize", start.isoformat(), end.isoformat(), "--view", VIEW)
    expected = expected_latest(recomputed, start, end)
    client = redis.Redis(*local_services.redis_host_port)
    names = list(view.output_schema())
    assert read_ours(client, project, view, sorted(expected)) == [
        {n: expected[i][n] for n in names} for i in sorted(expected)], again.stdout
    cleanup(client, project)


def _dump(client, project: str) -> dict[bytes, dict]:
    suffix = project.encode()
    keys = [key for key in client.scan_iter(count=10_000) if key.endswith(suffix)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    return {key[:-len(suffix)]: fields for key, fields in zip(keys, pipe.execute())}


def test_interrupted_materialization_rerun_equals_one_clean_run(tmp_path, local_services):
    """SIGKILL halfway through, run again: Redis holds exactly what one uninterrupted run writes."""
    import signal
    import subprocess
    import sys
    import time

    view = load_repo(ROOT / "feature_repo").view(VIEW)
    table = _offline_table(view, n_entities=30_000, rows_per_entity=2, seed=23)
    start, end = NOW - dt.timedelta(hours=23), NOW
    client = redis.Redis(*local_services.redis_host_port)
    dumps = []
    for interrupted in (True, False):
        project = f"mat_kill_{uuid.uuid4().hex[:8]}"
        repo = _make_repo(tmp_path, project)
        _write_offline(table, offline_table_path(tmp_path / "data", view))
        _apply(repo)
        args = ["materialize", start.isoformat(), end.isoformat(), "--view", VIEW]
        if interrupted:
            baseline = client.dbsize()
            proc = subprocess.Popen([sys.executable, "-m", "featurectl", "--repo", str(repo), *args], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 120
            while client.dbsize() - baseline < 2_000 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert 0 < len(_dump(client, project)) < 30_000, "the kill did not land halfway"
        in_process(repo, *args)  # the rerun, or the clean run
        dumps.append(_dump(client, project))
        cleanup(client, project)
    assert len(dumps[0]) == 30_000 and dumps[0] == dumps[1]


def test_a_far_future_end_needs_force_and_incremental_runs_go_on(tmp_path, local_services):
    """A recorded end past now + 1 day (only with --force) is passed over by materialize-incremental, which would
    otherwise start from it and read nothing for ever; an incremental run past END has nothing to do."""
    view = load_repo(ROOT / "feature_repo").view(VIEW)
    table = _offline_table(view, n_entities=40, rows_per_entity=3, seed=5)
    project = f"mat_future_{uuid.uuid4().hex[:8]}"
    repo = _make_repo(tmp_path, project)
    _write_offline(table, offline_table_path(tmp_path / "data", view))
    _apply(repo)
    start = (NOW - dt.timedelta(days=1)).isoformat()

    def run(*args: str):
        return in_process(repo, *args, "--view", VIEW)

    refused = featurectl("--repo", str(repo), "materialize", start, "9999-12-31T23:59:59", "--view", VIEW)
    assert refused.returncode == 1 and "is more than 1 day after now" in refused.stderr, refused.stderr
    assert "or pass --force" in refused.stderr and "Traceback" not in refused.stderr
    run("materialize", start, "9999-12-31T23:59:59", "--force")
    incremental = run("materialize-incremental", NOW.isoformat())
    assert f"warning: `{VIEW}` was materialized up to 9999-12-31T23:59:59+00:00" in incremental.stderr
    assert f": {table.num_rows} rows read" in incremental.stdout, incremental.stdout
    behind = run("materialize-incremental", (NOW - dt.timedelta(hours=1)).isoformat())
    assert "nothing to do" in behind.stdout, behind.stdout + behind.stderr
    cleanup(redis.Redis(*local_services.redis_host_port), project)


def _fault_env():
    """`tests/reliability/fault_env.py`, whose private services run on free ports: stopping one of them never
    touches the shared Redis."""
    import importlib.util
    import sys

    if "fault_env" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fault_env", ROOT / "tests" / "reliability" / "fault_env.py")
        sys.modules["fault_env"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["fault_env"])
    return sys.modules["fault_env"]


def test_redis_stopped_during_materialize_is_one_line(tmp_path):
    import subprocess
    import sys
    import time

    view = load_repo(ROOT / "feature_repo").view(VIEW)
    table = _offline_table(view, n_entities=60_000, rows_per_entity=1, seed=29)
    services = _fault_env().PrivateServices(tmp_path / "services")
    try:
        services.redis.up()
        repo = copy_example_repo(tmp_path, "mat_stopped", {"path": f"sqlite:///{tmp_path / 'registry.db'}"},
                                 {"type": "redis", "connection_string": f"127.0.0.1:{services.redis_port}"},
                                 data_dir=tmp_path / "data")
        _write_offline(table, offline_table_path(tmp_path / "data", view))
        _apply(repo)
        client = redis.Redis("127.0.0.1", services.redis_port)
        with (tmp_path / "stderr").open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "featurectl", "--repo", str(repo), "materialize",
                                     (NOW - dt.timedelta(days=1)).isoformat(), NOW.isoformat(), "--view", VIEW],
                                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while client.dbsize() == 0 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        written = client.dbsize()
        services.kill(services.redis)
        proc.wait(120)
    finally:
        services.down()
    assert 0 < written < table.num_rows, "Redis did not stop during the writes"
    stderr = (tmp_path / "stderr").read_text()
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and f"cannot reach redis at 127.0.0.1:{services.redis_port}" in errors[0], stderr
