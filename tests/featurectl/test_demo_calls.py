"""`featurectl demo` drives the other commands through `click_ctx.invoke(command, name=value, ...)`, which no
type checker sees: a renamed option (backfill's `start_text` became `start`) broke the README's first command
while every test passed. This reads each such call in the demo's source and checks its names against the
command's own parameters."""

from __future__ import annotations

import ast
import importlib
import inspect

import click

from featurectl import demo


def _invocations() -> list[tuple[str, str, set[str]]]:
    """(module, command, keyword names) for every `click_ctx.invoke(module.command, ...)` in the demo."""
    calls = []
    for node in ast.walk(ast.parse(inspect.getsource(demo))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "invoke"
                and node.args and isinstance(node.args[0], ast.Attribute)
                and isinstance(node.args[0].value, ast.Name)):
            calls.append((node.args[0].value.id, node.args[0].attr, {kw.arg for kw in node.keywords}))
    return calls


def test_every_command_the_demo_invokes_takes_the_names_it_is_given():
    calls = _invocations()
    assert {(module, command) for module, command, _ in calls} >= {
        ("batch_commands", "backfill"), ("materialize_commands", "materialize"), ("asset_commands", "process")}
    for module, command, names in calls:
        target = getattr(importlib.import_module(f"featurectl.{module}"), command)
        assert isinstance(target, click.Command), f"{module}.{command} is not a click command"
        accepted = {param.name for param in target.params}
        assert names <= accepted, f"demo passes {sorted(names - accepted)} to {module}.{command}: not its options"
