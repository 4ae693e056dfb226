"""Feast's Redis layout for whole Arrow columns, down to the RESP bytes of the HSET commands.

`redis_store.layout` encodes values one Python object at a time; materialization writes millions of them, so
here every step is a numpy or Arrow kernel over a column: protobuf varints (`layout.varint_matrix`, with the
layout's tag table), RESP framing by `binary_join_element_wise`, and one command per row whose bytes lie back to
back in the result's data buffer, ready for the socket. Tests check every byte against `redis_store.layout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dsl.types import FeatureType, ValueType, Vector
from redis_store import layout

_EMPTY = pa.scalar(b"", pa.binary())
_CRLF = pa.scalar(b"\r\n", pa.binary())
_DOLLAR = pa.scalar(b"$", pa.binary())
_FIXED = {ValueType.FLOAT64: "<f8", ValueType.FLOAT32: "<f4"}
_VARINT = (ValueType.INT64, ValueType.INT32, ValueType.BOOL, ValueType.TIMESTAMP)


def binary_array(lengths: np.ndarray, data: np.ndarray) -> pa.BinaryArray:
    """Values of `lengths[i]` bytes lying back to back in the uint8 array `data`, without copying it."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.BinaryArray.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def binary_rows(matrix: np.ndarray, lengths: np.ndarray) -> pa.BinaryArray:
    """Row i of a uint8 matrix, cut to lengths[i] bytes, as one binary value per row."""
    if len(lengths) and lengths.min() == matrix.shape[1]:  # full rows: the matrix is the data buffer
        return binary_array(lengths, np.ascontiguousarray(matrix))
    return binary_array(lengths, matrix[np.arange(matrix.shape[1]) < lengths[:, None]])


def _null_mask(column: pa.Array) -> np.ndarray | None:
    return column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None


@dataclass(frozen=True)
class BoundedValues:
    """Serialized values of bounded width: row i is `matrix[i, :lengths[i]]`. Kept as a matrix so that other
    encodings (the DUMP payloads of `redis_store.dump`) can place the bytes without an Arrow round trip."""

    matrix: np.ndarray
    lengths: np.ndarray

    def binary(self) -> pa.BinaryArray:
        return binary_rows(self.matrix, self.lengths)


def vector_encoding(column: pa.Array, kind: Vector) -> BoundedValues:
    """Vectors (a fixed_size_list or list column of numbers) as float_list_vals, every row `kind.dim` long;
    a NULL row is NULL, a row of another length a ValueError naming it."""
    nulls = _null_mask(column)
    if pa.types.is_fixed_size_list(column.type) and column.type.list_size == kind.dim:
        flat = column.values.slice(column.offset * kind.dim, len(column) * kind.dim)
    else:
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise ValueError(f"a {kind.value} column must be a list of numbers, got {column.type}")
        sizes = pc.list_value_length(column).fill_null(kind.dim).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(sizes != kind.dim)
        if len(wrong):
            raise ValueError(f"row {wrong[0]} holds {sizes[wrong[0]]} numbers where a {kind.value} needs {kind.dim}")
        flat = pc.list_flatten(column.fill_null(pa.scalar([0.0] * kind.dim, column.type)))
    values = flat.fill_null(np.nan).to_numpy(zero_copy_only=False).astype("<f4").reshape(len(column), kind.dim)
    head = np.frombuffer(layout.vector_head(kind.dim), dtype=np.uint8)
    matrix = np.empty((len(column), len(head) + 4 * kind.dim), dtype=np.uint8)
    matrix[:, :len(head)] = head
    matrix[:, len(head):] = values.view(np.uint8)
    lengths = np.full(len(column), matrix.shape[1], dtype=np.int32)
    if nulls is not None:
        lengths = np.where(nulls, 0, lengths).astype(np.int32)
    return BoundedValues(matrix, lengths)


