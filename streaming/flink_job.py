"""The Flink side of a stream: settings, start (resuming from the latest retained checkpoint of the same SQL),
status, cancel. No Python runs inside the job: every operator is Flink SQL in the JVM.

Checkpoints go to `<checkpoints>/<flink job id>/chk-N` (one folder per fingerprint of the job's SQL, so a job
never restores state written by other SQL) and are retained on cancel and on crash; a restarted job restores
the newest complete one (its operator state, and the Kafka offsets it had read to), or the newer savepoint an
orphaned job of the stream was stopped with (`<checkpoints>/savepoints/`, see `streaming.orphans`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

from common.errors import FeaturectlError
from common.storage import Storage
from streaming.config import StreamSettings
from streaming.job_sql import JobPlan

log = logging.getLogger(__name__)

_DONE = ("FAILED", "CANCELED", "FINISHED")


class StreamJobError(FeaturectlError, RuntimeError):
    """The Flink job failed or could not start; the message says where its log is."""


def job_title(plan: JobPlan) -> str:
    """The job's name on a cluster: the stream (what finds it again) and the fingerprint of its SQL."""
    return f"{title_prefix(plan)}{plan.fingerprint}"


def title_prefix(plan: JobPlan) -> str:
    return f"featurectl stream {plan.name} @"


def flink_options(plan: JobPlan, settings: StreamSettings, checkpoints: Storage,
                  restore: Optional[Storage]) -> dict[str, str]:
    options = {
        "pipeline.name": job_title(plan),
        "pipeline.object-reuse": "true",  # chained operators hand records on without copying them
        "execution.buffer-timeout.interval": "20 ms",  # a half-full network buffer waits at most this long
        "table.exec.mini-batch.enabled": "true",
        "table.exec.mini-batch.allow-latency": f"{settings.mini_batch_latency_ms} ms",
        "table.exec.mini-batch.size": str(settings.mini_batch_size),
        "state.backend.type": "hashmap",
        "execution.checkpointing.interval": f"{int(settings.checkpoint_interval_s * 1000)} ms",
        "execution.checkpointing.dir": checkpoints.uri,
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": str(settings.checkpoints_retained),
    }
    if restore is not None:  # the metadata file, not its folder: object stores may answer for a folder as a file
        options["execution.state-recovery.path"] = restore.child("_metadata").uri
    return options


def savepoints(checkpoints: Storage) -> Storage:
    return checkpoints.child("savepoints")


def completed_checkpoints(checkpoints: Storage) -> list[Storage]:
    """Every complete checkpoint (a `<job>/chk-N` folder with its `_metadata`) and savepoint
    (`savepoints/savepoint-*`), oldest first."""
    found = []
    for path, mtime_ns in checkpoints.file_times().items():
        parts = path.split("/")
        if len(parts) == 3 and parts[2] == "_metadata" and (
                parts[1].startswith("chk-") or parts[0] == "savepoints" and parts[1].startswith("savepoint-")):
            found.append((mtime_ns, _number(parts[1]), checkpoints.child(parts[0], parts[1])))
    return [folder for _, _, folder in sorted(found, key=lambda f: f[:2])]


def _number(name: str) -> int:
    """N of `chk-N`; savepoints (ordered by time alone) 0."""
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if name.startswith("chk-") and tail.isdigit() else 0


def latest_checkpoint(checkpoints: Storage) -> Optional[Storage]:
    done = completed_checkpoints(checkpoints)
    return done[-1] if done else None


def prune_checkpoints(checkpoints: Storage, job_id: str) -> None:
    """Once the running job has a checkpoint of its own, the folders of earlier runs are not needed (hashmap
    state: every checkpoint stands alone)."""
    files = checkpoints.files()
    if not any(p.startswith(f"{job_id}/chk-") and p.endswith("/_metadata") for p in files):
        return
    for folder in sorted({p.split("/", 1)[0] for p in files if "/" in p} - {job_id}):
        checkpoints.child(folder).delete()


class FlinkJob:
    """One submitted job: `start` submits it (a local mini-cluster, or `jobmanager` host:port)."""

    def __init__(self, client, log_dir: Path):
        self.client = client
        self.log_dir = log_dir
        self.job_id = str(client.get_job_id())

    @classmethod
    def start(cls, plan: JobPlan, options: dict[str, str], log_dir: Path, jobmanager: Optional[str] = None,
              parallelism: int = 1, storage: Optional[Storage] = None) -> "FlinkJob":
        from common.flink import create_table_env, pin_planner

        log_dir.mkdir(parents=True, exist_ok=True)
        os.environ["FLINK_LOG_DIR"] = str(log_dir)  # read when PyFlink launches its JVM
        env = create_table_env(streaming=True, options=options, jobmanager=jobmanager, parallelism=parallelism,
                               storage=storage)
        for statement in plan.ddl():
            env.execute_sql(statement)
        statements = env.create_statement_set()
        for insert in plan.inserts():
            statements.add_insert_sql(insert)
        pin_planner(env)
        job = cls(statements.execute().get_job_client(), log_dir)
        log.info("flink job %s submitted (%d tile queries, %d dead-letter queries)", job.job_id, len(plan.views),
                 len(plan.sources))
        return job

    def status(self) -> str:
        return str(self.client.get_job_status().result()).rsplit(".", 1)[-1]

    def check(self) -> str:
        """The job's status; raises when it has ended on its own."""
        status = self.status()
        if status in _DONE:
            raise StreamJobError(f"the Flink job {self.job_id} is {status}; see the Flink log in {self.log_dir}")
        return status

    def cancel(self, timeout_s: float = 30.0) -> None:
        """Cancel, then wait until the job has ended: on a cluster the cancel is acknowledged while the job is still
        CANCELLING, and a start right after would find it running under the stream's name."""
        try:
            self.client.cancel().result()
        except Exception as exc:  # the job may already be gone (failed, or its JVM stopped); nothing to undo
            log.warning("cancelling flink job %s: %s", self.job_id, exc)
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.status() in _DONE:
                    return
            except Exception:  # the local mini-cluster forgets a cancelled job at once: it has ended
                return
            time.sleep(0.2)
        log.warning("flink job %s still not cancelled after %.0f s", self.job_id, timeout_s)
