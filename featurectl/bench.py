"""`featurectl bench NAME`: each benchmark is a module `bench/NAME.py` of the source checkout exposing a click
command `command`."""

from __future__ import annotations

import pkgutil

import click

from featurectl.checkout import checkout_module


class BenchGroup(click.Group):
    """Finds benchmarks by module name so that adding `bench/NAME.py` is all a new benchmark needs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        bench = checkout_module("bench")
        return sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.list_commands(ctx):
            return None
        return checkout_module(f"bench.{name}").command


@click.group(cls=BenchGroup)
def bench() -> None:
    """Benchmarks: ours and the peer's path side by side; the last line printed is one JSON object."""


COMMANDS = [bench]
