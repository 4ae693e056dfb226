"""A Flink session cluster started by `featurectl services up --flink 2` (a JobManager and two TaskManagers from
PyFlink's distribution, on free ports, its state in a temporary folder, stopped by its pids): backfill and stream
run on it at parallelism 2 and are exact against the oracles, through a TaskManager SIGKILL and a stream client
SIGKILL whose job the restart takes over. One cluster serves the whole module (it takes 10 to 20 s to start), and one
stream repo the tests that kill its client and restart it."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from batch.backfill import BackfillTarget, backfill
from cli_helpers import ROOT, featurectl, free_port
from common.config import ProjectConfig, load_config
from common.flink_rest import ENDED, FlinkRest
from common.storage import Storage
from dsl import load_repo
from fault_env import sibling
from featurectl.services.flink_cluster import FlinkJobManager, FlinkTaskManager
from featurectl.services.process import command_line
from streaming.flink_job import savepoints
from streaming.status import read_statuses

stream_env = sibling("stream_env", "streaming")
exactness = sibling("test_stream_exactness", "streaming")
history = sibling("backfill_history", "batch")
backfill_rows = sibling("test_backfill", "batch")
StreamProcess, StreamRepo = stream_env.StreamProcess, stream_env.StreamRepo
MINUTE, T0 = exactness.MINUTE, exactness.T0

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Cluster:
    repo: Path
    cfg: ProjectConfig
    address: str  # the REST address jobs are given

    @property
    def rest(self) -> FlinkRest:
        return FlinkRest(self.address)

    def taskmanager(self, index: int) -> FlinkTaskManager:
        return FlinkTaskManager(self.cfg, index)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flink_session")
    repo = sibling("test_services", "featurectl").scratch_repo(folder)
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    raw["platform"]["flink"] = {"local": {"rest_port": free_port(), "rpc_port": free_port()}}
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    done = featurectl("--repo", str(repo), "services", "up", "--only", "flink", "--flink", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    cfg = load_config(repo)
    pids = [svc.pid() for svc in (FlinkJobManager(cfg), FlinkTaskManager(cfg, 1), FlinkTaskManager(cfg, 2))]
    try:
        yield Cluster(repo, cfg, f"127.0.0.1:{cfg.platform.flink.local.rest_port}")
    finally:
        down = featurectl("--repo", str(repo), "services", "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert not [pid for pid in pids if pid is not None and command_line(pid)], "a Flink JVM outlived down"


def test_services_up_flink_starts_a_session_cluster_that_status_lists(cluster):
    taskmanagers = cluster.rest.taskmanagers()
    assert sorted(tm["id"] for tm in taskmanagers) == ["featurectl-tm-1", "featurectl-tm-2"]
    assert all(tm["slotsNumber"] == 2 for tm in taskmanagers)
    done = featurectl("--repo", str(cluster.repo), "services", "status")
    assert done.returncode == 0, done.stderr
    for name in ("flink-jobmanager", "flink-taskmanager-1", "flink-taskmanager-2"):
        assert re.search(rf"^{name}\s+up\s+pid \d+", done.stdout, re.M), done.stdout
    assert f"127.0.0.1:{cluster.cfg.platform.flink.local.rest_port}" in done.stdout
    again = featurectl("--repo", str(cluster.repo), "services", "up", "--only", "flink", "--flink", "2")
    assert again.returncode == 0 and again.stdout.count("already running") == 3, again.stdout


def test_jobmanager_given_the_rpc_port_says_it_needs_the_rest_port(cluster):
    began = time.monotonic()
    done = featurectl("--repo", str(cluster.repo), "backfill", "--start", "2026-01-01", "--end",
                      "2026-01-02", "--jobmanager", f"127.0.0.1:{cluster.cfg.platform.flink.local.rpc_port}")
    assert done.returncode != 0
    assert "is not a Flink REST address" in done.stderr and "the RPC port 6123 will not do" in done.stderr
    assert "Traceback" not in done.stderr and time.monotonic() - began < 60, done.stderr


def test_backfill_on_the_session_cluster_at_parallelism_2_is_exact(cluster, tmp_path):
    repo = load_repo(ROOT / "feature_repo")
    events = history.write_history(repo, tmp_path / "data")
    target = BackfillTarget(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}", "assets")
    before = {job["jid"] for job in cluster.rest.jobs()}
    start, end = history.utc(history.T0_MS), history.utc(history.T1_MS)
    backfill(repo.views, start, end, target, parallelism=2, jobmanager=f"http://{cluster.address}/")
    ran = [job for job in cluster.rest.jobs() if job["jid"] not in before]
    assert [job["state"] for job in ran] == ["FINISHED"], ran
    vertices = cluster.rest.call("GET", f"/jobs/{ran[0]['jid']}")["vertices"]
    assert max(v["parallelism"] for v in vertices) == 2
    for view in repo.views:
        backfill_rows.assert_rows_match_oracle(view, backfill_rows.read_offline(target.data_dir, view),
                                               events[view.source.name], history.T0_MS, history.T1_MS)


def busy_taskmanager(cluster: Cluster) -> int:
    """The index of a TaskManager running tasks of the job."""
    busy = [tm["id"] for tm in cluster.rest.taskmanagers() if tm["freeSlots"] < tm["slotsNumber"]]
    assert busy, "no TaskManager runs the job"
    return int(busy[0].rsplit("-", 1)[1])


def stream_jobs(cluster: Cluster, repo: StreamRepo) -> list[dict]:
    return [job for job in cluster.rest.jobs() if job["name"].startswith(f"featurectl stream {repo.project}.")]


@dataclass
class SessionStream:
    """A stream repo of `asset_activity` whose streams run on the session cluster at parallelism 2, and the
    `featurectl stream` running it now."""
    repo: StreamRepo
    folder: Path
    stream: StreamProcess | None = None
    starts: int = 0

    def start(self, *args: str) -> dict:
        """Start `featurectl stream` (again, after its client was killed); the status it runs with."""
        self.starts += 1
        self.stream = StreamProcess(self.repo, self.folder / f"stream-{self.starts}.log", *args)
        return self.stream.wait_running()


@pytest.fixture(scope="module")
def session_stream(cluster, tmp_path_factory):
    """One stream repo for the tests that kill a stream's client and restart it, since a stream start on the
    cluster costs a Python, a JVM and a job submission: each test takes over the stream running and leaves its
    restart running. Only the first produces events. The last restart must stop cleanly, no job left running."""
    folder = tmp_path_factory.mktemp("session_stream")
    repo = StreamRepo.create(folder / "repo", ("asset_activity",), name="stream_session")
    settings = yaml.safe_load((repo.folder / "feature_store.yaml").read_text())
    settings["platform"]["flink"] = {"jobmanager": cluster.address, "parallelism": 2}
    (repo.folder / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    running = SessionStream(repo, folder)
    try:
        running.start()
        yield running
        assert running.stream.stop() == 0
        assert not [j for j in stream_jobs(cluster, repo) if j["state"] not in ENDED], "a job left running"
    finally:
        if running.stream:
            running.stream.kill()
        for job in stream_jobs(cluster, repo):
            if job["state"] not in ENDED:
                cluster.rest.cancel(job["jid"])
        repo.cleanup()


def test_stream_on_the_session_cluster_survives_a_taskmanager_and_a_client_killed(cluster, session_stream):
    """Parallelism 2 on the cluster. A TaskManager SIGKILLed: the job restarts from its checkpoint on the slots
    left. The client SIGKILLed: its job runs on; the restart stops it with a savepoint and restores that. Served
    values end equal to the oracle over every event, every dead letter written once."""
    repo, stream = session_stream.repo, session_stream.stream
    view = repo.views()[0]
    rng, log = random.Random(20), stream_env.EventLog()
    parts = exactness.interaction_parts(log, rng, 3, 1_500, 40 * MINUTE, 20, late_share=0.01)
    on_time_after = [len([e for e in log.on_time if e["event_time"] < T0 + (i + 1) * 40 * MINUTE]) for i in range(3)]
    first = stream.wait_running()
    jobs = [j for j in stream_jobs(cluster, repo) if j["state"] not in ENDED]
    assert [(j["jid"], j["state"]) for j in jobs] == [(first["flink_job_id"], "RUNNING")], jobs
    stream_env.produce(repo.topic, parts[0])
    applied = stream.wait_events({"asset_activity": on_time_after[0]})
    stream.wait(lambda s: (s.get("checkpoint") or {}).get("at", "") > applied["updated_at"],
                "a checkpoint after the first part")

    killed = cluster.taskmanager(busy_taskmanager(cluster))
    os.kill(killed.pid(), signal.SIGKILL)
    stream_env.produce(repo.topic, parts[1])
    applied = stream.wait_events({"asset_activity": on_time_after[1]})
    restored = featurectl("--repo", str(cluster.repo), "services", "up", "--only", "flink", "--flink", "2")
    assert restored.returncode == 0 and f"{killed.name}: started" in restored.stdout, restored.stdout
    stream.wait(lambda s: (s.get("checkpoint") or {}).get("at", "") > applied["updated_at"],
                "a checkpoint after the second part")

    stream.kill()
    orphan = first["flink_job_id"]
    assert cluster.rest.state(orphan) == "RUNNING", "the job should outlive its killed client on a cluster"
    stream_env.produce(repo.topic, parts[2])
    status = session_stream.start()
    assert status["orphans_stopped"] == [orphan]
    assert "/savepoints/savepoint-" in status["restored_from"], status["restored_from"]
    assert cluster.rest.state(orphan) == "FINISHED"
    session_stream.stream.wait_events({"asset_activity": len(log.on_time)})

    keys = sorted({e["asset_id"] for e in log.on_time})
    want, got = stream_env.expected(view, log.on_time), stream_env.served(repo.project, view, keys)
    assert not stream_env.mismatches(want, got, view.feature_names)
    letters = stream_env.dead_letters(repo.topic, len(log.dead))
    assert sorted(d["kafka_offset"] for d in letters) == sorted(log.dead), "dead letters lost or duplicated"


def test_a_restart_with_other_sql_cancels_the_orphan_instead_of_restoring_it(cluster, session_stream):
    """A client killed, then restarted with `--reset` (a new generation, so other SQL): the orphan cannot be
    restored into the new job, so it is cancelled, not stopped with a savepoint; the new job runs from nothing."""
    first = session_stream.stream.wait_running()
    session_stream.stream.kill()
    orphan = first["flink_job_id"]
    assert cluster.rest.state(orphan) == "RUNNING"
    status = session_stream.start("--reset")
    assert status["orphans_stopped"] == [orphan] and status["fingerprint"] != first["fingerprint"]
    assert cluster.rest.state(orphan) == "CANCELED" and not status["restored_from"]
    running = [j["jid"] for j in stream_jobs(cluster, session_stream.repo) if j["state"] == "RUNNING"]
    assert running == [status["flink_job_id"]]


def test_an_orphan_whose_savepoint_fails_is_cancelled_and_its_checkpoint_restored(cluster, session_stream):
    """A client killed, and a file put where the savepoints folder goes: stopping the orphan with a savepoint fails,
    so it is cancelled instead and the restart restores the newest checkpoint the orphan left."""
    first = session_stream.stream.wait(lambda s: (s.get("checkpoint") or {}).get("at"), "a checkpoint")
    session_stream.stream.kill()
    orphan = first["flink_job_id"]
    assert cluster.rest.state(orphan) == "RUNNING"
    home = read_statuses(session_stream.repo.folder / "state")[0][0]
    blocker = Path(savepoints(Storage.local(home).child("checkpoints", first["fingerprint"])).display)
    shutil.rmtree(blocker, ignore_errors=True)
    blocker.write_text("a file where Flink would make the savepoint folder")
    status = session_stream.start()
    assert status["orphans_stopped"] == [orphan]
    assert cluster.rest.state(orphan) == "CANCELED"
    assert re.search(r"/chk-\d+$", status["restored_from"] or ""), status["restored_from"]
