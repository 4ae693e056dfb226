"""`featurectl bench gateway`, short: three stand-in replicas and the gateway as the CLI runs it print the DESIGN.md
line last, both sides measured, no load errors, and round robin's fixed third on the slow replica above ours."""

from __future__ import annotations

import json

from cli_helpers import featurectl

METRICS = {"p50_ms", "p99_ms", "slow_share_pct", "load_p50_ms", "load_p99_ms", "load_errors"}


def test_gateway_benchmark_line():
    done = featurectl("bench", "gateway", "--requests", "500", "--rate", "100", "--seconds", "3", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "gateway" and METRICS <= set(line["ours"]) and set(line["peer"]) == METRICS
    assert {"added_p50_ms", "added_p99_ms", "added_p99_whole_run_ms"} <= set(line["ours"])
    assert METRICS - {"load_errors"} <= set(line["ratio"])
    assert line["ours"]["load_errors"] == line["peer"]["load_errors"] == 0
    assert line["peer"]["slow_share_pct"] > 30 > line["ours"]["slow_share_pct"]
    assert set(line["params"]["goals_met"]) == {"added_p99_ms<=1.0", "slow_share_pct<=5.0"}
