"""`featurectl bench monitoring`, short: a monitored and an unmonitored server measured in one run print the
DESIGN.md line last, both sides loaded without errors, the monitored one exporting its freshness and drift
families and the other none (figures are not checked here: benchmarks are for measuring)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import featurectl

METRICS = {"http_load_rps", "http_load_errors", "http_load_p50_ms", "http_load_p99_ms", "http_load_p999_ms",
           "http_load_segment_p50_median_ms", "http_load_segment_p99_median_ms", "http_load_segment_p99_iqr_ms",
           "cpu_us_per_request"}
DIFFERENCES = {"p99_delta_ms", "segment_p50_median_delta_ms", "segment_p99_median_delta_ms",
               "cpu_us_per_request_delta"}


def test_an_odd_number_of_segments_is_refused_before_any_work():
    done = featurectl("bench", "monitoring", "--segments", "3")
    assert done.returncode == 2
    assert "Invalid value for '--segments': give an even number of segments, half of them per side" in done.stderr


@pytest.mark.integration
def test_monitoring_benchmark_line(local_services):
    done = featurectl("bench", "monitoring", "--assets", "500", "--rate", "100", "--load-seconds", "2",
                      "--segments", "4", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "monitoring" and set(line["peer"]) == METRICS
    assert set(line["ours"]) == METRICS | DIFFERENCES
    assert {"http_load_rps", "http_load_p99_ms", "http_load_segment_p99_median_ms", "cpu_us_per_request"} <= set(
        line["ratio"])
    assert line["ours"]["http_load_errors"] == line["peer"]["http_load_errors"] == 0
    assert line["ours"]["http_load_rps"] > 0 and line["peer"]["http_load_rps"] > 0
    monitored = line["params"]["monitored"]
    assert monitored["off"] == {"families": 0, "drift_features": 0, "served_rows": 0}
    assert monitored["on"]["families"] == 3 and monitored["on"]["drift_features"] == 20
    assert monitored["on"]["served_rows"] == 2 * (500 + 100 * 2)  # 2 views: the warm-up and 2 s of load at 100/s
    met = line["params"]["targets_met"]
    assert met["monitoring_on_exports_it"] and met["monitoring_off_exports_none"] and met["http_load_errors==0"]
