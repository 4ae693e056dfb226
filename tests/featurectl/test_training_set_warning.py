"""`training-set` warns about spans never backfilled, saying what rows there read and how to cover them."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import numpy as np

from batch.backfill_log import BackfillLog, BackfillRecord
from cli_helpers import ROOT
from dsl import load_repo
from featurectl.batch_commands import _warn_uncovered

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)


def test_rows_past_the_backfilled_range_are_said_to_hold_its_last_values(tmp_path, capsys):
    view = load_repo(ROOT / "feature_repo").view("asset_activity")
    cfg = SimpleNamespace(registry_url=f"sqlite:///{tmp_path / 'registry.db'}", project="shop")
    log = BackfillLog(cfg.registry_url)
    try:
        log.record(BackfillRecord("shop", view.name, T0 - view.ttl, T0 + dt.timedelta(days=1), 1, 1, T0))
    finally:
        log.close()
    row_ms = int((T0 + dt.timedelta(days=1, hours=3)).timestamp() * 1000)  # 3 hours past the backfilled range
    _warn_uncovered(cfg, [view], np.array([row_ms]))
    warning = capsys.readouterr().err
    assert "`asset_activity` was never backfilled over [2026-03-02T00:00:00+00:00, 2026-03-02T03:00:00.001000" \
           "+00:00): rows there hold its values as of the last backfilled change at or before them" in warning
    assert "NULL" not in warning and "without the events since; run `featurectl backfill --view asset_activity " \
        "--start 2026-03-02T00:00:00+00:00 --end 2026-03-02T03:00:00.001000+00:00`" in warning
