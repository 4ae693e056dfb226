"""DUMP payloads built column-wise: Redis restores them into exactly the hash HSET would have made."""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pytest
import redis

from dsl.types import ValueType
from redis_store import columns, dump, layout
from redis_store.node import SyncNode
from redis_store.settings import RedisSettings


def test_crc64_is_redis_crc64_jones():
    parts = [pa.array([b"123456789", b"", b"\x00\x00123456789", b"a"], pa.binary())]
    crc = dump.crc64(parts, np.array([9, 0, 11, 1]))
    assert int(crc[0]) == 0xE9C6D914C4B8D9CA  # the check value of CRC-64/Jones in Redis's crc64.c
    assert int(crc[1]) == 0 and int(crc[2]) == int(crc[0]), "leading zeros leave the checksum unchanged"


def test_entries_have_listpack_encoding():
    assert dump.constant_entry(b"ab") == b"\x82ab\x03"
    assert dump.constant_entry(b"x" * 100) == b"\xe0\x64" + b"x" * 100 + b"\x66"
    assert dump.constant_entry(b"x" * 200) == b"\xe0\xc8" + b"x" * 200 + b"\x01\xca", "back length in two bytes"


def _table(rows: int, seed: int) -> tuple[list[bytes], list, list[list]]:
    rng = np.random.default_rng(seed)
    kinds = {ValueType.INT64: pa.array(rng.integers(-2**62, 2**62, rows)),
             ValueType.INT32: pa.array(rng.integers(-1000, 1000, rows).astype(np.int32)),
             ValueType.FLOAT64: pa.array(np.where(rng.random(rows) < 0.1, np.nan, rng.normal(0, 1e6, rows))),
             ValueType.FLOAT32: pa.array(rng.normal(0, 1, rows).astype(np.float32)),
             ValueType.BOOL: pa.array(rng.random(rows) < 0.5),
             ValueType.STRING: pa.array([None if i % 7 == 0 else "s" * int(rng.integers(0, 40)) for i in range(rows)])}
    fields = [layout.field_name("v", kind.name.lower()) for kind in kinds] + [layout.ts_field("v")]
    millis = rng.integers(0, 2**41, rows)
    encoded = [columns.value_encoding(column, kind) for kind, column in kinds.items()]
    encoded.append(columns.timestamp_column(millis))
    python = [[layout.encode_value(column[i].as_py(), kind) for i in range(rows)] for kind, column in kinds.items()]
    python.append([layout.encode_timestamp(int(m)) for m in millis])
    return fields, encoded, python


@pytest.mark.integration
def test_restored_hashes_equal_hset_ones_byte_for_byte(local_services):
    client = redis.Redis(*local_services.redis_host_port)
    project = f"dump_{uuid.uuid4().hex[:8]}"
    rows = 300
    fields, encoded, python = _table(rows, seed=3)
    keys = [f"{project}:{i}".encode() for i in range(rows)]
    commands = dump.restore_commands(columns.bulk(pa.array(keys, pa.binary())), fields, encoded)
    assert dump.restorable(fields, encoded, 64, 128).all()
    try:
        for i, key in enumerate(keys):
            client.hset(key + b":twin", mapping={f: python[j][i] for j, f in enumerate(fields)})
        conn = client.connection_pool.get_connection()
        try:
            conn.send_packed_command([bytes(columns.command_bytes(commands, 0, rows))])
            assert {conn.read_response() for _ in range(rows)} == {b"OK"}
        finally:
            client.connection_pool.release(conn)
        assert [client.dump(k) for k in keys] == [client.dump(k + b":twin") for k in keys]
    finally:
        client.delete(*keys, *(k + b":twin" for k in keys))


def test_rows_hset_would_store_differently_are_not_restorable():
    fields = [b"f", b"g"]
    short = pa.array([b"\x20\x01", b"\x20\x02", b"\x20\x03", b"\x20\x04"], pa.binary())
    other = pa.array([b"x" * 63, b"x" * 64, b"5123", b"-7"], pa.binary())
    assert dump.restorable(fields, [short, other], 64, 128).tolist() == [True, False, False, False]
    assert dump.restorable(fields, [short, other], 10, 128).tolist() == [False] * 4
    assert not dump.restorable([b"1234", b"g"], [short, short], 64, 128).any(), "a field that reads as a number"
    assert not dump.restorable(fields, [short, short], 64, 1).any(), "more fields than a listpack holds"
    digits = np.frombuffer(b"1234", dtype="<f4")  # a float32 whose Value bytes are b"51234"
    encoded = columns.value_encoding(pa.array(np.concatenate([digits, [1.5]]).astype(np.float32)),
                                     ValueType.FLOAT32)
    assert dump.restorable([b"f"], [encoded], 64, 128).tolist() == [False, True]


@pytest.mark.integration
def test_listpack_limits_come_from_the_server(local_services):
    host, port = local_services.redis_host_port
    client = redis.Redis(host, port)
    node = SyncNode(RedisSettings.parse(f"{host}:{port}"), (host, port))
    value, entries = dump.listpack_limits(node)
    node.close()
    config = client.config_get("hash-max-listpack-*")
    assert (value, entries) == (int(config["hash-max-listpack-value"]), int(config["hash-max-listpack-entries"]))
