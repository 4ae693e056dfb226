"""What readers outside the stream (`featurectl status`, the feature server's metrics) take from the status files:
per view of a project, the stream writing it, whether it runs (its job lock held) and its lag."""

from __future__ import annotations

from streaming.runner import job_lock
from streaming.status import stream_root, view_lags, write_status


def _status(job: str, project: str, views: list[str], updated_at: str) -> dict:
    return {"job": job, "project": project, "state": "running", "updated_at": updated_at,
            "freshness": {"p50_ms": 420.0, "p99_ms": 700.0, "samples": 9},
            "views": {v: {"events": 1, "head_event_time": "2026-01-01T00:00:00+00:00"} for v in views}}


def test_a_running_job_gives_its_views_lag_and_a_stopped_one_none(tmp_path):
    homes = {job: stream_root(tmp_path) / job for job in ("old", "new", "other")}
    for home in homes.values():
        home.mkdir(parents=True)
    write_status(homes["old"], _status("old", "p", ["a"], "2026-01-02T00:00:00+00:00"))
    write_status(homes["new"], _status("new", "p", ["a", "b"], "2026-01-01T00:00:00+00:00"))
    write_status(homes["other"], _status("other", "q", ["a"], "2026-01-03T00:00:00+00:00"))

    stopped = view_lags(tmp_path, "p")
    assert stopped["a"].job == "old", "neither runs: the latest updated file speaks for the view"
    assert not stopped["a"].running and stopped["a"].p50_ms is None
    assert stopped["a"].state == "not running (last state: running)"

    with job_lock(homes["new"]):
        running = view_lags(tmp_path, "p")
    assert set(running) == {"a", "b"}, "another project's stream is not this one's"
    assert running["a"].job == "new", "a running job speaks for its views before a stopped one"
    assert (running["b"].running, running["b"].state, running["b"].p50_ms, running["b"].p99_ms) == (
        True, "running", 420.0, 700.0)
    assert running["b"].clock == "2026-01-01T00:00:00+00:00"


def test_no_stream_state_means_no_view_is_streamed(tmp_path):
    assert view_lags(tmp_path / "nothing", "p") == {}
