"""Drift of served values from the offline profile: PSI exactly as the README states it for known samples against
known profiles, the window of the last values, the per-second budget of the request path, and the metric in
`featurectl serve`'s /metrics."""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import json
import math
import re
import time
import uuid

import pytest
from cli_helpers import ROOT, free_port
from serving_env import feast_rows, feature_server, get, make_repo, post

from common.config import load_config
from common.feature_profile import FLOOR, FeatureProfile
from common.quality_log import QualityLog, QualityRecord
from google.protobuf.timestamp_pb2 import Timestamp

from dsl.types import ValueType
from redis_store.layout import encode_value
from serving.catalog import Catalog, FeatureSpec, ViewSpec
from serving.drift import STEP_ROWS, STEP_VALUES, DriftMonitor, ServedWindow
from serving.plan import build_plan
from serving.request import PreparedRequest
from serving.result import OnlineFeatures

NUMBERS = FeatureProfile("numeric", (0.5, 0.3, 0.2), cuts=(1.0, 5.0))
LABELS = FeatureProfile("categorical", (0.6, 0.3, 0.1), categories=("a", "b"))


def psi(expected: list[float], counts: list[int]) -> float:
    """The README's formula: sum of (a - e) * ln(a / e), both shares floored at 1e-4."""
    total = sum(counts)
    out = 0.0
    for e, c in zip(expected, counts):
        a, e = max(c / total, 1e-4), max(e, 1e-4)
        out += (a - e) * math.log(a / e)
    return out


def response(names: list[str], columns: dict[str, list]) -> OnlineFeatures:
    rows = len(next(iter(columns.values())))
    return OnlineFeatures({"id": [f"e{i}" for i in range(rows)]}, names, columns, {}, {})


def monitor(**kwargs) -> DriftMonitor:
    drift = DriftMonitor(lambda: {"v": {"x": NUMBERS, "c": LABELS}}, **kwargs)
    drift.refresh()
    return drift


def test_psi_per_feature_is_exactly_the_formula_over_the_values_served():
    drift = monitor()
    catalog = Catalog("p", {}, {"svc": ("v:x", "v:c", "v:unprofiled")})
    # x: 0 and 1 are in the first bin (a value equal to a cut falls below it), 2 and 5 in the second, 6 and 7 above
    drift.offer(["v:x", "v:c"], response(["x", "c"], {"x": [0, 1, 2], "c": ["a", "a", None]}))
    drift.offer("svc", response(["x", "c", "unprofiled"], {"x": [5.0, 6.5, None], "c": ["z", "b", "a"],
                                                          "unprofiled": [1, 2, 3]}))
    drift.offer(["v:x"], response(["v__x"], {"v__x": [7, float("nan")]}))  # full feature names
    drift.drain(catalog)
    assert list(drift.windows[("v", "x")].counts) == [2, 2, 2]
    assert list(drift.windows[("v", "c")].counts) == [3, 1, 1]
    assert ("v", "unprofiled") not in drift.windows
    assert drift.windows[("v", "x")].psi() == pytest.approx(psi([0.5, 0.3, 0.2], [2, 2, 2]), rel=1e-12)
    assert drift.windows[("v", "c")].psi() == pytest.approx(psi([0.6, 0.3, 0.1], [3, 1, 1]), rel=1e-12)

    families = {f.name: f for f in drift.collect()}
    samples = {(s.labels["feature"], s.labels["statistic"]): s.value
               for s in families["featurectl_feature_drift"].samples}
    assert samples == {("c", "psi"): pytest.approx(psi([0.6, 0.3, 0.1], [3, 1, 1])),
                       ("x", "psi"): pytest.approx(psi([0.5, 0.3, 0.2], [2, 2, 2]))}
    assert {s.labels["feature"]: s.value for s in families["featurectl_feature_drift_values"].samples} == {
        "c": 5, "x": 6}
    summary = drift.summary()["v"]
    assert summary["x"] == {"psi": drift.windows[("v", "x")].psi(), "values": 6, "counts": [2, 2, 2],
                            "profile": NUMBERS.to_json()}
    assert summary["c"]["counts"] == [3, 1, 1] and summary["c"]["profile"]["categories"] == ["a", "b"]


def test_an_empty_bin_counts_as_the_floor_and_the_same_shares_give_zero():
    window = ServedWindow(NUMBERS)
    window.add([0.0] * 5 + [3.0] * 3 + [9.0] * 2)
    assert window.psi() == pytest.approx(0.0, abs=1e-15)
    only_low = ServedWindow(NUMBERS)
    only_low.add([0.5] * 4)
    want = (1 - 0.5) * math.log(1 / 0.5) + (FLOOR - 0.3) * math.log(FLOOR / 0.3) + (FLOOR - 0.2) * math.log(FLOOR / 0.2)
    assert only_low.psi() == pytest.approx(want, rel=1e-12)


