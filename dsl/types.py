"""Value types of the DSL and their spelling in Feast, Flink SQL and Arrow.

Timestamps travel as epoch milliseconds (BIGINT) in Kafka JSON and in Parquet history files alike, so one
source schema describes both; the Flink DDL derives the event-time attribute from that column.
"""

from __future__ import annotations

import enum


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
