"""`featurectl init NAME` makes a repo that `plan` and `apply` accept at once, with the example repo's settings;
it refuses a bad name or a folder in use in one line, writing nothing; `featurectl --version` reads the installed
distribution's metadata."""

from __future__ import annotations

import importlib.metadata
import os
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from cli_helpers import ROOT, featurectl

TEMPLATE_FILES = {"feature_store.yaml", "features.py", "_feast_objects.py", ".feastignore"}


def _init(*args: str, home: Path):
    return featurectl("init", *args, env={**os.environ, "HOME": str(home)}, timeout=60)


def test_version_comes_from_the_package_metadata():
    done = featurectl("--version", timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"featurectl, version {importlib.metadata.version('featurectl')}"


@pytest.mark.parametrize("name", ["9lives", "my-features", "a" * 65, "with space"])
def test_a_name_outside_the_dsl_rule_is_refused(tmp_path, name):
    done = _init(name, "--dir", str(tmp_path), home=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"Error: featurectl init: project name `{name}` is not allowed; use ASCII letters")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_in_use_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("")
    taken = _init("taken", "--dir", str(tmp_path), home=tmp_path)
    assert taken.returncode == 1 and "Traceback" not in taken.stderr
    assert f"{tmp_path / 'taken'} exists and is not empty: pick another NAME or --dir" in taken.stderr
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]
    afile = _init("afile", "--dir", str(tmp_path), home=tmp_path)
    assert afile.returncode == 1 and f"{tmp_path / 'afile'} exists and is not a folder" in afile.stderr


def _settings(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.integration
def test_init_makes_a_repo_that_plan_and_apply_accept(tmp_path, monkeypatch, local_services):
    from featurectl.cli import Context
    from featurectl.delete_commands import teardown
    from featurectl.repo_commands import apply, plan

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    project = f"init_{uuid.uuid4().hex[:8]}"
    (tmp_path / project).mkdir()  # an empty folder is fine
    done = _init(project, "--dir", str(tmp_path), home=home)
    assert done.returncode == 0, done.stderr
    repo = tmp_path / project
    assert {p.name for p in repo.iterdir()} == TEMPLATE_FILES
    settings, example = _settings(repo / "feature_store.yaml"), _settings(ROOT / "feature_repo" / "feature_store.yaml")
    assert settings == {**example, "project": project}
    registry = home / ".featurectl" / "registry.db"
    assert f"project `{project}`" in done.stdout and f"sqlite:///{registry}" in done.stdout
    assert registry.parent.is_dir(), "the registry's folder exists for Feast's CLI and SDK"

    runner, context = CliRunner(), Context(repo, None)
    planned = runner.invoke(plan, [], obj=context)
    assert planned.exit_code == 0, planned.output
    for line in ("+ would create entity customer", "+ would create feature view customer_orders, version ",
                 "+ would create feature view customer_profile, version ",
                 "+ would create feature service checkout_model", "-- feature view customer_orders: tile query"):
        assert line in planned.output
    assert not registry.exists(), "plan wrote the registry"
    applied = runner.invoke(apply, [], obj=context)
    try:
        assert applied.exit_code == 0, applied.output
        assert f"applied 1 entities, 2 feature views, 1 feature services to sqlite:///{registry}" in applied.output
        again = runner.invoke(apply, [], obj=context)
        assert again.exit_code == 0 and again.output.startswith("no changes\n"), again.output
    finally:
        runner.invoke(teardown, ["--yes"], obj=context)
