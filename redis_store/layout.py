"""Feast's Redis layout, byte for byte: keys, fields, the value tag table, varints and timestamps, one value at a
time (`redis_store.columns` does whole columns with the same tags and varint).

Format (Feast 0.67, `entity_key_serialization_version: 3`, RedisOnlineStore):
- key: the serialized entity key followed by the project name (UTF-8). The entity key is
  u32 LE number of join keys; per key, sorted by name: u32 LE STRING type (2), u32 LE length, UTF-8 name; then
  per value in the same order: u32 LE value type, u32 LE length, the value (UTF-8 string, or i32/i64 LE).
- one hash per key; field per feature: murmur3_32 (seed 0, unsigned) of `"{view}:{feature}"` as 4 LE bytes;
  field `_ts:{view}`: a serialized `google.protobuf.Timestamp` of the row's event time.
- values: serialized `feast.types.Value` protobufs (an empty bytes string is NULL). A `Vector(dim)` is
  `float_list_val` (field 16): tag 0x82 0x01, varint length, then the FloatList message: tag 0x0A, varint
  length 4 * dim, the float32 values little-endian (packed, as protobuf writes a repeated float).

The encoders here write those bytes directly, without building protobuf objects, because materialization and
streaming write millions of values per second; tests check them against Feast's own functions.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Optional, Sequence

import mmh3
import numpy as np

from dsl.types import FeatureType, ValueType, Vector

# Feast's ValueType enum numbers (feast/protos/feast/types/Value.proto) used inside entity keys.
_KEY_TYPE = {ValueType.STRING: 2, ValueType.INT32: 3, ValueType.INT64: 4}
# Field tags of feast.types.Value: (field number << 3) | wire type.
TAGS = {ValueType.STRING: 0x12, ValueType.INT32: 0x18, ValueType.INT64: 0x20, ValueType.FLOAT64: 0x29,
        ValueType.FLOAT32: 0x35, ValueType.BOOL: 0x38, ValueType.TIMESTAMP: 0x40}
TIMESTAMP_SECONDS, TIMESTAMP_NANOS = 0x08, 0x10  # google.protobuf.Timestamp's field tags
BYTES_TAG = 0x0A  # feast.types.Value.bytes_val: read, never written
FLOAT_LIST_TAG = b"\x82\x01"  # feast.types.Value.float_list_val (field 16, length-delimited)
_KINDS = {tag: kind for kind, tag in TAGS.items()}
FLOAT_CODES = {ValueType.FLOAT64: "d", ValueType.FLOAT32: "f"}  # struct codes of the stored floats (little-endian)
_FLOATS = {kind: "<" + code for kind, code in FLOAT_CODES.items()}
NULL = b""


def field_name(view: str, feature: str) -> bytes:
    """The hash field of one feature: murmur3_32 of `view:feature`, 4 little-endian bytes."""
    return mmh3.hash(f"{view}:{feature}", signed=False).to_bytes(4, "little")


def ts_field(view: str) -> bytes:
    return f"_ts:{view}".encode()


def _key_value_bytes(value: Any, kind: ValueType) -> bytes:
    if kind is ValueType.STRING:
        return str(value).encode()
    return struct.pack("<i" if kind is ValueType.INT32 else "<q", int(value))


class KeyEncoder:
    """Builds Redis keys for one entity (its join keys and types) and one project; the constant parts once."""

    def __init__(self, project: str, join_keys: dict[str, ValueType]):
        self.order = sorted(join_keys)
        self.types = [join_keys[k] for k in self.order]
        head = [struct.pack("<I", len(self.order))]
        for name in self.order:
            encoded = name.encode()
            head.append(struct.pack("<II", 2, len(encoded)) + encoded)
        self.head = b"".join(head)
        self.suffix = project.encode()
        self._value_types = [struct.pack("<I", _KEY_TYPE[k]) for k in self.types]

    def key(self, values: Sequence[Any]) -> bytes:
        """`values` in the order of `self.order` (join keys sorted by name)."""
        return b"".join([self.head, *map(self.part, range(len(self.order)), values), self.suffix])

    def part(self, index: int, value: Any) -> bytes:
        """The bytes of the key's `index`-th value: its type, its length and the value."""
        raw = _key_value_bytes(value, self.types[index])
        return self._value_types[index] + struct.pack("<I", len(raw)) + raw

    def decode(self, key: bytes) -> Optional[list]:
        """The join key values (in `self.order`) of a key of this entity and project; None for any other key."""
        if not key.startswith(self.head) or not key.endswith(self.suffix):
            return None
        at, end, values = len(self.head), len(key) - len(self.suffix), []
        for kind, type_bytes in zip(self.types, self._value_types):
            if key[at:at + 4] != type_bytes or at + 8 > end:
                return None
            size = struct.unpack_from("<I", key, at + 4)[0]
            at += 8
            if at + size > end:
                return None
            raw = key[at:at + size]
            at += size
            values.append(raw.decode(errors="replace") if kind is ValueType.STRING
                          else struct.unpack("<i" if kind is ValueType.INT32 else "<q", raw)[0])
        return values if at == end else None

    def keys(self, columns: Sequence[Sequence[Any]]) -> list[bytes]:
        """Keys for many entities: one sequence of values per join key, in `self.order`."""
        if len(columns) == 1 and self.types[0] is ValueType.STRING:
            head = self.head + self._value_types[0]
            suffix = self.suffix
            out = []
            for value in columns[0]:
                raw = value.encode()
                out.append(head + len(raw).to_bytes(4, "little") + raw + suffix)
            return out
        return [self.key(values) for values in zip(*columns)]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_matrix(values: np.ndarray, first: int) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of int64 values (two's complement, as protobuf does), placed from column `first` of a
    uint8 matrix, one row per value; (matrix, row lengths). The one vectorized varint: columns, timestamps and
    the streaming sink's values are all built with it."""
    rest = values.astype(np.int64).view(np.uint64).copy()
    matrix = np.zeros((len(values), first + 10), dtype=np.uint8)
    lengths = np.full(len(values), first + 1, dtype=np.int32)
    for i in range(10):
        more = rest > 0x7F
        matrix[:, first + i] = (rest & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
        rest >>= np.uint64(7)
        lengths += more
        if not more.any():
            break
    return matrix, lengths


def matrix_rows(matrix: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """Row i of a uint8 matrix cut to lengths[i] bytes, as Python bytes."""
    width, buf = matrix.shape[1], np.ascontiguousarray(matrix).tobytes()
    return [buf[i * width:i * width + n] for i, n in enumerate(lengths.tolist())]


def vector_head(dim: int) -> bytes:
    """The bytes before the floats of every non-empty `dim`-long float_list_val: they depend on `dim` only."""
    payload = 4 * dim
    inner = 1 + len(_varint(payload)) + payload
    return FLOAT_LIST_TAG + _varint(inner) + bytes((BYTES_TAG,)) + _varint(payload)


def vector_array(value: Any, kind: Vector) -> np.ndarray:
    """`value` (a list, tuple or array of numbers) as `kind.dim` little-endian float32s; ValueError otherwise."""
    array = np.asarray(value, dtype="<f4")
    if array.shape != (kind.dim,):
        raise ValueError(f"a {kind.value} needs {kind.dim} numbers, got shape {array.shape}")
    return array


def encode_vector(value: Any, kind: Vector) -> bytes:
    return vector_head(kind.dim) + vector_array(value, kind).tobytes()


def encode_value(value: Any, kind: FeatureType) -> bytes:
    """One value as a serialized feast.types.Value; None (or NaN for floats) is NULL."""
    if value is None or (isinstance(value, float) and value != value):
        return NULL
    if isinstance(kind, Vector):
        return encode_vector(value, kind)
    tag = bytes((TAGS[kind],))
    if kind is ValueType.STRING:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return tag + _varint(len(raw)) + raw
    if kind in _FLOATS:
        return tag + struct.pack(_FLOATS[kind], value)
    return tag + _varint(int(bool(value)) if kind is ValueType.BOOL else int(value))


def encode_column(values: Any, kind: ValueType, mask: Optional[np.ndarray] = None) -> list[bytes]:
    """A whole column at once (a numpy array or a list); `mask` marks NULLs. Fixed-width types are packed by
    numpy in one pass, the rest value by value."""
    if kind in (ValueType.FLOAT64, ValueType.FLOAT32) and isinstance(values, np.ndarray):
        width, code = (8, "<f8") if kind is ValueType.FLOAT64 else (4, "<f4")
        packed = np.empty(len(values), dtype=[("tag", "u1"), ("value", code)])
        packed["tag"] = TAGS[kind]
        packed["value"] = values
        buf = packed.tobytes()
        size = width + 1
        out = [buf[i:i + size] for i in range(0, len(buf), size)]
        nulls = np.isnan(values) if mask is None else (mask | np.isnan(values))
    elif kind in (ValueType.INT64, ValueType.INT32, ValueType.TIMESTAMP) and isinstance(values, np.ndarray):
        matrix, lengths = varint_matrix(values, 1)
        matrix[:, 0] = TAGS[kind]
        out = matrix_rows(matrix, lengths)
        nulls = mask
    elif kind is ValueType.STRING:
        raw = [v.encode() if isinstance(v, str) else b"" for v in values]
        out = [b"\x12" + _SHORT_LENGTH[len(r)] + r if len(r) < 128 else encode_value(r, kind) for r in raw]
        nulls = np.array([v is None for v in values]) if mask is None else mask
    else:
        items = values.tolist() if isinstance(values, np.ndarray) else values
        out = [encode_value(v, kind) for v in items]
        nulls = mask
    if nulls is not None:
        for i in np.flatnonzero(nulls):
            out[i] = NULL
    return out


_SHORT_LENGTH = [bytes((n,)) for n in range(128)]


def encode_timestamp(epoch_ms: int) -> bytes:
    """A google.protobuf.Timestamp (seconds, nanos) from epoch milliseconds; zero fields are omitted."""
    seconds, millis = divmod(int(epoch_ms), 1000)
    out = bytes((TIMESTAMP_SECONDS,)) + _varint(seconds) if seconds else b""
    if millis:
        out += bytes((TIMESTAMP_NANOS,)) + _varint(millis * 1_000_000)
    return out


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def decode_timestamp_ms(data: Optional[bytes]) -> Optional[int]:
    """Epoch milliseconds of a serialized Timestamp; None when the field is missing."""
    if not data:
        return None if data is None else 0
    seconds = nanos = 0
    pos = 0
    while pos < len(data):
        tag = data[pos]
        value, pos = _read_varint(data, pos + 1)
        if tag == TIMESTAMP_SECONDS:
            seconds = value - (1 << 64) if value >= 1 << 63 else value
        elif tag == TIMESTAMP_NANOS:
            nanos = value
    return seconds * 1000 + nanos // 1_000_000


def _signed(value: int, bits: int) -> int:
    value &= (1 << 64) - 1
    if bits == 32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_float_list(data: bytes) -> list[float]:
    """The floats of a serialized float_list_val (`data` starts with FLOAT_LIST_TAG)."""
    _, pos = _read_varint(data, 2)
    if pos == len(data):
        return []
    size, pos = _read_varint(data, pos + 1)
    return np.frombuffer(data, dtype="<f4", count=size // 4, offset=pos).tolist()


def decode_value(data: Optional[bytes]) -> Any:
    """A serialized feast.types.Value back to a Python scalar (None for NULL or a missing field); a float list (a
    vector) to a list of floats."""
    if not data:
        return None
    if data.startswith(FLOAT_LIST_TAG):
        return decode_float_list(data)
    kind = _KINDS.get(data[0])
    if kind in _FLOATS:
        return struct.unpack_from(_FLOATS[kind], data, 1)[0]
    if kind is ValueType.STRING or data[0] == BYTES_TAG:
        length, pos = _read_varint(data, 1)
        raw = data[pos:pos + length]
        return raw.decode() if kind is ValueType.STRING else raw
    if kind in (ValueType.INT64, ValueType.TIMESTAMP):
        return _signed(_read_varint(data, 1)[0], 64)
    if kind is ValueType.INT32:
        return _signed(_read_varint(data, 1)[0], 32)
    if kind is ValueType.BOOL:
        return bool(_read_varint(data, 1)[0])
    from feast.protos.feast.types.Value_pb2 import Value as ValueProto  # lists, maps: rare, let protobuf do it

    proto = ValueProto()
    proto.ParseFromString(data)
    kind = proto.WhichOneof("val")
    return None if kind in (None, "null_val") else getattr(proto, kind)


def hash_fields(view: str, features: Iterable[str]) -> list[bytes]:
    """The hash fields to HMGET for `features` of `view`, with the view's `_ts` field last."""
    return [*(field_name(view, f) for f in features), ts_field(view)]
