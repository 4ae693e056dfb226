"""A transformation as self-contained Python source: the form in which it reaches every process that runs it.

A repo's files are imported under synthetic module names (`dsl.repo.load_repo`) that no other process can import,
so a function cannot travel by reference; and dill 0.3.1 (pinned by apache-beam) cannot rebuild a Python 3.11 code
object, so it cannot travel by value either. It travels as text: its own source, after a prelude that rebinds each
global it reads — an import for a module or an installed package's function or class, a literal for a constant,
the source of a helper function defined beside it (under the same rules, recursively). Anything else (an object
built when the file was imported, a variable of an enclosing function) is refused at definition time, since no
other process could rebuild it.
"""

from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import textwrap
import types
from typing import Any, Callable, Iterator

from dsl.errors import DefinitionError

_LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))
_CONTAINERS = (tuple, list, set, frozenset, dict)
REPO_MODULE_PREFIX = "featurectl_repo_"  # `dsl.repo.load_repo` imports each repo file under a name starting so
_LOCAL_MODULES = ("__main__", REPO_MODULE_PREFIX)  # where functions are defined but cannot be imported from
_HINT = ("a transformation may read modules, functions and classes of installed packages, constants (numbers, "
         "strings, tuples of them) and functions defined beside it; build anything else inside the function")


def portable_source(fn: Callable, where: str) -> str:
    """The text that defines `fn` (under its own name) with everything it reads, or a DefinitionError naming
    what cannot travel."""
    check_plain_function(fn, where)
    bindings: dict[str, tuple[object, str]] = {}  # global name -> (value, the line that binds it)
    sources: list[str] = []  # helper functions first, `fn` last
    _collect(fn, where, bindings, sources, set())
    prelude = [line for _, line in bindings.values()]
    return "\n".join(["from __future__ import annotations", *prelude, "", "", "\n\n\n".join(sources)]) + "\n"


def check_plain_function(fn: object, where: str) -> None:
    """A `def` at the top level of its file: no lambda, closure, coroutine, generator or built-in."""
    if not isinstance(fn, types.FunctionType):
        raise DefinitionError(where, f"the transformation must be a function, got {type(fn).__name__}",
                              "write `def name(inputs): ...` and pass it, or decorate it with @on_demand(...)")
    if fn.__name__ == "<lambda>":
        raise DefinitionError(where, "the transformation is a lambda", "write it as a `def` (its source is "
                              "registered, and a lambda's source cannot be cut out of the line reliably)")
    if fn.__code__.co_freevars:
        raise DefinitionError(where, f"transformation `{fn.__name__}` reads variables of an enclosing function "
                              f"({', '.join(fn.__code__.co_freevars)})",
                              "define it at the top level of the repo file and pass those values as constants")
    if inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn):
        raise DefinitionError(where, f"transformation `{fn.__name__}` is a coroutine or a generator",
                              "write a plain function that returns the output columns")


def _collect(fn: types.FunctionType, where: str, bindings: dict, sources: list[str], seen: set[int]) -> None:
    seen.add(id(fn))
    node, lines = _definition(fn, where)
    for name in _global_names(fn, node):
        if name not in fn.__globals__:
            continue  # a builtin, or a name undefined in the original too (it fails there the same way)
        value = fn.__globals__[name]
        line = _binding(name, value)
        if line is None and _is_local_function(value):
            check_plain_function(value, f"{where}, helper `{name}`")
            if id(value) not in seen:
                _collect(value, where, bindings, sources, seen)
            if value.__name__ != name:
                line = f"{name} = {value.__name__}"
            else:
                continue
        if line is None:
            raise DefinitionError(where, f"transformation `{fn.__name__}` reads global `{name}` "
                                         f"({type(value).__name__}), which cannot be rebuilt in another process",
                                  _HINT)
        known = bindings.setdefault(name, (value, line))
        if known[1] != line:
            raise DefinitionError(where, f"global `{name}` means two things to the transformation's functions",
                                  "rename one of them")
    sources.append("\n".join(lines[node.lineno - 1:node.end_lineno]))  # the `def` as written, no decorators


def _global_names(fn: types.FunctionType, node: ast.FunctionDef) -> Iterator[str]:
    """Globals read by the body (nested comprehensions included) and by the default values of its parameters
    (evaluated when the `def` runs); annotations are never evaluated (the text starts with the `annotations`
    future import)."""
    def walk(code: types.CodeType) -> Iterator[str]:
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                yield instruction.argval
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from walk(const)

    names = dict.fromkeys(walk(fn.__code__))
    args = node.args
    for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
        names.update(dict.fromkeys(n.id for n in ast.walk(default) if isinstance(n, ast.Name)))
    return iter(n for n in names if n not in vars(builtins) or n in fn.__globals__)


def _binding(name: str, value: Any) -> str | None:
    """The line that binds `name` to `value` in a fresh process, or None when no line can."""
    if isinstance(value, types.ModuleType):
        if value.__name__.startswith(_LOCAL_MODULES) or not _importable(value.__name__):
            return None
        return f"import {value.__name__}" if name == value.__name__ else f"import {value.__name__} as {name}"
    if _is_literal(value):
        return f"{name} = {value!r}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if (isinstance(module, str) and isinstance(qualname, str) and "." not in qualname
            and not module.startswith(_LOCAL_MODULES) and _importable(module)
            and getattr(importlib.import_module(module), qualname, None) is value):
        return f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")
    return None


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # any import failure means: not by reference
        return False
    return True


def _is_literal(value: Any) -> bool:
    """A value that `repr` writes and `ast.literal_eval` reads back equal (nan is not equal to itself: refused)."""
    if not isinstance(value, _LITERAL_TYPES + _CONTAINERS) or type(value) not in _LITERAL_TYPES + _CONTAINERS:
        return False
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, RecursionError, TypeError):
        return False


def _is_local_function(value: Any) -> bool:
    return isinstance(value, types.FunctionType) and str(value.__module__).startswith(_LOCAL_MODULES)


def _definition(fn: types.FunctionType, where: str) -> tuple[ast.FunctionDef, list[str]]:
    """The `def` node of `fn` and the dedented lines of its source."""
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise DefinitionError(where, f"the source of `{fn.__name__}` cannot be read ({exc})",
                              "define the transformation in a .py file of the repo") from None
    node = ast.parse(text).body[0]
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise DefinitionError(where, f"the source of `{fn.__name__}` is not its `def`",
                              "define the transformation with a plain `def` statement")
    return node, text.splitlines()

