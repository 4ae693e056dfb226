"""`materialize` refuses offline rows whose backfill failed a data-quality check, with a report naming the feature,
the expectation and sample rows, until a backfill of the range passes or `--allow-failed-checks` names the view;
`backfill` prints the results. Against the shared Redis, in-process, with a registry of the test's own; the
offline table is written by the backfill's own writer and checked by the backfill's own check (no Flink job)."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from version_env import make_repo, run

from batch.offline_table import RangeWriter
from batch.quality import check_backfill
from common.config import load_config
from dsl import String, load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from featurectl.quality_checks import FailedChecksError, print_backfill_checks
from redis_store import layout

pytestmark = pytest.mark.integration

VIEW = "asset_attributes"
NOW = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
START, END = NOW - dt.timedelta(days=1), NOW


def _backfill(repo: Path, styles: list[str], hours_ago: int = 2):
    """What `featurectl backfill` does after its Flink job: the range's rows written, checked and recorded. One
    row per asset `a{i}`, `hours_ago`, with style `styles[i]`."""
    cfg = load_config(repo)
    view = load_repo(repo).view(VIEW)
    n = len(styles)
    rows = {"asset_id": [f"a{i}" for i in range(n)],
            EVENT_TIMESTAMP: pa.array([NOW - dt.timedelta(hours=hours_ago)] * n, pa.timestamp("ms", "UTC")),
            "category": ["plant"] * n, "creator_id": ["c1"] * n, "style": styles,
            "bbox_x": [1.0] * n, "bbox_y": [2.0] * n, "bbox_z": [0.5] * n, "polygon_count": [100] * n}
    table = pa.table(rows)
    start_ms, end_ms = (int(t.timestamp() * 1000) for t in (START, END))
    with RangeWriter(offline_table_path(cfg.data_dir, view), table.schema, start_ms, end_ms) as writer:
        writer.write(table)
        writer.commit()
    return check_backfill([view], START, END, cfg.data_dir, cfg.registry_url, cfg.project)[VIEW]


def _served_styles(repo: Path, n: int) -> list:
    cfg = load_config(repo)
    host, port = cfg.redis_host_port
    client = redis.Redis(host=host, port=port)
    keys = layout.KeyEncoder(cfg.project, {"asset_id": String}).keys([[f"a{i}" for i in range(n)]])
    field = layout.field_name(VIEW, "style")
    return [None if v is None else layout.decode_value(v) for v in (client.hget(k, field) for k in keys)]


def test_refused_with_a_report_then_forced_then_passing_after_a_clean_backfill(tmp_path, capsys):
    repo = make_repo(tmp_path, f"quality_{uuid.uuid4().hex[:8]}")
    run(repo, "apply")
    record = _backfill(repo, ["voxel", "neon", "cartoon", "neon"])
    assert [c.feature for c in record.failed] == ["style"]

    print_backfill_checks([record])
    printed = capsys.readouterr().out
    assert f"{VIEW}: 4 of 5 checks passed" in printed
    assert "style: AllowedValues(style, values=['realistic', 'low_poly', 'cartoon', 'voxel', 'sci_fi', ...]) " \
           "failed: 2 of 4 values not allowed: 'neon'" in printed
    assert f"--allow-failed-checks {VIEW}" in printed

    window = (START.isoformat(), END.isoformat(), "--view", VIEW)
    refused = run(repo, "materialize", *window, ok=False)
    assert isinstance(refused.exception, FailedChecksError)
    assert "refused: rows of `asset_attributes` backfilled over" in refused.stderr
    assert "style: AllowedValues(style" in refused.stderr and "2 of 4 values not allowed: 'neon'" in refused.stderr
    stamp = (NOW - dt.timedelta(hours=2)).isoformat().replace("+00:00", "Z")
    assert f"e.g. asset_id=a1, event_timestamp={stamp}, style=neon" in refused.stderr
    assert f"e.g. asset_id=a3, event_timestamp={stamp}, style=neon" in refused.stderr
    message = str(refused.exception)
    assert "fix the history and backfill again (`featurectl" in message and f"--view {VIEW}`" in message
    assert f"or pass --allow-failed-checks {VIEW} to materialize them anyway" in message
    assert _served_styles(repo, 4) == [None] * 4  # nothing written

    wrong = run(repo, "materialize", *window, "--allow-failed-checks", "asset_activity", ok=False)
    assert "asset_activity: not a view this run materializes" in wrong.output

    forced = run(repo, "materialize", *window, "--allow-failed-checks", VIEW)
    assert f"warning: --allow-failed-checks {VIEW}: materializing although rows" in forced.stderr
    assert _served_styles(repo, 4) == ["voxel", "neon", "cartoon", "neon"]

    # newer rows (Redis keeps a value only when newer: the accepted ones stay until then, as the README says)
    assert _backfill(repo, ["voxel", "medieval", "cartoon", "sci_fi"], hours_ago=1).passed
    clean = run(repo, "materialize-incremental", END.isoformat(), "--view", VIEW)
    assert "refused" not in clean.stderr and "warning: --allow-failed-checks" not in clean.stderr
    run(repo, "materialize", *window)
    assert _served_styles(repo, 4) == ["voxel", "medieval", "cartoon", "sci_fi"]
    run(repo, "teardown", "--yes")