def value_encoding(column: pa.Array, kind: FeatureType) -> BoundedValues | pa.BinaryArray:
    """Serialized feast.types.Value per row; NULL (and NaN for floats) is the empty string, as Feast writes.
    Numbers and vectors come as a `BoundedValues` matrix, strings (of unbounded width) as an Arrow column."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(kind, Vector):
        return vector_encoding(column, kind)
    nulls = _null_mask(column)
    if kind in _FIXED:
        tag, dtype = layout.TAGS[kind], _FIXED[kind]
        values = column.fill_null(0).to_numpy(zero_copy_only=False).astype(dtype)
        width = values.dtype.itemsize + 1
        matrix = np.empty((len(values), width), dtype=np.uint8)
        matrix[:, 0] = tag
        matrix[:, 1:] = values.view(np.uint8).reshape(len(values), width - 1)
        lengths = np.full(len(values), width, dtype=np.int32)
        nan = np.isnan(values)
        nulls = nan if nulls is None else nulls | nan
    elif kind in _VARINT:
        if pa.types.is_timestamp(column.type):  # Feast's unix_timestamp_val holds epoch seconds
            column = column.cast(pa.timestamp("s", column.type.tz), safe=False).cast(pa.int64())
        numbers = column.fill_null(False if kind is ValueType.BOOL else 0).to_numpy(zero_copy_only=False)
        matrix, lengths = layout.varint_matrix(numbers.astype(np.int64), 1)
        matrix[:, 0] = layout.TAGS[kind]
    else:  # STRING, the one kind of unbounded width: Arrow joins the varint length prefix and the bytes
        raw = column.cast(pa.binary())
        sizes = pc.binary_length(raw).fill_null(0).to_numpy(zero_copy_only=False)
        prefix, prefix_lengths = layout.varint_matrix(sizes, 1)
        prefix[:, 0] = layout.TAGS[ValueType.STRING]
        return pc.binary_join_element_wise(binary_rows(prefix, prefix_lengths), raw, _EMPTY).fill_null(b"")
    if nulls is not None:
        lengths = np.where(nulls, 0, lengths).astype(np.int32)
    return BoundedValues(matrix, lengths)


def value_column(column: pa.Array, kind: FeatureType) -> pa.BinaryArray:
    """`value_encoding` as an Arrow column."""
    encoded = value_encoding(column, kind)
    return encoded.binary() if isinstance(encoded, BoundedValues) else encoded


def timestamp_column(epoch_ms: np.ndarray) -> pa.BinaryArray:
    """Serialized google.protobuf.Timestamp per row (the `_ts` field), zero fields omitted as protobuf does."""
    seconds, millis = np.divmod(epoch_ms.astype(np.int64), 1000)
    sec_matrix, sec_lengths = layout.varint_matrix(seconds, 1)
    sec_matrix[:, 0] = layout.TIMESTAMP_SECONDS
    sec_lengths = np.where(seconds != 0, sec_lengths, 0).astype(np.int32)
    nano_matrix, nano_lengths = layout.varint_matrix(millis * 1_000_000, 1)
    nano_matrix[:, 0] = layout.TIMESTAMP_NANOS
    nano_lengths = np.where(millis != 0, nano_lengths, 0).astype(np.int32)
    return pc.binary_join_element_wise(binary_rows(sec_matrix, sec_lengths), binary_rows(nano_matrix, nano_lengths),
                                       _EMPTY)


def key_column(encoder: layout.KeyEncoder, columns: Sequence[pa.Array]) -> pa.BinaryArray:
    """Redis keys of many entities: one Arrow column per join key, in `encoder.order`."""
    parts: list = [pa.scalar(encoder.head, pa.binary())]
    for column, kind, type_bytes in zip(columns, encoder.types, encoder._value_types):
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if column.null_count:
            raise ValueError("an entity key is NULL: every row needs all its join keys")
        if kind is ValueType.STRING:
            raw = column.cast(pa.binary())
            sizes = pc.binary_length(raw).to_numpy(zero_copy_only=False).astype("<u4")
        else:
            width = "<i4" if kind is ValueType.INT32 else "<i8"
            numbers = column.to_numpy(zero_copy_only=False).astype(width)
            raw = binary_rows(numbers.view(np.uint8).reshape(len(numbers), -1),
                              np.full(len(numbers), numbers.dtype.itemsize, dtype=np.int32))
            sizes = np.full(len(numbers), numbers.dtype.itemsize, dtype="<u4")
        size_bytes = binary_rows(sizes.view(np.uint8).reshape(len(sizes), 4), np.full(len(sizes), 4, dtype=np.int32))
        parts += [pa.scalar(type_bytes, pa.binary()), size_bytes, raw]
    parts += [pa.scalar(encoder.suffix, pa.binary()), _EMPTY]
    return pc.binary_join_element_wise(*parts)


_SMALL_HEADS = pa.array([b"$%d\r\n" % n for n in range(256)], pa.binary())


def bulk(column: pa.BinaryArray) -> pa.BinaryArray:
    """RESP bulk strings: `$<length>\\r\\n<bytes>\\r\\n` per row."""
    sizes = pc.binary_length(column)
    if (pc.max(sizes).as_py() or 0) < len(_SMALL_HEADS):
        heads = _SMALL_HEADS.take(sizes)
    else:
        heads = pc.binary_join_element_wise(_DOLLAR, pc.cast(sizes, pa.string()).cast(pa.binary()), _CRLF, _EMPTY)
    return pc.binary_join_element_wise(heads, column, _CRLF, _EMPTY)


def bulk_constant(value: bytes) -> pa.Scalar:
    return pa.scalar(b"$%d\r\n%s\r\n" % (len(value), value), pa.binary())


def hset_commands(key_bulks: pa.BinaryArray, fields: Sequence[bytes],
                  values: Sequence[pa.BinaryArray]) -> pa.BinaryArray:
    """One RESP `HSET key field value ...` per row (keys given as `bulk(keys)`), back to back in the data buffer."""
    head = pa.scalar(b"*%d\r\n$4\r\nHSET\r\n" % (2 + 2 * len(fields)), pa.binary())
    parts: list = [head, key_bulks]
    for field, column in zip(fields, values):
        parts += [bulk_constant(field), bulk(column)]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def hget_commands(key_bulks: pa.BinaryArray, field: bytes) -> pa.BinaryArray:
    """One RESP `HGET key field` per row (keys given as `bulk(keys)`)."""
    return pc.binary_join_element_wise(pa.scalar(b"*3\r\n$4\r\nHGET\r\n", pa.binary()), key_bulks,
                                       bulk_constant(field), _EMPTY)


def expire_commands(key_bulks: pa.BinaryArray, seconds: int) -> pa.BinaryArray:
    """One RESP `EXPIRE key seconds` per row (keys given as `bulk(keys)`)."""
    return pc.binary_join_element_wise(pa.scalar(b"*3\r\n$6\r\nEXPIRE\r\n", pa.binary()), key_bulks,
                                       bulk_constant(b"%d" % seconds), _EMPTY)


def variadic_head(name: bytes, arguments: int) -> bytes:
    """The start of a command taking `arguments` bulk strings, e.g. `WATCH k1 k2 ...`: send the bulks after it."""
    return b"*%d\r\n$%d\r\n%s\r\n" % (arguments + 1, len(name), name)


def command_bytes(commands: pa.BinaryArray, lo: int, hi: int) -> memoryview:
    """The bytes of commands[lo:hi], back to back, without copying."""
    offsets = np.frombuffer(commands.buffers()[1], dtype=np.int32, count=commands.offset + len(commands) + 1)
    starts = offsets[commands.offset:]
    return memoryview(commands.buffers()[2])[starts[lo]:starts[hi]]
