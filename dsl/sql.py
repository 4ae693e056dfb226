"""The one home of SQL quoting: every name and every string that Flink SQL text takes from outside goes through
`quote_ident` or `quote_string`, and every table through `create_table`, so that no name, topic, path or option
can end its token early and become SQL. `tests/dsl/test_hostile_definitions.py` checks them with Flink's parser.

Definitions are refused eagerly for what no quoting can carry (see `identifier_problem`); these functions raise a
plain ValueError for it, since reaching them with such a name is a bug of the caller.
"""

from __future__ import annotations

from typing import Mapping, Sequence

MAX_IDENTIFIER = 256  # Flink's parser refuses longer identifiers


def identifier_problem(name: object) -> str | None:
    """Why `name` cannot be a Flink identifier even in backticks, or None: Flink's lexer stops at a line break and
    refuses an empty or over-long name; other control and format characters are refused too (they hide in logs)."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a str"
    if not name:
        return "it is empty"
    if len(name) > MAX_IDENTIFIER:
        return f"it is {len(name)} characters long, more than Flink's {MAX_IDENTIFIER}"
    if not name.isprintable():
        return "it holds a line break, a control or a format character"
    return None


def quote_ident(name: str) -> str:
    """`name` as one Flink identifier: in backticks, its backticks doubled."""
    problem = identifier_problem(name)
    if problem:
        raise ValueError(f"{name!r} cannot be a Flink SQL identifier: {problem}")
    return "`" + name.replace("`", "``") + "`"


def quote_string(text: str) -> str:
    """`text` as one Flink string literal: in single quotes, its quotes doubled (line breaks and NULs need nothing
    more: Flink reads them back as they are)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is a {type(text).__name__}: only a str can be a SQL string literal")
    return "'" + text.replace("'", "''") + "'"


def create_table(name: str, columns: Sequence[str], options: Mapping[str, str]) -> str:
    """`CREATE TEMPORARY TABLE name (columns) WITH (options)`, the one shape of every table we declare; `columns`
    are SQL already built with `quote_ident`, option keys and values are quoted here."""
    body = ",\n  ".join(columns)
    with_ = ",\n".join(f"  {quote_string(k)} = {quote_string(v)}" for k, v in options.items())
    return f"CREATE TEMPORARY TABLE {quote_ident(name)} (\n  {body}\n) WITH (\n{with_}\n)"
