"""`featurectl init NAME`: a new feature repo from the template, accepted at once by `featurectl plan | apply` and,
once applied, by Feast's own CLI and SDK."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import click

from common.config import load_config
from common.errors import FeaturectlError
from dsl.names import check_name

TEMPLATE = Path(__file__).parent / "project_template"
TEMPLATE_FILES = ("feature_store.yaml", "features.py", "_feast_objects.py", ".feastignore")
_PROJECT_LINE = re.compile(r"^project: .*$", re.MULTILINE)


class InitError(FeaturectlError):
    """The new repo's folder cannot be used; the message says why and what to do."""


def _refuse_taken(repo: Path) -> None:
    if repo.is_dir() and any(repo.iterdir()):
        raise InitError(f"{repo} exists and is not empty: pick another NAME or --dir, or empty the folder")
    if repo.exists() and not repo.is_dir():
        raise InitError(f"{repo} exists and is not a folder: pick another NAME or --dir")


def write_repo(repo: Path, project: str) -> None:
    """The template's files in `repo` (made if missing), the settings naming `project`."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in TEMPLATE_FILES:
        shutil.copyfile(TEMPLATE / name, repo / name)
    settings = repo / "feature_store.yaml"
    settings.write_text(_PROJECT_LINE.sub(f"project: {project}", settings.read_text(), count=1))


@click.command()
@click.argument("name")
@click.option("--dir", "parent", type=click.Path(path_type=Path, file_okay=False), default=Path("."),
              show_default=True, help="the folder to create the repo NAME in")
def init(name: str, parent: Path) -> None:
    """Create the feature repo NAME (project NAME): settings, example definitions, Feast's view of them."""
    check_name("featurectl init", "project name", name)
    repo = parent / name
    _refuse_taken(repo)
    write_repo(repo, name)
    cfg = load_config(repo)  # the written settings read back; makes the SQLite registry's folder
    click.echo(f"created feature repo {cfg.repo_path} (project `{name}`): {', '.join(TEMPLATE_FILES)}")
    click.echo(f"next: featurectl --repo {repo} plan, then apply; after that Feast's own CLI (`feast plan`, "
               "`feast feature-views list`, ...) works in the folder, on the registry "
               f"{cfg.registry_url}")


COMMANDS = [init]
