"""Whole Feast rows as Redis DUMP payloads, built column by column, so that a new key costs Redis one RESTORE.

HSET makes Redis parse and insert every field of every row (5-6 us for a 21-field Feast row); RESTORE of a ready
hash costs it one checksum and one allocation. RESTORE without REPLACE refuses a key that exists, which makes it
the atomic "create if absent" a materializer needs: rows refused go the checked HSET way (`batch.redis_writer`).

A payload is what `DUMP` answers for a small hash: type 16 (hash as listpack), the RDB string holding the
listpack, RDB version 10 and the CRC-64/Jones of all of it. Redis 7.0 and later load it. Only rows whose values
fit Redis's own listpack limits (`hash-max-listpack-value`, `-entries`) are built, so a restored hash has the
encoding HSET would have given it and nothing downstream can tell the two apart.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Union

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redis_store import columns
from redis_store.node import SyncNode

HASH_LISTPACK = 16  # RDB_TYPE_HASH_LISTPACK
RDB_VERSION = 10  # Redis 7.0's, the first with listpack hashes; newer servers load older versions
MIN_SERVER = (7, 0)
_EMPTY = pa.scalar(b"", pa.binary())
_FOOTER = bytes([0xFF, RDB_VERSION, 0])  # listpack end marker, then the RDB version (little endian)
_RESTORE = b"*4\r\n$7\r\nRESTORE\r\n"
Encoded = Union[columns.BoundedValues, pa.BinaryArray]
_INTEGER = re.compile(rb"0|-?[1-9][0-9]{0,19}")  # what a listpack stores as an integer (and a few more)


def _crc_table() -> np.ndarray:
    """CRC-64/Jones (reflected, as Redis computes it) of every 16-bit value: two bytes per table lookup."""
    table = np.arange(1 << 16, dtype=np.uint64)
    poly, one = np.uint64(0x95AC9329AC4BC9B5), np.uint64(1)
    for _ in range(16):
        table = np.where(table & one, (table >> one) ^ poly, table >> one)
    return table


_CRC16 = _crc_table()
_SIXTEEN = np.uint64(16)


def crc64(parts: Sequence, sizes: np.ndarray, block_rows: int = 4096) -> np.ndarray:
    """Redis's CRC-64 of every row of `binary_join_element_wise(*parts)` (rows of `sizes` bytes). With a zero
    start, leading zero bytes leave the checksum at zero: Arrow joins a run of zeros before each row so that the
    joined data buffer is a matrix of right-aligned rows, which is checked column by column, two bytes per step."""
    rows = len(sizes)
    width = int(sizes.max()) + int(sizes.max()) % 2 if rows else 0
    zeros = columns.binary_array(width - sizes, np.zeros(rows * width - int(sizes.sum()), np.uint8))
    joined = pc.binary_join_element_wise(zeros, *parts, _EMPTY)
    matrix = np.frombuffer(joined.buffers()[2], dtype="<u2", count=rows * width // 2).reshape(rows, width // 2)
    crc = np.zeros(rows, dtype=np.uint64)
    for lo in range(0, rows, block_rows):  # a block's byte columns stay in cache while they are walked
        block = np.ascontiguousarray(matrix[lo:lo + block_rows].T)
        part = crc[lo:lo + block_rows]
        index, looked_up = np.empty(len(part), np.uint16), np.empty_like(part)
        for word in block:
            np.bitwise_xor(part.astype(np.uint16), word, out=index)
            np.take(_CRC16, index, out=looked_up)
            np.right_shift(part, _SIXTEEN, out=part)
            np.bitwise_xor(part, looked_up, out=part)
    return crc


def _type_and_length(sizes: np.ndarray) -> tuple[pa.BinaryArray, np.ndarray]:
    """The RDB object type, then each listpack's length as an RDB string length (6, 14 or 32 bits, big endian)."""
    rows = len(sizes)
    matrix = np.empty((rows, 6), dtype=np.uint8)
    matrix[:, 0] = HASH_LISTPACK
    matrix[:, 1] = np.where(sizes < 64, sizes, np.where(sizes < 16384, 0x40 | sizes >> 8, 0x80))
    matrix[:, 2] = sizes & 0xFF
    matrix[:, 2:] = np.where((sizes >= 16384)[:, None], sizes.astype(">u4").view(np.uint8).reshape(rows, 4),
                             matrix[:, 2:])
    lengths = np.where(sizes < 64, 2, np.where(sizes < 16384, 3, 6)).astype(np.int32)
    return columns.binary_rows(matrix, lengths), lengths


def constant_entry(value: bytes) -> bytes:
    """One listpack string entry: encoding and length, the bytes, then the entry's length backwards."""
    size = len(value)
    head = bytes([0x80 | size]) if size < 64 else bytes([0xE0 | size >> 8, size & 0xFF])
    whole = len(head) + size
    back = bytes([whole]) if whole < 128 else bytes([whole >> 7, (whole & 127) | 128])
    return head + value + back


def _one_byte_rows(values: np.ndarray) -> pa.BinaryArray:
    return columns.binary_array(np.ones(len(values), dtype=np.int32), values.astype(np.uint8))


def _sizes(values: Encoded) -> np.ndarray:
    if isinstance(values, columns.BoundedValues):
        return values.lengths.astype(np.int64)
    return pc.binary_length(values).to_numpy(zero_copy_only=False).astype(np.int64)


