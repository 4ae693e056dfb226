"""A view applied at a new version: `materialize` refuses offline rows of the old one until they are re-backfilled
or `--allow-stale` names the view, and the SDK and the server (409) refuse its online values of the old one until
a materialize writes the applied version. Against the shared Redis, in-process, with a registry of the test's own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from cli_helpers import answer_in_process
from version_env import edit, make_repo, record_backfill, run, versions

from common.config import load_config
from common.version_log import VersionLog
from dsl import load_repo
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path
from dsl.types import ValueType
from featurectl.offline_versions import StaleOfflineError
from redis_store.freshness import record_key
from redis_store.freshness_history import history_key
from serving import OnlineClient
from serving.errors import VersionConflictError
from serving.http_app import FEATURES_PATH

pytestmark = pytest.mark.integration

VIEW = "asset_activity"
NOW = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
START, END = NOW - dt.timedelta(days=1), NOW
VALUES = {ValueType.INT64: lambda i: i, ValueType.FLOAT64: lambda i: i + 0.5, ValueType.STRING: lambda i: f"u{i}"}


def _write_offline_table(repo: Path, factor: int, assets: range) -> None:
    """What a backfill writes: one row an hour ago per asset `a{i}` of `assets`, every feature at `factor` * i (of
    the feature's type), replacing the table."""
    view = load_repo(repo).view(VIEW)
    stamps = pa.array([NOW - dt.timedelta(hours=1)] * len(assets), pa.timestamp("ms", "UTC"))
    columns = {"asset_id": [f"a{i}" for i in assets], EVENT_TIMESTAMP: stamps}
    columns.update({name: [VALUES[kind](factor * i) for i in assets] for name, kind in view.output_schema().items()})
    folder = offline_table_path(load_config(repo).data_dir, view)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), folder / "part-0.parquet")


def _backfilled(repo: Path, factor: int, assets: range, version: str) -> None:
    """The table and the record of a backfill of `version` over [START, END)."""
    _write_offline_table(repo, factor, assets)
    record_backfill(repo, VIEW, START, END, version)


def _served(client: OnlineClient) -> list:
    client.registry.refresh()
    return client.get_features([f"{VIEW}:views_1h"], {"asset_id": ["a0", "a1", "a2"]})["views_1h"]


def _post(repo: Path, body: dict) -> tuple[int, dict]:
    """`POST /get-online-features` answered by the feature server's app in this process."""
    return answer_in_process(repo, FEATURES_PATH, body)


def _online_writer(repo: Path) -> tuple[str, str, bool]:
    cfg = load_config(repo)
    version_log = VersionLog(cfg.registry_url)
    try:
        online = version_log.online(cfg.project)[VIEW]
    finally:
        version_log.close()
    return online.version, online.written_by, online.stale_accepted


def _delete_keys(project: str, client: redis.Redis) -> None:
    client.delete(record_key(project), history_key(project))
    keys = [key for key in client.scan_iter(count=10_000) if key.endswith(project.encode())]
    if keys:
        client.delete(*keys)


def test_a_new_version_is_refused_offline_and_online_until_rebackfilled_or_allowed(tmp_path, local_services):
    project = f"stale_{uuid.uuid4().hex[:8]}"
    repo = make_repo(tmp_path, project)
    run(repo, "apply")
    first = versions(repo)[VIEW]
    _backfilled(repo, 1, range(3), first)
    materialize = ("materialize", START.isoformat(), END.isoformat(), "--view", VIEW)
    run(repo, *materialize)
    assert _online_writer(repo) == (first, "featurectl materialize", False)
    to_views = ('filter=is_type["view"], name="views"', 'filter=is_type["download"], name="views"')
    try:
        with OnlineClient.from_repo(repo, refresh_s=0) as client:
            assert _served(client) == [0, 1, 2]
            edit(repo, *to_views)
            run(repo, "apply")
            second = versions(repo)[VIEW]
            with pytest.raises(VersionConflictError) as conflict:
                _served(client)
            assert (f"feature view `{VIEW}`: its online values are of version {first} (`featurectl materialize` at "
                    in str(conflict.value))
            assert f"but version {second} is applied" in str(conflict.value)
            status, body = _post(repo, {"features": [f"{VIEW}:views_1h"], "entities": {"asset_id": ["a1"]}})
            assert (status, body["code"]) == (409, "version_conflict") and body["error"] == str(conflict.value)
            assert _post(repo, {"features": ["asset_attributes:category"], "entities": {"asset_id": ["a1"]}})[0] == 200

            refused = run(repo, *materialize, ok=False)
            assert isinstance(refused.exception, StaleOfflineError), refused.output
            zulu = [t.isoformat().replace("+00:00", "Z") for t in (START, END)]
            assert (f"offline rows of `{VIEW}` in the range were backfilled by another version than the applied "
                    f"{second}: re-backfill them: `featurectl --repo {repo} backfill --start {zulu[0]} --end {zulu[1]} "
                    f"--view {VIEW}` (version {first}); or pass --allow-stale {VIEW} to materialize them anyway"
                    ) in str(refused.exception)
            assert run(repo, *materialize, "--allow-stale", "nope", ok=False).exit_code == 2

            # Re-backfilled: the rows at the same instants replace the old version's, a0 (no row now) is gone.
            _backfilled(repo, 10, range(1, 3), second)
            assert "cleared them first" in run(repo, *materialize).stdout
            assert _online_writer(repo) == (second, "featurectl materialize", False)
            assert _served(client) == [None, 10, 20]

            edit(repo, *reversed(to_views))  # the repo is back at the first version, not applied
            ahead = run(repo, *materialize, ok=False)
            assert isinstance(ahead.exception, StaleOfflineError)
            assert (f"the repo defines version {first} of `{VIEW}` but version {second} is applied: run `featurectl "
                    f"--repo {repo} plan` and `featurectl --repo {repo} apply` first") in str(ahead.exception)

            # Applied again and forced: the rows of the second version are served as the first's, until replaced.
            run(repo, "apply")
            forced = run(repo, *materialize, "--allow-stale", VIEW)
            assert f"warning: --allow-stale {VIEW}: materializing although offline rows" in forced.stderr
            assert _online_writer(repo) == (first, "featurectl materialize --allow-stale", True)
            assert _served(client) == [None, 10, 20]
            _backfilled(repo, 100, range(1, 2), first)
            run(repo, *materialize)
            assert _online_writer(repo) == (first, "featurectl materialize", False)
            assert _served(client) == [None, 100, None]
    finally:
        _delete_keys(project, redis.Redis(*local_services.redis_host_port))
