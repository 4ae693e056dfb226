"""`featurectl bench generate` on the CPU: the tiny model against the real Redis prints the DESIGN.md line last."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bench.generate import command

pytestmark = pytest.mark.integration
METRICS = {"fetch_p99_ms", "e2e_p50_s", "e2e_p99_s", "conc8_p99_s", "conc8_objects_per_s"}


def test_cpu_benchmark_line(tmp_path, local_services):
    out = tmp_path / "line.json"
    result = CliRunner().invoke(command, ["--device", "cpu", "--requests", "4", "--per-client", "1",
                                          "--peer-requests", "1", "--assets", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["bench"] == "generate" and set(line["ours"]) == METRICS and METRICS <= set(line["ratio"])
    params = line["params"]
    assert params["errors"] == {"one_at_a_time": 0, "conc8": 0, "peer": 0}
    assert params["fetch"]["samples"] == 4 + 8 and params["fallbacks"]["missing_asset"] == 0
    for stage in ("fetch", "text", "prefill", "decode", "shape_decode", "meshing", "export", "total"):
        assert stage in params["stages_one_at_a_time_ms"], stage
    assert params["coarse_to_fine_check"]["sign_agreement"] == 1.0
    assert json.loads(out.read_text()) == line
