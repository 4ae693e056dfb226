"""The Java SQL functions that compiled Flink SQL may call, and the DDL that registers them.

They live in `featurectl-udf.jar` (built from `udf/` by scripts/build_udf.sh), which common/flink.py puts on
the job's classpath. Temporary system functions need no catalog or database (none of our names is a built-in
one), so the same statements serve streaming and batch mode, locally and on a cluster.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from dsl.sql import quote_ident, quote_string

UDF_JAR_NAME = "featurectl-udf.jar"

_PACKAGE = "dev.featurectl.udf"

FUNCTIONS: Mapping[str, str] = MappingProxyType({
    "HLL_SKETCH": f"{_PACKAGE}.HllSketch",  # HLL_SKETCH(value STRING) -> BYTES, aggregate (one tile)
    "HLL_MERGE": f"{_PACKAGE}.HllMerge",  # HLL_MERGE(sketch BYTES) -> BYTES, aggregate (tiles -> window)
    "HLL_ESTIMATE": f"{_PACKAGE}.HllEstimate",  # HLL_ESTIMATE(sketch BYTES) -> BIGINT, scalar
    "LAST_BY": f"{_PACKAGE}.LastBy",  # LAST_BY(value T, ts TIMESTAMP[_LTZ]) -> T, aggregate
    # PARSE_EVENT(payload BYTES, spec STRING literal) -> ROW(columns..., __error), table function: strict JSON
    "PARSE_EVENT": f"{_PACKAGE}.ParseEvent",
    "PAYLOAD_TEXT": f"{_PACKAGE}.PayloadText",  # PAYLOAD_TEXT(payload BYTES, max_bytes INT) -> STRING, scalar
    "PAYLOAD_ENCODING": f"{_PACKAGE}.PayloadEncoding",  # -> 'utf-8' | 'base64', how PAYLOAD_TEXT wrote it
})


def function_ddl() -> list[str]:
    """One CREATE statement per function, safe to run again on the same TableEnvironment."""
    return [f"CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS {quote_ident(name)} AS {quote_string(java_class)} "
            "LANGUAGE JAVA" for name, java_class in FUNCTIONS.items()]
