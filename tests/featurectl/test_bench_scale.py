"""`featurectl bench scale` end to end on a small size: its own single node and 3-master cluster, the three
materializations, and the benchmark line (figures are not checked here: benchmarks are for measuring)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import featurectl

pytestmark = pytest.mark.integration


def test_bench_scale_prints_both_sides_and_stops_its_redis_servers(local_services):
    import psutil

    def scratch_servers() -> set[int]:
        return {p.pid for p in psutil.process_iter(["cmdline"])
                if "bench-scale-" in " ".join(p.info["cmdline"] or [])}

    done = featurectl("bench", "scale", "--entities", "2000", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "scale" and line["params"]["masters"] == 3 and line["params"]["entities"] == 2000
    for side in ("ours", "peer"):
        assert line[side]["cluster_rows_per_s"] > 0 and line[side]["cluster_redis_cpu_per_row_us"] >= 0
    assert line["params"]["single_node_rows_per_s"] > 0 and line["ratio"]["cluster_rows_per_s"] > 0
    assert not scratch_servers(), "bench scale left redis-servers running"
