"""`featurectl`: one command group per noun; each group lives in its own module of this package."""

from __future__ import annotations

import importlib
import logging
import shlex
import sys
import warnings
from pathlib import Path

import click

from common.config import DEFAULT_REPO, load_config
from common.errors import FeaturectlError, registry_unavailable


class Context:
    """What every command needs: where the feature repo is and which registry to use."""

    def __init__(self, repo: Path, registry: str | None):
        self.repo = repo
        self.registry = registry

    def config(self):
        return load_config(self.repo, registry_override=self.registry)

    def command_prefix(self) -> str:
        """`featurectl` with this run's global options: how the commands a run prints for its user start."""
        words = ["featurectl"]
        if self.repo != DEFAULT_REPO:
            words += ["--repo", shlex.quote(str(self.repo))]
        if self.registry:
            words += ["--registry", shlex.quote(self.registry)]
        return " ".join(words)


@click.group()
@click.option("--repo", type=click.Path(path_type=Path), default=Path("feature_repo"), show_default=True,
              help="folder holding feature_store.yaml and the feature definitions")
@click.option("--registry", default=None,
              help="registry URL (sqlite:///..., postgresql://...) or `postgres` for the local one; "
                   "overrides feature_store.yaml")
@click.option("-v", "--verbose", is_flag=True, help="debug logging")
@click.version_option(package_name="featurectl", prog_name="featurectl")  # the installed distribution's metadata
@click.pass_context
def cli(ctx: click.Context, repo: Path, registry: str | None, verbose: bool) -> None:
    """Feature platform: DSL -> Flink SQL -> Feast registry -> Redis -> online models."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # PyFlink, Beam and Feast announce their own deprecations at import (and reset the warning filters while
        # doing so); users cannot act on them, so they are shown with -v only.
        warnings.showwarning = _show_warning_unless_deprecation
        logging.getLogger("apache_beam").setLevel(logging.WARNING)
        logging.getLogger("feast.openlineage").setLevel(logging.WARNING)  # a line per table check and purge
    ctx.obj = Context(repo, registry)


_show_warning = warnings.showwarning


def _show_warning_unless_deprecation(message, category, filename, lineno, file=None, line=None) -> None:
    if not category.__name__.endswith("DeprecationWarning"):
        _show_warning(message, category, filename, lineno, file, line)


# Each module defines `COMMANDS`, the click commands or groups it adds to `featurectl`.
COMMAND_MODULES = ("init_commands", "services", "repo_commands", "datagen", "demo", "bench", "materialize_commands",
                   "serve_commands", "keys_commands", "generate_commands", "gateway_commands", "batch_commands",
                   "stream_commands", "delete_commands", "ui_commands", "versions_commands", "status_commands",
                   "models_commands", "report_commands", "asset_commands")


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        for command in importlib.import_module(f"featurectl.{name}").COMMANDS:
            cli.add_command(command)


def main() -> None:
    _register_commands()
    try:
        cli(standalone_mode=True)
    except FeaturectlError as exc:  # every error a user can act on: one line, no traceback
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        message = registry_unavailable(exc)
        if message is None:
            raise
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)
