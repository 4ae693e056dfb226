"""`featurectl bench scale` end to end on a small size: its own single node and 3-master cluster, the three
materializations, and the benchmark line (figures are not checked here: benchmarks are for measuring). Its stream
phase takes about two minutes even on a tiny backlog (a session cluster's three JVMs, then two streams on it), too
slow here: what is tested is that its session cluster is stopped by pid when the phase fails."""

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

    done = featurectl("bench", "scale", "--entities", "2000", "--skip-stream", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["bench"] == "scale" and line["params"]["masters"] == 3 and line["params"]["entities"] == 2000
    for side in ("ours", "peer"):
        assert line[side]["cluster_rows_per_s"] > 0 and line[side]["cluster_redis_cpu_per_row_us"] >= 0
    assert line["params"]["single_node_rows_per_s"] > 0 and line["ratio"]["cluster_rows_per_s"] > 0
    assert not scratch_servers(), "bench scale left redis-servers running"


def test_bench_scale_session_cluster_is_stopped_when_the_phase_fails(tmp_path):
    from bench.scale import session_cluster
    from featurectl.services.process import command_line

    with pytest.raises(RuntimeError, match="the phase failed"):
        with session_cluster(tmp_path / "flink") as (jobmanager, pids):
            assert len(pids) == 3 and all(command_line(pid) for pid in pids) and jobmanager.startswith("127.0.0.1:")
            raise RuntimeError("the phase failed")
    assert not [pid for pid in pids if command_line(pid)], "the session cluster's JVMs still run"
