"""Value types of the DSL and their spelling in Feast, Flink SQL and Arrow.

`Vector(dim)` is the one parameterized type: a fixed-length float32 embedding, stored online as Feast's
`float_list_val` and indexed for nearest-neighbour search (`serving.vector_index`). It answers the same questions
as a `ValueType` (`value`, `flink_sql`, `feast_type()`, `arrow_type()`...) so the compilers need no special case.

Timestamps travel as epoch milliseconds (BIGINT) in Kafka JSON and in Parquet history files alike, so one
source schema describes both; the Flink DDL derives the event-time attribute from that column.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from dsl.errors import TypeMismatchError


class ValueType(enum.Enum):
    STRING = "string"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"
    TIMESTAMP = "timestamp"

    @property
    def is_numeric(self) -> bool:
        return self in (ValueType.INT32, ValueType.INT64, ValueType.FLOAT32, ValueType.FLOAT64)

    @property
    def is_integer(self) -> bool:
        return self in (ValueType.INT32, ValueType.INT64)

    @property
    def flink_sql(self) -> str:
        return _FLINK[self]

    @property
    def python_types(self) -> tuple[type, ...]:
        return _PYTHON[self]

    def feast_type(self):
        from feast import types as ft

        return {
            ValueType.STRING: ft.String, ValueType.INT32: ft.Int32, ValueType.INT64: ft.Int64,
            ValueType.FLOAT32: ft.Float32, ValueType.FLOAT64: ft.Float64, ValueType.BOOL: ft.Bool,
            ValueType.TIMESTAMP: ft.UnixTimestamp,
        }[self]

    def feast_value_type(self):
        from feast.value_type import ValueType as FeastValueType

        return {
            ValueType.STRING: FeastValueType.STRING, ValueType.INT32: FeastValueType.INT32,
            ValueType.INT64: FeastValueType.INT64, ValueType.FLOAT32: FeastValueType.FLOAT,
            ValueType.FLOAT64: FeastValueType.DOUBLE, ValueType.BOOL: FeastValueType.BOOL,
            ValueType.TIMESTAMP: FeastValueType.UNIX_TIMESTAMP,
        }[self]

    def arrow_type(self):
        import pyarrow as pa

        return {
            ValueType.STRING: pa.string(), ValueType.INT32: pa.int32(), ValueType.INT64: pa.int64(),
            ValueType.FLOAT32: pa.float32(), ValueType.FLOAT64: pa.float64(), ValueType.BOOL: pa.bool_(),
            ValueType.TIMESTAMP: pa.int64(),
        }[self]


FLOAT_TYPES = (ValueType.FLOAT32, ValueType.FLOAT64)

_FLINK = {
    ValueType.STRING: "STRING", ValueType.INT32: "INT", ValueType.INT64: "BIGINT", ValueType.FLOAT32: "FLOAT",
    ValueType.FLOAT64: "DOUBLE", ValueType.BOOL: "BOOLEAN", ValueType.TIMESTAMP: "BIGINT",
}
_PYTHON: dict[ValueType, tuple[type, ...]] = {
    ValueType.STRING: (str,), ValueType.INT32: (int,), ValueType.INT64: (int,), ValueType.FLOAT32: (float, int),
    ValueType.FLOAT64: (float, int), ValueType.BOOL: (bool,), ValueType.TIMESTAMP: (int,),
}

String = ValueType.STRING
Int32 = ValueType.INT32
Int64 = ValueType.INT64
Float32 = ValueType.FLOAT32
Float64 = ValueType.FLOAT64
Bool = ValueType.BOOL
Timestamp = ValueType.TIMESTAMP


MAX_VECTOR_DIM = 32_768  # Milvus's own ceiling for a float vector
FLOAT32_MAX = 3.4028234663852886e38  # the greatest finite float32
# the whole numbers each integer type holds (a timestamp: epoch milliseconds in a signed 64-bit integer)
INT_RANGES = {ValueType.INT32: (-(1 << 31), (1 << 31) - 1), ValueType.INT64: (-(1 << 63), (1 << 63) - 1),
              ValueType.TIMESTAMP: (-(1 << 63), (1 << 63) - 1)}
VECTOR_METRICS = ("L2", "COSINE", "IP")


@dataclass(frozen=True)
class Vector:
    """A fixed-dimension float32 vector feature, e.g. a shape embedding; `metric` is the distance its index uses:
    `L2` (Euclidean; searches report its square), `COSINE` (searches report the cosine similarity: larger is
    nearer) or `IP` (inner product, larger is nearer), as Milvus reports them, on either engine."""

    dim: int
    metric: str = "L2"

    def __post_init__(self) -> None:
        if type(self.dim) is not int or not 1 <= self.dim <= MAX_VECTOR_DIM:
            raise TypeMismatchError("Vector", f"dim {self.dim!r} is not an int from 1 to {MAX_VECTOR_DIM}",
                                    "give the embedding's length, e.g. Vector(128)")
        if self.metric not in VECTOR_METRICS:
            raise TypeMismatchError("Vector", f"metric {self.metric!r} is unknown",
                                    f"use one of: {', '.join(VECTOR_METRICS)}")

    @property
    def value(self) -> str:
        return f"vector({self.dim})"

    is_numeric = False
    is_integer = False

    @property
    def flink_sql(self) -> str:
        return "ARRAY<FLOAT>"

    @property
    def python_types(self) -> tuple[type, ...]:
        return (list, tuple)

    def feast_type(self):
        from feast import types as ft

        return ft.Array(ft.Float32)

    def feast_value_type(self):
        from feast.value_type import ValueType as FeastValueType

        return FeastValueType.FLOAT_LIST

    def arrow_type(self):
        import pyarrow as pa

        return pa.list_(pa.float32(), self.dim)


FeatureType = Union[ValueType, Vector]


def is_feature_type(kind: object) -> bool:
    """Whether `kind` is a type of the DSL: one of the `ValueType`s or a `Vector`."""
    return isinstance(kind, (ValueType, Vector))
