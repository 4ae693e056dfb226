"""A stream's job left running on a Flink cluster by a `featurectl stream` that died (SIGKILL, a lost host): found
by its name and stopped before the stream starts again.

On a cluster the job outlives its client. Left alone, the orphan keeps checkpointing and deletes the checkpoints
a restart is about to restore (`Cannot find checkpoint ... chk-N`). The runner holds the stream's lock, so no
live client runs the stream from this state folder: a job of the same name is an orphan. One running the
stream's current SQL (same fingerprint) is stopped with a savepoint into the stream's checkpoint folder, which
the restart then restores (nothing is replayed that the orphan had done); if that savepoint fails (the job is
restarting, say), it is cancelled and its newest retained checkpoint is restored instead. A job running other
SQL (an older definition or generation) is cancelled: nothing can restore its state.
"""

from __future__ import annotations

import logging
from common.flink_rest import ENDED, FlinkRest, FlinkRestError
from common.storage import Storage
from streaming.flink_job import job_title, savepoints, title_prefix
from streaming.job_sql import JobPlan

log = logging.getLogger(__name__)


def stop_orphans(jobmanager: str, plan: JobPlan, checkpoints: Storage) -> list[str]:
    """Stop every job of this stream still running on the cluster; returns their job ids."""
    rest = FlinkRest(jobmanager)
    rest.check()
    stopped = []
    for job in rest.jobs():
        if job["state"] in ENDED or not job["name"].startswith(title_prefix(plan)):
            continue
        job_id = job["jid"]
        if job["name"] == job_title(plan) and job["state"] == "RUNNING":
            log.warning("flink job %s (%s) of this stream is still running on %s, its client gone: stopping it "
                        "with a savepoint to resume from", job_id, job["name"], jobmanager)
            try:
                location = rest.stop_with_savepoint(job_id, savepoints(checkpoints).uri)
                log.info("flink job %s stopped with savepoint %s", job_id, location)
                stopped.append(job_id)
                continue
            except FlinkRestError as exc:
                log.warning("%s; cancelling it, its newest checkpoint is restored instead", exc)
        else:
            log.warning("flink job %s (%s, %s) of this stream runs other SQL than this run on %s: cancelling it",
                        job_id, job["name"], job["state"], jobmanager)
        rest.cancel(job_id)
        stopped.append(job_id)
    return stopped
