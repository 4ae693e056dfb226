"""Point-in-time training sets over the backfilled history: equal to a raw-event oracle (sketch estimates
included, exactly), NULL past the ttl, never from the future, and equal to Feast's own get_historical_features
over the same offline tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import window_oracle as oracle
from backfill_history import HOUR_MS, SPEC, T0_MS, T1_MS, backfilled_history, example_repo_copy, utc
from batch.training import TrainingSetError, get_historical_features, training_table
from cli_helpers import ROOT, featurectl
from dsl import UnknownReferenceError, load_repo
from dsl.compile_feast import EVENT_TIMESTAMP

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
VIEW_KEYS = {"asset_activity": "asset_id", "user_activity": "user_id", "asset_attributes": "asset_id",
             "asset_geometry": "asset_id"}


@pytest.fixture(scope="module")
def example_repo():
    return load_repo(ROOT / "feature_repo")


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory, example_repo):
    return backfilled_history(tmp_path_factory, example_repo)


def request_rows(n: int, seed: int) -> pa.Table:
    """Entity rows at random times in the backfilled range, some on a boundary or just before one, a few of
    entities that never appear."""
    rng = np.random.default_rng(seed)
    times = rng.integers(T0_MS, T1_MS - HOUR_MS, n)
    times[: n // 4] = times[: n // 4] // (5 * MINUTE_MS) * (5 * MINUTE_MS)  # on a boundary of both tiles
    times[n // 4: n // 2] = times[n // 4: n // 2] // MINUTE_MS * MINUTE_MS - 1  # 1 ms before one
    assets = [f"asset_{i:06d}" for i in rng.integers(0, SPEC.n_assets + 2, n)]
    users = [f"user_{i:06d}" for i in rng.integers(0, SPEC.n_users + 2, n)]
    return pa.table({"asset_id": assets, "user_id": users,
                     EVENT_TIMESTAMP: pa.array(times).cast(pa.timestamp("ms", "UTC"))})


@pytest.fixture(scope="module")
def every_feature(example_repo) -> list[str]:
    return [f"{view.name}:{name}" for view in example_repo.views for name in view.feature_names]


def test_training_set_equals_the_raw_event_oracle(example_repo, backfilled, every_feature):
    requests = request_rows(1_200, seed=1)
    table = training_table(requests, every_feature, example_repo, backfilled.target.data_dir,
                           full_feature_names=True)
    assert table.column_names[:3] == requests.column_names
    assert table.column_names[3:] == [ref.replace(":", "__") for ref in every_feature]
    rows = table.to_pylist()
    for view in example_repo.views:
        events = oracle.by_entity(view, backfilled.events[view.source.name])
        nulls = 0
        for row in rows:
            t_ms = int(row[EVENT_TIMESTAMP].timestamp() * 1000)
            want = oracle.as_of(view, events.get((row[VIEW_KEYS[view.name]],), []), t_ms, T0_MS)
            got = {name: row[f"{view.name}__{name}"] for name in view.feature_names}
            assert got == (want or dict.fromkeys(view.feature_names)), (view.name, row[VIEW_KEYS[view.name]], t_ms)
            nulls += want is None
        assert 0 < nulls < len(rows) / 2, (view.name, nulls)  # unknown entities are NULL, the rest mostly not


def test_values_turn_null_once_older_than_the_ttl(example_repo, backfilled):
    """After an asset's last event its windows empty (counts 0) and stay so until that row is older than the
    2-day ttl; from then on its features are NULL."""
    view = example_repo.view("asset_activity")
    ttl_ms = int(view.ttl.total_seconds() * 1000)
    events = oracle.by_entity(view, backfilled.events["asset_interactions"])
    assets = sorted(events)[:8]
    emptied = [events[a][-1]["event_time"] // MINUTE_MS * MINUTE_MS + MINUTE_MS + 24 * HOUR_MS for a in assets]
    assert all(T0_MS <= e < T1_MS for e in emptied)
    offsets = [HOUR_MS, ttl_ms, ttl_ms + 1]
    requests = pa.table({
        "asset_id": [a[0] for a in assets for _ in offsets],
        EVENT_TIMESTAMP: pa.array([e + o for e in emptied for o in offsets]).cast(pa.timestamp("ms", "UTC"))})
    got = training_table(requests, ["asset_activity:views_24h", "asset_activity:dwell_ms_max_24h"], example_repo,
                         backfilled.target.data_dir).to_pylist()
    expected = [(0, None), (0, None), (None, None)] * len(assets)
    assert [(r["views_24h"], r["dwell_ms_max_24h"]) for r in got] == expected


def test_an_event_counts_only_from_the_boundary_after_it(example_repo, backfilled):
    """A lone view event: requests at its own time and up to its tile's end do not see it, one at the end does."""
    view = example_repo.view("asset_activity")
    events = oracle.by_entity(view, backfilled.events["asset_interactions"])

    def lone(rows: list[dict], event: dict) -> bool:  # nothing else in its tile or leaving the 24 h window then
        tile = event["event_time"] // MINUTE_MS
        return event["event_type"] == "view" and event["event_time"] > T0_MS and all(
            r is event or r["event_time"] // MINUTE_MS not in (tile, tile - 24 * 60) for r in rows)

    asset, event = next((key[0], e) for key, rows in events.items() for e in rows if lone(rows, e))
    tile_end = event["event_time"] // MINUTE_MS * MINUTE_MS + MINUTE_MS
    requests = pa.table({"asset_id": [asset] * 3, EVENT_TIMESTAMP: pa.array(
        [event["event_time"], tile_end - 1, tile_end]).cast(pa.timestamp("ms", "UTC"))})
    got = training_table(requests, ["asset_activity:views_24h"], example_repo, backfilled.target.data_dir)
    before, _, after = got.column("views_24h").to_pylist()
    assert got.column("views_24h").to_pylist() == [before, before, before + 1]


def test_sdk_returns_a_frame_in_request_order_with_nullable_types(example_repo, backfilled):
    requests = request_rows(200, seed=2).to_pandas()
    frame = get_historical_features(requests, "cube3d_conditioning", example_repo, backfilled.target.data_dir)
    assert list(frame.columns) == [*requests.columns, "bbox_x", "bbox_y", "bbox_z", "category", "style",
                                   "views_24h", "likes_24h", "unique_users_24h"]
    assert frame[EVENT_TIMESTAMP].equals(requests[EVENT_TIMESTAMP]) and frame["asset_id"].equals(requests["asset_id"])
    assert str(frame["views_24h"].dtype) == "Int64" and frame["views_24h"].isna().any()
    assert frame["bbox_x"].notna().sum() > 150


def test_training_set_errors_say_what_to_do(example_repo, backfilled, tmp_path):
    data_dir = backfilled.target.data_dir
    requests = request_rows(10, seed=3)
    with pytest.raises(TrainingSetError, match="asked of views `asset_activity` and `user_activity`.*full_feature"):
        training_table(requests, ["asset_activity:generations_24h", "user_activity:generations_24h"], example_repo,
                       data_dir)
    with pytest.raises(TrainingSetError, match="has no feature `views_2h`; it has: views_10m"):
        training_table(requests, ["asset_activity:views_2h"], example_repo, data_dir)
    with pytest.raises(TrainingSetError, match="is not `view:feature`"):
        training_table(requests, ["views_1h"], example_repo, data_dir)
    with pytest.raises(UnknownReferenceError, match="feature service `ranking`: is not defined"):
        training_table(requests, "ranking", example_repo, data_dir)
    with pytest.raises(TrainingSetError, match="keyed by user_id; the entity rows lack user_id"):
        training_table(requests.drop_columns(["user_id"]), ["user_activity:events_1h"], example_repo, data_dir)
    with pytest.raises(TrainingSetError, match="no `event_timestamp` column"):
        training_table(requests.drop_columns([EVENT_TIMESTAMP]), "asset_ranking", example_repo, data_dir)
    with pytest.raises(TrainingSetError, match="has no offline table at .*run `featurectl backfill"):
        training_table(requests, "asset_ranking", example_repo, tmp_path)


def test_feast_get_historical_features_reads_the_same_values(example_repo, backfilled, tmp_path):
    """Feast's file offline store over our offline tables. Feast drops a request when one view holds rows of its
    entity but none usable at its time (a known Feast quirk); on every row it returns, values agree."""
    from feast import FeatureStore

    repo_dir = example_repo_copy(tmp_path / "repo", backfilled.target.data_dir, f"sqlite:///{tmp_path / 'r.db'}")
    done = featurectl("--repo", str(repo_dir), "apply", timeout=300)
    assert done.returncode == 0, done.stderr
    requests = request_rows(400, seed=4).to_pandas()
    requests["request"] = np.arange(len(requests))
    store = FeatureStore(repo_path=str(repo_dir))
    theirs = store.get_historical_features(entity_df=requests, features=store.get_feature_service(
        "asset_ranking")).to_df().set_index("request").sort_index()
    ours = get_historical_features(requests, "asset_ranking", example_repo, backfilled.target.data_dir)
    ours = ours.set_index("request").loc[theirs.index]
    assert len(theirs) > len(requests) / 2
    for name in example_repo.view("asset_activity").feature_names + ["category", "style"]:
        mine = [None if pd.isna(v) else v for v in ours[name]]
        feast = [None if pd.isna(v) else v for v in theirs[name]]
        assert mine == feast, name


def test_cli_training_set_from_csv(example_repo, backfilled, tmp_path):
    target = backfilled.target
    repo_dir = example_repo_copy(tmp_path / "repo", target.data_dir, target.registry_url)
    requests = request_rows(300, seed=5).to_pandas()
    requests.loc[0, EVENT_TIMESTAMP] = pd.Timestamp(utc(T0_MS - HOUR_MS))  # before the backfilled range
    entities = tmp_path / "entities.csv"
    requests.assign(**{EVENT_TIMESTAMP: requests[EVENT_TIMESTAMP].map(lambda t: t.isoformat())}).to_csv(
        entities, index=False)
    out = tmp_path / "training.parquet"
    done = featurectl("--repo", str(repo_dir), "training-set", "--entities", str(entities), "--service",
                      "asset_ranking", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "wrote 300 rows x 20 features" in done.stdout  # 18 stored, 2 on demand (asset_ratios)
    assert "`asset_activity` was never backfilled over [2025-12-30T19:00:00+00:00, 2026-01-01T20:00:00+00:00)" \
        in done.stderr
    written = pq.read_table(out)
    expected = training_table(pa.Table.from_pandas(requests, preserve_index=False), "asset_ranking", example_repo,
                              target.data_dir)
    assert written.drop_columns([EVENT_TIMESTAMP]).equals(expected.drop_columns([EVENT_TIMESTAMP]))
    assert written.column(EVENT_TIMESTAMP).cast(pa.timestamp("ms", "UTC")).equals(expected.column(EVENT_TIMESTAMP))
