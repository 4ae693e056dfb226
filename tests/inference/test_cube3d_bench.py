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


def test_step_kernels_splits_steps_at_the_fill_and_overlaps_count_once():
    from bench.cube3d import step_kernels

    def kernel(name, ts, dur, grid=(1, 1, 1)):
        return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": list(grid)}}

    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>>(int)"
    events = [kernel(fill, 0, 1), kernel("_gemv_kernel", 10, 5, (144, 3, 1)), kernel("_attn", 13, 4),
              kernel("_gemv_kernel", 20, 3, (48, 6, 1)), {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 9},
              kernel(fill, 100, 1), kernel("_gemv_kernel", 110, 7, (144, 3, 1)), kernel("_attn", 120, 2),
              kernel("_gemv_kernel", 125, 5, (48, 6, 1))]
    r = step_kernels(events)
    assert r["steps"] == 2 and r["kernels_per_step"] == 3
    assert r["span_us"] == (13 + 20) / 2             # 10..23 and 110..130
    assert r["busy_us"] == (10 + 14) / 2             # 10..17 + 20..23 (overlap once); 110..117 + 120..122 + 125..130
    qkv = next(k for k in r["kernels"] if k["grid"] == [144, 3, 1])
    assert (qkv["kernel"], qkv["per_step"], qkv["us_each"]) == ("_gemv_kernel", 1, 6)
    # the end moved: step 1 10..15 (+5), 17 (+2), 23 (+6); step 2 110..117 (+7), 122 (+5), 130 (+8)
    assert {k["grid"][0]: k["us_added"] for k in r["kernels"] if k["grid"][0] != 1} == {144: 6, 48: 7}
    assert next(k["us_added"] for k in r["kernels"] if k["kernel"] == "_attn") == 3.5
    assert sum(k["us_added"] for k in r["kernels"]) == r["span_us"]
