"""The benchmark's CPU mode runs end to end and prints the DESIGN.md line last."""

from __future__ import annotations

import json

from click.testing import CliRunner

from bench.cube3d import command

METRICS = {"tpot_ms", "tokens_512_s", "batch8_objects_per_s", "eager_nocache_tpot_ms", "eager_kv_tpot_ms",
           "achieved_gbps", "shape_decode_s"}


def test_cpu_tiny_benchmark_line(tmp_path):
    out = tmp_path / "line.json"
    result = CliRunner().invoke(command, ["--device", "cpu", "--config", "tiny", "--quick", "--batch", "2",
                                          "--out", str(out)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output.strip().splitlines()[-1])
    assert line["bench"] == "cube3d" and METRICS <= set(line["ours"])
    assert {"tpot_ms", "tokens_512_s", "batch8_objects_per_s"} <= set(line["ratio"])
    assert line["params"]["mesh"]["faces"] > 0 and "errors" not in line["params"]
    assert json.loads(out.read_text()) == line
