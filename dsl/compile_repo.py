"""A whole repo compiled at once: its definitions, their Feast objects and each view's Flink SQL. What `featurectl
plan` prints and `apply` registers; errors are the DSL's own (`DefinitionError`)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from dsl.compile_feast import FeastObjects, compile_feast
from dsl.compile_flink import CompiledView, SourceSettings, compile_view
from dsl.compile_stream_source import source_keys
from dsl.repo import Repository, load_repo


class CompiledRepo(NamedTuple):
    repo: Repository
    feast: FeastObjects
    views: list[CompiledView]


def compile_repo(repo_path: Path, settings: SourceSettings) -> CompiledRepo:
    """Load the definitions in `repo_path` and compile every view; `settings` says where sources live."""
    repo = load_repo(repo_path)
    views = [compile_view(view, settings, source_keys(view.source, repo.views)) for view in repo.views]
    return CompiledRepo(repo, compile_feast(repo, settings, views), views)


def feast_namespace(repo_path: Path, settings: SourceSettings) -> dict[str, object]:
    """The Feast objects `featurectl apply` registers for the repo, each under a name of its own: bound at a repo
    module's top level, they are what Feast's repo scanner (`feast plan`, `feast apply`) finds."""
    objects = compile_repo(repo_path, settings).feast
    return {f"{type(obj).__name__}_{obj.name}": obj for obj in objects.all()}