def test_the_window_keeps_the_last_values_and_a_new_profile_starts_afresh():
    window = ServedWindow(NUMBERS, size=4)
    window.add([0, 0, 0])
    window.add([3, 9, 9])  # the two oldest 0s are dropped
    assert list(window.counts) == [1, 1, 2] and window.filled == 4
    window.add([3] * 10)
    assert list(window.counts) == [0, 4, 0]
    drift = monitor(window=4)
    drift.offer(["v:x"], response(["x"], {"x": [0, 0]}))
    drift.drain(Catalog("p", {}, {}))
    drift.load_profiles = lambda: {"v": {"x": FeatureProfile("numeric", (0.5, 0.5), cuts=(3.0,))}}
    drift.refresh()
    drift.offer(["v:x"], response(["x"], {"x": [9]}))
    drift.drain(Catalog("p", {}, {}))
    assert list(drift.windows[("v", "x")].counts) == [0, 1]


def test_the_request_path_only_keeps_responses_while_the_second_s_budget_lasts():
    drift = monitor(rows_per_second=3)
    for _ in range(3):
        drift.offer(["v:x"], response(["x"], {"x": [0, 0]}))
    assert len(drift.pending) == 2  # 2 rows, then 2 more over the budget of 3, then none
    drift.drain(Catalog("p", {}, {}))
    assert drift.pending == [] and drift.budget == 3 and drift.windows[("v", "x")].filled == 4


def test_the_sample_spreads_over_the_second_by_a_stride_of_last_second_s_rows():
    drift = monitor(rows_per_second=4)
    first = [i for i in range(40) if drift.sampling() and not drift.offer(["v:x"], response(["x"], {"x": [i]}))]
    drift.drain(Catalog("p", {}, {}))
    second = [i for i in range(40) if drift.sampling() and not drift.offer(["v:x"], response(["x"], {"x": [i]}))]
    assert first == [0, 1, 2, 3] and drift.stride == 10 and second == [0, 10, 20, 30]


def test_a_kept_one_row_answer_is_binned_as_the_values_it_served(monkeypatch):
    """The request path keeps a one-row answer as its replies; the drain decodes them to the values `finish` gives,
    leaving out a row older than its view's ttl and a missing one."""
    catalog, answers = kept_answers(monkeypatch)
    kept, built = monitor(), monitor()
    for request, row, outcome in answers:
        kept.offer_row("svc", request.plan.row_answer, row, outcome)
        built.offer("svc", request.finish(row))
    kept.drain(catalog)
    built.drain(catalog)
    assert kept.windows[("v", "x")].filled == 3 and kept.windows[("v", "c")].filled == 4
    for key, window in built.windows.items():
        assert list(kept.windows[key].counts) == list(window.counts)


def kept_answers(monkeypatch) -> tuple[Catalog, list[tuple]]:
    """A catalog of one view `v` (x: INT64, c: STRING, ttl 60 s) and one-row answers of the service `svc`: each
    its plan, replies and outcome, as `answer_json` gives them (the last two older than the ttl and missing)."""
    monkeypatch.setattr("time.time", lambda: 10_000)
    features = {"x": FeatureSpec("x", ValueType.INT64, b"x"), "c": FeatureSpec("c", ValueType.STRING, b"c")}
    view = ViewSpec("v", "v", (("id", ValueType.STRING),), features, 60_000, b"_ts:v")
    catalog = Catalog("p", {"v": view}, {"svc": ("v:c", "v:x")})
    plan = build_plan(catalog, "svc")
    fresh, stale = (Timestamp(seconds=s).SerializeToString() for s in (9_990, 9_000))
    replies = [[[encode_value(c, ValueType.STRING), encode_value(x, ValueType.INT64), fresh]] for x, c in
               ((0, "a"), (7, "b"), (3, "z"))] + [[[encode_value("a", ValueType.STRING), None, fresh]],
                                                  [[encode_value("b", ValueType.STRING), b"x", stale]], [[None] * 3]]
    answers = []
    for row in replies:
        request = PreparedRequest(plan, {"id": ["e"]})
        answers.append((request, row, request.answer_json(row)[1]))
    return catalog, answers


def test_a_kept_one_row_answer_leaves_nothing_for_the_garbage_collector_to_track(monkeypatch):
    """Kept for up to a second, a sampled answer would survive young collections and weigh on older ones: it is
    kept in objects the collector stops tracking at its first look."""
    catalog, answers = kept_answers(monkeypatch)
    drift = monitor()
    for request, row, outcome in answers:
        drift.offer_row(["v:c", "v:x"], request.plan.row_answer, row, outcome)
    gc.collect()
    [kept] = drift.kept.values()
    assert len(kept.rows) == len(answers) and not any(gc.is_tracked(row) for row in kept.rows)


