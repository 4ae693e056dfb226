"""`featurectl bench swap` on the CPU: the tiny model, a promote under steady load through the rollout, the DESIGN.md
line last; the GPU run of the same code is `bench/results/swap-NVIDIA_H200-*.json`."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bench.swap import command

pytestmark = pytest.mark.integration


def test_cpu_swap_line(tmp_path):
    out = tmp_path / "line.json"
    result = CliRunner().invoke(command, ["--device", "cpu", "--clients", "2", "--before-s", "1", "--after-s", "1",
                                          "--poll-s", "0.2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["bench"] == "swap" and line["params"]["config"] == "tiny"
    ours, timing = line["ours"], line["params"]["timing"]
    assert ours["swap_failed_requests"] == 0 and ours["failed_requests"] == 0
    assert all(timing["answered_by"].values()), timing["answered_by"]       # both versions answered under load
    assert timing["during_swap"] > 0 and timing["outside_swap"] > 0
    assert 0 < ours["seen_after_promote_s"] and ours["load_and_warm_up_s"] < ours["swap_s"]
    assert "p99_s" in line["ratio"] and line["params"]["goals_met"] == {"swap_failed_requests==0": True}
    assert json.loads(out.read_text()) == line