def _integer_like(values: Encoded, sizes: np.ndarray) -> np.ndarray:
    """Values a listpack would store as integers (HSET does that for canonical decimal strings): a restored hash
    would keep them as strings, so these rows take the HSET way to stay byte-identical."""
    if isinstance(values, columns.BoundedValues):
        first = values.matrix[:, 0]
    else:
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int32, count=values.offset + len(values) + 1)
        data = np.frombuffer(values.buffers()[2], dtype=np.uint8) if values.buffers()[2] else np.zeros(1, np.uint8)
        first = data[np.minimum(offsets[values.offset:-1], len(data) - 1)]
    candidates = (sizes > 0) & (sizes <= 20) & (((first >= 0x30) & (first <= 0x39)) | (first == 0x2D))
    if not candidates.any():
        return candidates
    binary = values.binary() if isinstance(values, columns.BoundedValues) else values
    return pc.match_substring_regex(binary, f"^({_INTEGER.pattern.decode()})$").to_numpy(zero_copy_only=False)


def restorable(fields: Sequence[bytes], values: Sequence[Encoded], max_value: int, max_entries: int) -> np.ndarray:
    """Rows whose hash Redis would keep as a listpack of plain strings after HSET: no more fields than
    `hash-max-listpack-entries`, every field and value shorter than 64 bytes and within
    `hash-max-listpack-value`, none that reads as an integer."""
    rows = len(_sizes(values[0])) if values else 0
    limit = min(max_value, 63)  # one-byte entry headers
    if len(fields) > max_entries or any(len(f) > limit or _INTEGER.fullmatch(f) for f in fields):
        return np.zeros(rows, dtype=bool)
    fits = np.ones(rows, dtype=bool)
    for column in values:
        sizes = _sizes(column)
        fits &= (sizes <= limit) & ~_integer_like(column, sizes)
    return fits


def _entries(field: bytes, values: Encoded) -> tuple[pa.BinaryArray, np.ndarray]:
    """The field's listpack entry then the value's, for every row, and their lengths. Numbers are placed in one
    matrix (field, header, value, back length); strings are joined by Arrow."""
    field_entry = constant_entry(field)
    at = len(field_entry)
    sizes = _sizes(values) & 63  # restorable rows are shorter; the others are never sent
    if isinstance(values, columns.BoundedValues):
        rows, width = values.matrix.shape
        matrix = np.empty((rows, at + width + 2), dtype=np.uint8)
        matrix[:, :at] = np.frombuffer(field_entry, dtype=np.uint8)
        matrix[:, at] = 0x80 | sizes
        matrix[:, at + 1:at + 1 + width] = values.matrix
        matrix[np.arange(rows), at + 1 + sizes] = sizes + 1
        return columns.binary_rows(matrix, (at + 2 + sizes).astype(np.int32)), at + 2 + sizes
    joined = pc.binary_join_element_wise(pa.scalar(field_entry, pa.binary()), _one_byte_rows(0x80 | sizes), values,
                                         _one_byte_rows(sizes + 1), _EMPTY)
    return joined, at + 2 + sizes


def restore_commands(key_bulks: pa.BinaryArray, fields: Sequence[bytes], values: Sequence[Encoded],
                     ttl_s: int = 0) -> pa.BinaryArray:
    """One RESP `RESTORE key ttl payload` per row (keys given as `columns.bulk(keys)`; `ttl_s` 0: none; no
    REPLACE) whose payload is the DUMP of the hash {fields[i]: values[i][row]}. Meaningful for `restorable` rows only
    (their entries all have one-byte headers and back lengths); the others are to be ignored."""
    rows = len(key_bulks)
    entries: list = []
    total = np.full(rows, 6 + 1, dtype=np.int64)  # listpack header and end marker
    for field, column in zip(fields, values):
        joined, lengths = _entries(field, column)
        entries.append(joined)
        total += lengths
    header = np.empty((rows, 6), dtype=np.uint8)
    header[:, :4] = total.astype("<u4").view(np.uint8).reshape(rows, 4)
    header[:, 4:] = np.frombuffer((2 * len(fields)).to_bytes(2, "little"), dtype=np.uint8)
    type_and_length, prefix_sizes = _type_and_length(total)
    body = [type_and_length, columns.binary_rows(header, np.full(rows, 6, dtype=np.int32)), *entries,
            pa.scalar(_FOOTER, pa.binary())]
    body_sizes = prefix_sizes + total + 2
    crc = crc64(body, body_sizes).astype("<u8").view(np.uint8).reshape(rows, 8)
    smallest = int(body_sizes.min()) + 8 if rows else 0
    heads = pa.array([b"$%d\r\n" % n for n in range(smallest, int(body_sizes.max()) + 9)], pa.binary())
    return pc.binary_join_element_wise(
        pa.scalar(_RESTORE, pa.binary()), key_bulks, columns.bulk_constant(b"%d" % (ttl_s * 1000)),
        heads.take(pa.array(body_sizes + 8 - smallest)), *body,
        columns.binary_rows(crc, np.full(rows, 8, dtype=np.int32)), pa.scalar(b"\r\n", pa.binary()), _EMPTY)


def listpack_limits(node: SyncNode) -> Optional[tuple[int, int]]:
    """(hash-max-listpack-value, hash-max-listpack-entries) of the server, or None when it cannot load these
    payloads (Redis before 7.0). A server that hides CONFIG is taken to have the defaults: a limit changed there
    only changes how Redis stores a hash, never what reads return."""
    version = tuple(int(part) for part in node.info("server").get("redis_version", "0").split(".")[:2])
    if version < MIN_SERVER:
        return None
    [reply] = node.execute([hiredis.pack_command(("CONFIG", "GET", "hash-max-listpack-*"))])
    if isinstance(reply, hiredis.ReplyError):
        return 64, 128
    config = dict(zip(reply[::2], reply[1::2]))
    return int(config[b"hash-max-listpack-value"]), int(config[b"hash-max-listpack-entries"])
