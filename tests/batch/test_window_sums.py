"""Float window sums of the backfill (`batch.windows`) depend on each window's own tiles only: an entity whose
history holds a huge finite value or an infinity leaves every other entity's sums and means exact, and its own
windows exact once that tile has left them. Checked on hand-made tile tables against `math.fsum` per window."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from batch.windows import _sum_tree, _tree_sums, offline_rows
from dsl import Aggregation, Entity, EventSource, FeatureView, Float64, Int64, Timestamp
from dsl.compile_flink import SourceSettings, compile_view

MINUTE = 60_000
PLAYER = Entity("player", join_keys={"player_id": Int64})
EVENTS = EventSource("plays", {"player_id": Int64, "score": Float64, "t": Timestamp}, timestamp_field="t",
                     path="plays")
VIEW = FeatureView("scores", PLAYER, EVENTS, tile="1m", ttl="1h",
                   features=[Aggregation("sum", "score", windows=["3m"]), Aggregation("mean", "score", windows=["3m"])])
# player -> {tile minute: scores in it}; player 2's 1e300 and player 3's inf sort before the others
HISTORY = {1: {0: [0.1, 0.2], 4: [0.3]},
           2: {1: [1e300], 2: [0.7], 6: [1.1, 2.2], 7: [3.3]},
           3: {2: [math.inf], 3: [5.0]},
           4: {0: [0.25], 1: [-0.5], 5: [1e-3], 8: [7.0, 0.1]},
           5: {3: [-1e300], 4: [1e300], 9: [2.5]}}


def _tiles() -> pa.Table:
    rows = [(p, m, scores) for p, tiles in HISTORY.items() for m, scores in tiles.items()]
    sums = [math.fsum(s) for _, _, s in rows]
    return pa.table({"player_id": [p for p, _, _ in rows], "tile_start": [m * MINUTE for _, m, _ in rows],
                     "score_sum__sum": sums, "score_mean__sum": sums,
                     "score_mean__count": [len(s) for _, _, s in rows], "__events__count": [len(s) for _, _, s in rows],
                     "__clock__max": [m * MINUTE for _, m, _ in rows]})


def _own(player: int, boundary_minute: int) -> list[float]:
    return [v for m, scores in HISTORY[player].items() if boundary_minute - 3 <= m < boundary_minute for v in scores]


@pytest.mark.parametrize("chunk_tiles", [1, 1_000_000])
def test_each_window_sums_its_own_tiles_only(chunk_tiles):
    compiled = compile_view(VIEW, SourceSettings("", Path("/data")))
    rows = pa.concat_tables(t for t, _ in offline_rows(compiled, _tiles(), 0, 14 * MINUTE, chunk_tiles)).to_pylist()
    assert {r["player_id"] for r in rows} == set(HISTORY)
    for row in rows:
        minute = int(row["event_timestamp"].timestamp() * 1000) // MINUTE
        own = _own(row["player_id"], minute)
        want = math.fsum(own) if own else 0.0
        where = f"player {row['player_id']} at minute {minute}"
        assert row["score_sum_3m"] == want or (math.isnan(want) and math.isnan(row["score_sum_3m"])), where
        if own:
            assert row["score_mean_3m"] == pytest.approx(want / len(own), rel=1e-15, nan_ok=True), where
        else:
            assert row["score_mean_3m"] is None, where
    after_huge = {int(r["event_timestamp"].timestamp() * 1000) // MINUTE: r["score_sum_3m"] for r in rows
                  if r["player_id"] == 2}
    assert after_huge[7] == 1.1 + 2.2 and after_huge[8] == math.fsum([1.1, 2.2, 3.3]), "exact once 1e300 left"

def test_tree_sums_match_exact_sums_over_random_ranges():
    rng = np.random.default_rng(9)
    for n in (1, 2, 5, 64, 1000):
        values = rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, size=n)
        lo = rng.integers(0, n + 1, size=300)
        hi = np.maximum(lo, rng.integers(0, n + 1, size=300))
        got = _tree_sums(_sum_tree(values), lo, hi).astype(np.float64)
        for a, b, s in zip(lo, hi, got):
            assert s == pytest.approx(math.fsum(values[a:b]), rel=1e-15, abs=1e-15 * np.abs(values[a:b]).sum())
