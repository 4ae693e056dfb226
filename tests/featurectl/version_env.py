"""Helpers of the version tests: a private copy of the example repo, the CLI run in-process (a subprocess costs
seconds of imports), edits of its definitions, and the versions the repo compiles to."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from click.testing import CliRunner, Result

from batch.backfill_log import BackfillLog, BackfillRecord
from cli_helpers import copy_example_repo
from common.config import load_config
from dsl.compile_flink import SourceSettings
from dsl.compile_repo import compile_repo
from dsl.view_version import view_version
from featurectl.cli import _register_commands, cli

_register_commands()


def make_repo(folder: Path, project: str) -> Path:
    """The example repo as `folder/project`, its registry `folder/registry.db`, its data `folder/data`."""
    return copy_example_repo(folder, project, {"path": f"sqlite:///{folder / 'registry.db'}"},
                             data_dir=folder / "data")


def run(repo: Path, *args: str, ok: bool = True) -> Result:
    """`featurectl --repo REPO ARGS` in this process; with `ok`, asserts that it succeeded."""
    result = CliRunner().invoke(cli, ["--repo", str(repo), *args])
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def edit(repo: Path, old: str, new: str) -> None:
    """Replace `old` (which must be there) by `new` in the repo's definitions."""
    features = repo / "features.py"
    text = features.read_text()
    assert old in text, old
    features.write_text(text.replace(old, new))


def versions(repo: Path) -> dict[str, str]:
    """View -> the version the repo's definitions compile to now."""
    cfg = load_config(repo)
    compiled = compile_repo(cfg.repo_path, SourceSettings("", cfg.data_dir))
    return {view.name: view_version(view, sql) for view, sql in zip(compiled.repo.views, compiled.views)}


def record_backfill(repo: Path, view: str, start: dt.datetime, end: dt.datetime, version: str | None) -> None:
    """A backfill record as `featurectl backfill` writes it when it has computed [start, end) of `view`."""
    cfg = load_config(repo)
    backfill_log = BackfillLog(cfg.registry_url)
    try:
        backfill_log.record(BackfillRecord(cfg.project, view, start, end, 1, 1, dt.datetime.now(dt.timezone.utc),
                                           version))
    finally:
        backfill_log.close()
