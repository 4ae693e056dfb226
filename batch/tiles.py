"""Run a view's compiled tile query in Flink batch mode over its Parquet history."""

from __future__ import annotations

import logging
from common.flink import create_table_env, pin_planner
from dsl.compile_flink import CompiledView

log = logging.getLogger(__name__)


def register_sources(env, compiled: CompiledView, mode: str = "batch") -> None:
    """Create the functions and the source table of `compiled` in `env` (idempotent per environment)."""
    *ddl, _query = compiled.statements(mode)
    existing = set(env.list_temporary_tables())
    for statement in ddl:
        if statement.startswith("CREATE TEMPORARY TABLE") and compiled.source in existing:
            continue
        env.execute_sql(statement)


def query_tiles(compiled: CompiledView, select: str = "SELECT * FROM tiles", env=None):
    """Run `select` over the view's tiles (a subquery named `tiles`) and return a pandas DataFrame.

    Rows cross from the JVM to Python one by one: summarise in SQL before collecting large ranges.
    """
    env = env or create_table_env(streaming=False)
    register_sources(env, compiled)
    log.info("running the tile query of %s in batch mode", compiled.view)
    pin_planner(env)
    result = env.execute_sql(f"WITH tiles AS ({compiled.tile_query})\n{select}")
    columns = result.get_resolved_schema().get_column_names()
    with result.collect() as rows:
        records = [tuple(row) for row in rows]
    import pandas as pd

    return pd.DataFrame.from_records(records, columns=columns)
