"""Every error a user can act on reaches them as one line (`Error: ...`, exit 1) or as click's usage message for a
bad option value (exit 2), never as a traceback."""

from __future__ import annotations

import pytest
import yaml

from cli_helpers import copy_example_repo, featurectl, free_port, register_repo


def _one_line_error(done, *fragments: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_an_unknown_view_is_one_line(tmp_path):
    repo = copy_example_repo(tmp_path, "errs", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    done = featurectl("--repo", str(repo), "materialize-incremental", "2026-01-01", "--view", "nosuch")
    _one_line_error(done, "feature view `nosuch`", "is not defined")


def test_a_missing_repo_is_one_line(tmp_path):
    _one_line_error(featurectl("--repo", str(tmp_path / "nowhere"), "plan"), "no feature_store.yaml")


@pytest.mark.integration
def test_stream_with_a_cluster_config_on_a_single_node_is_one_line(tmp_path, local_services):
    repo = copy_example_repo(tmp_path, "errs_cluster", {"path": f"sqlite:///{tmp_path / 'registry.db'}"},
                             {"type": "redis", "redis_type": "redis_cluster",
                              "connection_string": ":".join(map(str, local_services.redis_host_port))},
                             data_dir=tmp_path / "data")
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["platform"]["state_dir"] = str(tmp_path / "state")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    _one_line_error(featurectl("--repo", str(repo), "stream", "--view", "asset_activity"),
                    "is not a Redis Cluster node", "set `redis_type: redis`")


def test_a_bad_instant_is_a_usage_error_with_the_rule(tmp_path):
    repo = copy_example_repo(tmp_path, "errs_time", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    for args in (("materialize", "last week", "2026-01-02"), ("backfill", "--start", "2026-01-01", "--end", "soon")):
        done = featurectl("--repo", str(repo), *args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "is not a date or time" in done.stderr and "UTC unless an offset is given" in done.stderr


def test_materialize_refuses_an_empty_range_and_a_far_future_end(tmp_path):
    repo = copy_example_repo(tmp_path, "errs_range", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    _one_line_error(featurectl("--repo", str(repo), "materialize", "2026-01-02", "2026-01-01"),
                    "empty range: START 2026-01-02T00:00:00+00:00 is after END 2026-01-01T00:00:00+00:00")
    for args in (("materialize", "2026-11-30", "9999-12-31T23:59:59"), ("materialize-incremental", "9999-12-31")):
        _one_line_error(featurectl("--repo", str(repo), *args), "END: 9999-12-31", "is more than 1 day after now",
                        "or pass --force")


def test_materialize_an_unknown_or_unregistered_view_is_one_line(tmp_path):
    repo = copy_example_repo(tmp_path, "errs_views", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    done = featurectl("--repo", str(repo), "materialize", "2026-01-01", "2026-01-02", "--view", "nope")
    _one_line_error(done, "feature view `nope`", "defined views: asset_activity, asset_attributes, user_activity")
    done = featurectl("--repo", str(repo), "materialize", "2026-01-01", "2026-01-02", "--view", "asset_activity")
    _one_line_error(done, "feature view `asset_activity` is not in the registry", "run `featurectl apply`")


def test_instants_past_the_calendar_are_one_line(tmp_path):
    repo = copy_example_repo(tmp_path, "errs_calendar", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    for end, reason in (("9999-12-31T23:59:59-01:00", "outside the calendar (years 1 to 9999) once in UTC"),
                        ("10000-01-01", "is not a date or time")):
        done = featurectl("--repo", str(repo), "materialize", "2026-01-01", end)
        assert done.returncode == 2 and "Traceback" not in done.stderr and reason in done.stderr, done.stderr
    register_repo(repo)
    done = featurectl("--repo", str(repo), "materialize-incremental", "0001-01-01", "--view", "asset_activity")
    _one_line_error(done, "END - the ttl of `asset_activity`", "is outside the calendar (years 1 to 9999)")


def test_materializing_every_view_leaves_out_asset_views_with_nothing_derived(tmp_path):
    repo = copy_example_repo(tmp_path, "errs_assets", {"path": f"sqlite:///{tmp_path / 'registry.db'}"},
                             data_dir=tmp_path / "data")
    register_repo(repo)
    done = featurectl("--repo", str(repo), "materialize", "2026-01-01", "2026-01-02")
    assert ("warning: `asset_geometry` is left out: asset source `asset_meshes` has no derived assets yet; run "
            "`featurectl assets process` first") in done.stderr
    _one_line_error(done, "feature view `asset_activity` has no offline table", "run `featurectl backfill`")
    done = featurectl("--repo", str(repo), "materialize", "2026-01-01", "2026-01-02", "--view", "asset_geometry")
    _one_line_error(done, "feature view `asset_geometry` has no offline table",
                    "run `featurectl assets process --source asset_meshes` for it first")


def test_commands_that_write_local_history_refuse_data_in_shared_storage(tmp_path):
    """With the histories and offline tables in an object store, what writes them as local files says so, in one
    line, instead of writing a local folder that no backfill reads; a `data_storage` that is no URI is refused."""
    repo = copy_example_repo(tmp_path, "errs_storage", {"path": f"sqlite:///{tmp_path / 'registry.db'}"},
                             data_dir=tmp_path / "data")
    settings = yaml.safe_load((repo / "feature_store.yaml").read_text())
    settings["platform"]["data_storage"] = "s3://bucket/data"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    _one_line_error(featurectl("--repo", str(repo), "datagen", "history", "--days", "1"),
                    "featurectl datagen history works on local files", "s3://bucket/data")
    _one_line_error(featurectl("--repo", str(repo), "delete", "--entity", "asset_id=asset_000001", "--yes"),
                    "featurectl delete works on local files")
    assert not (tmp_path / "data").exists()
    settings["platform"]["data_storage"] = "shared/data"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    _one_line_error(featurectl("--repo", str(repo), "plan"), "platform.data_storage 'shared/data' is not a URI")


def test_a_registry_database_that_is_down_is_one_line(tmp_path):
    """PostgreSQL stopped or restarting (here: nothing listens on its port): every command that reads or writes the
    registry says which database it could not reach and how to start it, not SQLAlchemy's traceback."""
    port = free_port()
    repo = copy_example_repo(tmp_path, "errs_registry_down", {"path": f"postgresql+psycopg://u@127.0.0.1:{port}/r"})
    for args in (("plan", "--no-sql"), ("apply",), ("versions",), ("keys", "list"), ("keys", "usage"),
                 ("keys", "create", "ranker", "--service", "asset_ranking")):
        done = featurectl("--repo", str(repo), *args)
        _one_line_error(done, "the registry database is unavailable", f"port {port}",
                        "featurectl services up --postgres")
        assert "requests" not in done.stdout  # `keys usage` prints no table header before its error


def test_a_server_started_while_the_registry_database_is_down_says_so_in_one_line(tmp_path):
    """`serve` reads the registry when a worker starts: with the database down it logs the same line as the other
    commands (which database, how to start it) and exits, not SQLAlchemy's text with its background link."""
    port = free_port()
    repo = copy_example_repo(tmp_path, "errs_serve_down", {"path": f"postgresql+psycopg://u@127.0.0.1:{port}/r"})
    done = featurectl("--repo", str(repo), "serve", "--port", str(free_port()), timeout=60)
    assert done.returncode != 0
    failed = [line for line in done.stderr.splitlines() if "feature server cannot start" in line]
    assert len(failed) == 1, done.stderr
    assert "the registry database is unavailable" in failed[0] and f"port {port}" in failed[0]
    assert "featurectl services up --postgres" in failed[0]
    assert "sqlalche.me" not in done.stderr and "Traceback" not in done.stderr