def test_the_drain_hands_the_event_loop_back_after_each_step(monkeypatch):
    """Counted, not timed: between two turns of another task on the event loop, the drain gathers at most
    `STEP_ROWS` sampled rows and bins at most `STEP_VALUES` values, and what it bins is what `drain` at once bins."""
    catalog, answers = kept_answers(monkeypatch)
    stepped, at_once = monitor(rows_per_second=10_000), monitor(rows_per_second=10_000)
    for drift in (stepped, at_once):
        for i in range(100):
            request, row, outcome = answers[i % len(answers)]
            drift.offer_row("svc", request.plan.row_answer, row, outcome)
        for _ in range(3):
            drift.offer(["v:x", "v:c"], response(["x", "c"], {"x": list(range(150)), "c": ["a", "b", None] * 50}))
    turns: list[tuple[int, int]] = []  # per turn of the other task: rows not gathered yet, values binned

    async def other_task(done: asyncio.Future) -> None:
        while not done.done():
            turns.append((stepped.ungathered, sum(w.filled for w in stepped.windows.values())))
            await asyncio.sleep(0)

    async def both() -> None:
        drain = asyncio.ensure_future(stepped._drain_in_steps(catalog))
        await asyncio.gather(drain, other_task(drain))

    asyncio.run(both())
    at_once.drain(catalog)
    gathered = [before[0] - after[0] for before, after in zip(turns, turns[1:])]
    binned = [after[1] - before[1] for before, after in zip(turns, turns[1:])]
    assert max(gathered) == STEP_ROWS and max(binned) == STEP_VALUES
    assert sum(g > 0 for g in gathered) >= (3 * 150 + 100) // STEP_ROWS
    assert turns[-1] == (0, sum(w.filled for w in at_once.windows.values()))
    assert {k: list(w.counts) for k, w in stepped.windows.items()} == {
        k: list(w.counts) for k, w in at_once.windows.items()}


def test_an_unreadable_registry_keeps_the_last_profiles(caplog):
    drift = monitor()

    def broken():
        raise OSError("registry database away")

    drift.load_profiles = broken
    drift.refresh()
    assert drift.profiles["v"]["x"] == NUMBERS
    assert "cannot read the feature profiles (registry database away)" in caplog.text


@pytest.mark.integration
def test_featurectl_serve_exports_the_drift_of_what_it_served(tmp_path, local_services):
    host, port = load_config(ROOT / "feature_repo").redis_host_port
    repo, store = make_repo(tmp_path, f"drift{uuid.uuid4().hex[:8]}", f"{host}:{port}")
    cfg = load_config(repo)
    views = FeatureProfile("numeric", (0.5, 0.25, 0.25), cuts=(2.0, 4.0))
    categories = FeatureProfile("categorical", (0.7, 0.2, 0.1), categories=("chair", "table"))
    now = dt.datetime.now(dt.timezone.utc)
    quality_log = QualityLog(cfg.registry_url)
    for view, profiles in (("asset_activity", {"views_1h": views}), ("asset_attributes", {"category": categories})):
        quality_log.record(QualityRecord(cfg.project, view, now - dt.timedelta(days=1), now, now, 10,
                                         profiles=profiles))
    quality_log.close()
    served_views = [0, 1, 2, 3, 3, 5, 8, 9]  # bins: 3 at or below 2, 2 up to 4, 3 above
    served_categories = ["chair", "chair", "lamp", "table", "chair", "chair", "sofa", "chair"]
    feast_rows(store, "asset_activity", {f"a{i}": {"views_1h": v} for i, v in enumerate(served_views)})
    feast_rows(store, "asset_attributes", {f"a{i}": {"category": c} for i, c in enumerate(served_categories)})
    try:
        with feature_server(repo, free_port()) as url:
            for i in range(len(served_views)):
                body = {"features": ["asset_activity:views_1h", "asset_attributes:category"],
                        "entities": {"asset_id": [f"a{i}"]}}
                assert post(url, body)[0] == 200
            assert post(url, {"features": ["asset_activity:views_1h"], "entities": {"asset_id": ["missing"]}})[0] == 200
            deadline = time.monotonic() + 10
            while True:
                text = get(url, "/metrics")[1].decode()
                if "featurectl_feature_drift_values" in text and 'feature="category"' in text or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            stats = json.loads(get(url, "/stats")[1])["drift"]
    finally:
        store.teardown()

    def metric(name: str, view: str, feature: str) -> float:
        labels = f'feature="{feature}",statistic="psi",view="{view}"' if name.endswith("drift") else \
            f'feature="{feature}",view="{view}"'
        return float(re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M).group(1))

    assert metric("featurectl_feature_drift", "asset_activity", "views_1h") == pytest.approx(
        psi([0.5, 0.25, 0.25], [3, 2, 3]), rel=1e-9)
    assert metric("featurectl_feature_drift", "asset_attributes", "category") == pytest.approx(
        psi([0.7, 0.2, 0.1], [5, 1, 2]), rel=1e-9)
    assert metric("featurectl_feature_drift_values", "asset_activity", "views_1h") == len(served_views)
    assert stats["asset_activity"]["views_1h"]["counts"] == [3, 2, 3]
    assert stats["asset_attributes"]["category"]["counts"] == [5, 1, 2]
    assert stats["asset_attributes"]["category"]["psi"] == pytest.approx(psi([0.7, 0.2, 0.1], [5, 1, 2]), rel=1e-9)
