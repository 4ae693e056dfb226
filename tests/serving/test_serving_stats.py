"""Log-linear latency histograms: bucket edges, percentile error bound, merging across workers, Prometheus text."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
from hypothesis import given, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serving.freshness import FreshnessSnapshot
from serving.metrics import BOUNDS_US, exposition
from serving.result import ViewRows
from serving.stats import LatencyHistogram, ServerStats, bucket_bounds, bucket_of
from streaming.status import ViewLag


@given(st.integers(0, (1 << 36) - 1))
def test_every_value_lies_within_its_bucket_and_buckets_are_narrow(us):
    low, high = bucket_bounds(bucket_of(us))
    assert low <= us <= high
    assert high - low <= max(1, us // 64)  # under 1.6 % relative width


def test_buckets_are_contiguous_and_powers_of_two_are_edges():
    for index in range(1, bucket_of((1 << 36) - 1)):
        assert bucket_bounds(index)[0] == bucket_bounds(index - 1)[1] + 1
    for bound in BOUNDS_US:
        assert bucket_bounds(bucket_of(bound))[0] == bound


def test_percentiles_match_numpy_within_the_bucket_width():
    rng = np.random.default_rng(3)
    samples_us = (rng.lognormal(mean=6, sigma=1.2, size=50_000)).astype(int)
    hist = LatencyHistogram()
    for us in samples_us:
        hist.record_ns(int(us) * 1000)
    ordered = np.sort(samples_us)
    for p in (50, 90, 99, 99.9):
        exact = ordered[math.ceil(len(ordered) * p / 100 - 1e-9) - 1]  # the sample of that rank
        assert exact <= hist.percentile_us(p) <= exact * 1.016 + 1
    assert hist.total == len(samples_us) and hist.max_us == samples_us.max()


def test_workers_share_counts_through_their_dumps(tmp_path):
    first, second = ServerStats(tmp_path), ServerStats(tmp_path)
    first.record("/get-online-features", 200, 150_000, "asset_ranking")
    second.record("/get-online-features", 400, 90_000, None)
    second.redis_errors = 2
    second._add(first.to_json())  # what `merged` reads from another worker's file
    second.dump()
    assert (tmp_path / f"{os.getpid()}.json").exists()
    merged = second.merged()
    assert merged.endpoints["/get-online-features"].total == 2
    assert merged.responses == {("/get-online-features", 200): 1, ("/get-online-features", 400): 1}


def test_prometheus_exposition_has_exact_buckets_and_quantiles():
    stats = ServerStats()
    for us in (50, 100, 300, 3000):
        stats.record("/get-online-features", 200, us * 1000, "asset_ranking")
    stats.redis_errors = 3
    families = {f.name: f for f in text_string_to_metric_families(exposition(stats).decode())}
    buckets = {s.labels["le"]: s.value for s in families["featurectl_request_duration_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets["0.000064"] == 1 and buckets["0.000128"] == 2 and buckets["0.004096"] == 4 and buckets["+Inf"] == 4
    quantile_family = families["featurectl_request_duration_quantile_seconds"]
    quantiles = {s.labels["quantile"]: s.value for s in quantile_family.samples}
    assert quantiles["0.5"] == 0.0001 and quantiles["0.999"] == 0.003
    assert families["featurectl_redis_errors"].samples[0].value == 3
    assert {s.labels["feature_service"] for s in
            families["featurectl_feature_service_request_duration_seconds"].samples} == {"asset_ranking"}


def test_served_rows_per_view_add_up_across_workers(tmp_path):
    first, second = ServerStats(tmp_path), ServerStats(tmp_path)
    first.served.count({"v": ViewRows((b"x", None, b"y"), [1], [2])})
    second.served.count({"v": ViewRows((b"x",), [], []), "w": ViewRows((None,), [0], [])})
    (tmp_path / "1.json").write_text(json.dumps(first.to_json()))  # another worker's dump
    summary = second.merged().summary()["served_rows"]
    assert summary == {"v": {"rows": 4, "not_found": 1, "outside_max_age": 1, "missing_rate": 0.5},
                       "w": {"rows": 1, "not_found": 1, "outside_max_age": 0, "missing_rate": 1.0}}


def test_one_row_outcomes_count_as_the_views_rows_they_stand_for(tmp_path):
    """A one-row answer is counted by its outcome and folded in when read: the same figures as its views' rows,
    beside rows counted the general way, in the summary, the metrics and a worker's dump."""
    by_rows, by_outcome = ServerStats(tmp_path / "a"), ServerStats(tmp_path / "b")
    for stats in (by_rows, by_outcome):
        stats.served.count({"v": ViewRows((b"x", None), [1], [])})
    for outcome in ((("v", 0), ("w", 1)), (("v", 2), ("w", 0)), (("v", 0), ("w", 1))):
        by_outcome.served.count_row(outcome)
    by_rows.served.count({"v": ViewRows((b"x",), [], []), "w": ViewRows((None,), [0], [])})
    by_rows.served.count({"v": ViewRows((b"x",), [], [0]), "w": ViewRows((b"y",), [], [])})
    by_rows.served.count({"v": ViewRows((b"x",), [], []), "w": ViewRows((None,), [0], [])})
    assert by_outcome.served.summary() == by_rows.served.summary()
    assert by_outcome.served.summary()["w"] == {"rows": 3, "not_found": 2, "outside_max_age": 0,
                                                "missing_rate": round(2 / 3, 6)}
    by_outcome.served.count_row((("v", 1), ("w", 0)))  # after a first read: counted on top of it
    by_rows.served.count({"v": ViewRows((None,), [0], []), "w": ViewRows((b"y",), [], [])})
    assert by_outcome.to_json()["served"] == by_rows.to_json()["served"]
    assert exposition(by_outcome) == exposition(by_rows)


def test_freshness_is_exported_with_the_ages_at_scrape_time():
    stats = ServerStats()
    stats.served.count({"v": ViewRows((b"x", None, b"y", b"z"), [1], [3])})
    newest_ms = int(time.time() * 1000) - 90_000
    snapshot = FreshnessSnapshot({"v": newest_ms}, {"v": ViewLag("job", True, "running", 420.0, 710.0, None),
                                                    "w": ViewLag("old", False, "not running", None, None, None)})
    families = {f.name: f for f in text_string_to_metric_families(exposition(stats, freshness=snapshot).decode())}
    served = {s.labels["status"]: s.value for s in families["featurectl_view_served_rows"].samples
              if s.name.endswith("_total")}
    assert served == {"PRESENT": 2, "NOT_FOUND": 1, "OUTSIDE_MAX_AGE": 1}
    [newest] = families["featurectl_view_newest_event_timestamp_seconds"].samples
    assert newest.labels == {"view": "v"} and newest.value == newest_ms / 1000
    [age] = families["featurectl_view_newest_value_age_seconds"].samples
    assert 90 <= age.value < 90 + 60
    lags = {(s.labels["view"], s.labels["quantile"]): s.value
            for s in families["featurectl_stream_lag_seconds"].samples}
    assert lags == {("v", "0.5"): 0.42, ("v", "0.99"): 0.71}
    assert {s.labels["view"]: s.value for s in families["featurectl_stream_running"].samples} == {"v": 1, "w": 0}
