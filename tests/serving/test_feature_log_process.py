"""The feature log writer process: what is logged is what was served, checked against the rows written to Redis
(not against the answers, nor the code that writes the logs), across many hand-overs; a killed writer costs the
rows it held, counted, and no request, and a new one takes over; a killed worker's writer still writes what it
received."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pyarrow.dataset as ds
import pytest
from cli_helpers import cli_server
from feature_log_env import log_table, logged_repo, pipelined
from featurectl.services.scratch_redis import RedisServer
from serving_env import get

pytestmark = pytest.mark.integration

# What each entity's row must say: the rows `logged_repo` wrote, or none (`zz` was never written)
KNOWN = {"a1": {"asset_activity__views_1h": (4, 1), "asset_activity__dwell_ms_mean_1h": (2.5, 1),
                "asset_attributes__category": ("chair", 1), "asset_attributes__polygon_count": (1200, 1)},
         "zz": {"asset_activity__views_1h": (None, 3), "asset_activity__dwell_ms_mean_1h": (None, 3),
                "asset_attributes__category": (None, 3), "asset_attributes__polygon_count": (None, 3)}}
WRITE_EVERY = {"flush_s": 3600, "flush_rows": 1000}  # files every 1,000 rows: a test knows what is not written


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One worker over `logged_repo`: (repo, the server)."""
    folder = tmp_path_factory.mktemp("featurelogprocess")
    redis_server = RedisServer(folder)
    try:
        repo = logged_repo(folder, f"featurelogproc{os.getpid()}", redis_server.port, WRITE_EVERY)[0]
        with cli_server(repo, "serve", log=folder / "server.log") as running:
            yield repo, running
    finally:
        redis_server.stop()


def _bodies(assets: list[str]) -> list[bytes]:
    return [json.dumps({"feature_service": "logged_ranking", "entities": {"asset_id": [asset]}}).encode()
            for asset in assets]


def _writer_pid(server_pid: int, other_than: int = 0) -> int:
    """The pid of the server's feature log writer process, waiting for one (other than `other_than`) to start."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(server_pid).children(recursive=True):
            try:
                if child.pid != other_than and "serving.feature_log_writer" in child.cmdline():
                    return child.pid
            except psutil.Error:  # exited meanwhile, or a zombie
                continue
        time.sleep(0.1)
    raise AssertionError("no feature log writer process within 30 s")


def _counts(url: str) -> dict:
    return json.loads(get(url, "/stats")[1])["feature_log"].get("logged_ranking", dict.fromkeys(
        ("logged", "dropped", "written", "failed"), 0))


def _settled(url: str, outcome: str, rows: int) -> dict:
    """The server's log counters of `logged_ranking` once `outcome` reached `rows` and the writer has parsed every
    row logged (it reports every 0.2 s)."""
    deadline = time.monotonic() + 30
    while True:
        stats = json.loads(get(url, "/stats")[1])
        counts = stats["feature_log"].get("logged_ranking", {})
        if counts.get(outcome, 0) >= rows and not stats["feature_log_queued_rows"]:
            return counts
        assert time.monotonic() < deadline, f"{outcome} did not reach {rows} within 30 s: {stats['feature_log']}"
        time.sleep(0.1)


def _logged_ids(repo, prefix: str) -> list[str]:
    """The request ids logged for `logged_ranking` that start with `prefix` (the tests share the log folder)."""
    return [i for i in log_table(repo, "logged_ranking").column("__request_id").to_pylist() if i.startswith(prefix)]


def test_logged_rows_are_the_rows_served(server):
    repo, running = server
    assets = ["a1", "zz"] * 500  # 1,000 one-row requests on one connection: many batches to the writer
    ids = [f"oracle-{i}" for i in range(len(assets))]
    before = _counts(running.url)
    assert pipelined(int(running.url.rsplit(":", 1)[1]), _bodies(assets), ids) == [200] * len(assets)
    counts = _settled(running.url, "written", before["written"] + len(assets))
    assert (counts["dropped"], counts["failed"]) == (before["dropped"], before["failed"])
    rows = {row["__request_id"]: row for row in log_table(repo, "logged_ranking").to_pylist()}
    assert sorted(_logged_ids(repo, "oracle-")) == sorted(ids)  # each once
    for request_id, asset in zip(ids, assets):
        row = rows[request_id]
        assert row["asset_id"] == asset
        assert {column: (row[column], row[f"{column}__status"]) for column in KNOWN[asset]} == KNOWN[asset]


def test_a_killed_writer_costs_its_rows_counted_and_no_request(server):
    repo, running = server
    port = int(running.url.rsplit(":", 1)[1])
    start = _counts(running.url)
    held = [f"held-{i}" for i in range(50)]
    assert pipelined(port, _bodies(["a1"] * 50), held) == [200] * 50
    _settled(running.url, "logged", start["logged"] + 50)  # parsed by the writer, not written (below flush_rows)
    writer = _writer_pid(running.process.pid)
    os.kill(writer, signal.SIGKILL)
    _writer_pid(running.process.pid, other_than=writer)  # started once the loss was counted
    after = [f"after-{i}" for i in range(1000)]
    assert pipelined(port, _bodies(["a1"] * 1000), after) == [200] * 1000
    counts = _settled(running.url, "written", start["written"] + 1000)  # the new writer's first file
    assert [counts[k] - start[k] for k in ("logged", "failed", "dropped")] == [1050, 50, 0]
    assert f"feature log writer process {writer} exited with code -9: 50 logged rows" in running.log.read_text()
    assert sorted(_logged_ids(repo, "after-")) == sorted(after) and _logged_ids(repo, "held-") == []


WORKER = """
import os, signal, sys, time
from pathlib import Path
from common.config import FeatureLogSettings
from feature_log_env import one_feature_spec, one_row_answer
from serving.feature_log import FeatureLogger
from serving.stats import ServerStats

stats = ServerStats()
log = FeatureLogger(FeatureLogSettings(flush_s=3600), stats)
log.start()
for value in range(3):
    log.offer(one_feature_spec(Path(sys.argv[1])), one_row_answer(float(value)), 1, f"r{value}")
while stats.log_queued:  # until the writer has parsed them
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_worker_s_writer_writes_what_it_received(tmp_path):
    """A worker killed with SIGKILL closes the pipe: its writer writes the rows it has, then exits."""
    here = Path(__file__).parent
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    worker = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path / "logs")], timeout=60,
                            env={**os.environ, "PYTHONPATH": path})
    assert worker.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while not list((tmp_path / "logs").rglob("*.parquet")):
        assert time.monotonic() < deadline, "the writer wrote nothing within 30 s of its worker's death"
        time.sleep(0.1)
    rows = ds.dataset(tmp_path / "logs", partitioning="hive", ignore_prefixes=["."]).to_table().to_pylist()
    assert [(r["__request_id"], r["v__views"]) for r in rows] == [("r0", 0.0), ("r1", 1.0), ("r2", 2.0)]
