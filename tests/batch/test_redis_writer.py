"""Check-and-set chunk writes against the real Redis: newer rows win, also against a concurrent writer."""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pyarrow as pa
import pytest
import redis

from batch.redis_writer import CheckedChunkWriter, RedisWriteError, RowCommands
from dsl.types import ValueType
from redis_store import columns, dump, layout
from redis_store.node import Connection
from redis_store.settings import RedisSettings

pytestmark = pytest.mark.integration

TS = layout.ts_field("v")
FIELD = layout.field_name("v", "score")


@pytest.fixture()
def client(local_services):
    """redis-py to look at what was written, the project, and the writer's settings."""
    host, port = local_services.redis_host_port
    client = redis.Redis(host, port)
    project = f"writer_{uuid.uuid4().hex[:8]}"
    yield client, project, RedisSettings.parse(f"{host}:{port}")
    for key in client.scan_iter(match=f"*{project}".encode(), count=1_000):
        client.delete(key)


def _chunk(project: str, ids: list[str], scores: list[int], millis: list[int], restore: bool = False,
           key_ttl_s: int = 0):
    encoder = layout.KeyEncoder(project, {"asset_id": ValueType.STRING})
    key_bulks = columns.bulk(columns.key_column(encoder, [pa.array(ids)]))
    ms = np.array(millis, dtype=np.int64)
    fields = [FIELD, TS]
    values = [columns.value_encoding(pa.array(scores), ValueType.INT64), columns.timestamp_column(ms)]
    reads = columns.hget_commands(key_bulks, TS)
    if not restore:
        return RowCommands(key_bulks, ms, reads, fields, values, key_ttl_s=key_ttl_s)
    return RowCommands(key_bulks, ms, reads, fields, values,
                       dump.restore_commands(key_bulks, fields, values, key_ttl_s),
                       dump.restorable(fields, values, 64, 128), key_ttl_s=key_ttl_s)


def _scores(client, project: str, ids: list[str]) -> list:
    encoder = layout.KeyEncoder(project, {"asset_id": ValueType.STRING})
    return [layout.decode_value(client.hget(k, FIELD)) for k in encoder.keys([ids])]


def test_chunks_are_written_and_older_rows_never_overwrite_newer(client):
    client, project, settings = client
    ids = [f"a{i}" for i in range(1_000)]
    rows = _chunk(project, ids, list(range(1_000)), [10_000] * 1_000)
    writer = CheckedChunkWriter(settings, connections=2)
    for lo in range(0, 1_000, 64):
        writer.send(rows.slice(lo, 64))
    assert writer.close() == 1_000
    assert _scores(client, project, ids) == list(range(1_000))

    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ids[:10] + ["fresh"], [-1] * 11, [9_999] * 10 + [5]))
    assert writer.close() == 1 and writer.skipped_older == 10
    assert _scores(client, project, ids[:10] + ["fresh"]) == list(range(10)) + [-1]

    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ids[:2], [7, 8], [10_000, 10_000]))
    assert writer.close() == 0 and writer.skipped_older == 2, \
        "a row as new as the stored one is skipped, as Feast's writer skips it (a stream's value at that instant " \
        "may count events at it that a boundary's value does not)"
    assert _scores(client, project, ids[:2]) == [0, 1]


def test_rows_before_the_replace_equal_bound_overwrite_an_equal_ts(client):
    """A backfill recomputes a boundary's values without moving the boundary: where no stream writes (before its
    cutover), its row overwrites the earlier materialization of the same instant; at and after it, it does not."""
    client, project, settings = client
    ids = ["before", "at", "after", "newer"]
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ids, [1, 2, 3, 4], [1_000, 2_000, 3_000, 9_000]))
    assert writer.close() == 4
    again = dataclasses.replace(_chunk(project, ids, [10, 20, 30, 40], [1_000, 2_000, 3_000, 4_000]),
                                replace_equal_before_ms=2_000)
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(again)
    assert writer.close() == 1 and writer.skipped_older == 3
    assert _scores(client, project, ids) == [10, 2, 3, 4]


class _InterruptedConnection(Connection):
    """After the first check, another client writes a newer value to one of the watched keys."""

    def __init__(self, settings: RedisSettings, other, key: bytes):
        super().__init__(settings, settings.nodes[0])
        self.other, self.key, self.interrupted, self.checking = other, key, False, False

    def write(self, payload: bytes) -> None:
        self.checking = b"\r\nWATCH\r\n" in payload[:32]
        super().write(payload)

    def read(self, count: int) -> list:
        out = super().read(count)
        if not self.interrupted and self.checking:
            self.interrupted = True
            self.other.hset(self.key, mapping={FIELD: layout.encode_value(999, ValueType.INT64),
                                               TS: layout.encode_timestamp(20_000)})
        return out


def test_a_concurrent_newer_write_aborts_the_chunk_which_is_checked_again(client):
    client, project, settings = client
    ids = ["x", "y", "z"]
    writer = CheckedChunkWriter(settings, connections=1)
    writer.close()
    key = layout.KeyEncoder(project, {"asset_id": ValueType.STRING}).key(["y"])
    conn = _InterruptedConnection(settings, client, key)
    try:
        written, skipped, retries = writer._write(conn, _chunk(project, ids, [1, 2, 3], [10_000] * 3))
    finally:
        conn.close()
    assert (written, skipped, retries) == (2, 1, 1)
    assert _scores(client, project, ids) == [1, 999, 3]


def test_an_aborted_chunk_in_the_pipeline_is_retried_and_the_next_chunk_still_written(client):
    client, project, settings = client
    writer = CheckedChunkWriter(settings, connections=0)
    for rows in (_chunk(project, ["x", "y", "z"], [1, 2, 3], [10_000] * 3), _chunk(project, ["u", "v"], [4, 5],
                                                                                      [10_000] * 2), None):
        writer.pending.put(rows)
    key = layout.KeyEncoder(project, {"asset_id": ValueType.STRING}).key(["y"])
    conn = _InterruptedConnection(settings, client, key)
    try:
        writer._ended.flag = False
        writer._pipeline(conn)
    finally:
        conn.close()
    assert (writer.written, writer.skipped_older, writer.retries) == (4, 1, 1)
    assert _scores(client, project, ["x", "y", "z", "u", "v"]) == [1, 999, 3, 4, 5]


def test_a_redis_error_reply_is_reported_with_its_reason(client):
    client, project, settings = client
    client.set(layout.KeyEncoder(project, {"asset_id": ValueType.STRING}).key(["s"]), "a string, not a hash")
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ["s"], [1], [10_000]))
    with pytest.raises(RedisWriteError, match="WRONGTYPE"):
        writer.close()


def test_new_keys_are_created_by_restore_and_existing_ones_are_checked(client):
    client, project, settings = client
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ["old", "new"], [1, 2], [5_000, 50_000]))
    assert writer.close() == 2
    ids = ["old", "new", *(f"n{i}" for i in range(100))]
    writer = CheckedChunkWriter(settings, connections=2)
    writer.send(_chunk(project, ids, list(range(102)), [10_000] * 102, restore=True))
    assert writer.close() == 101
    assert (writer.restored, writer.skipped_older) == (100, 1)
    assert _scores(client, project, ids) == [0, 2, *range(2, 102)], "older rows overwrite, newer ones stay"
    twin = layout.KeyEncoder(project, {"asset_id": ValueType.STRING}).key(["twin"])
    client.hset(twin, mapping={FIELD: layout.encode_value(5, ValueType.INT64), TS: layout.encode_timestamp(10_000)})
    restored = layout.KeyEncoder(project, {"asset_id": ValueType.STRING}).key(["n3"])
    assert client.dump(restored) == client.dump(twin), "a restored hash is the one HSET makes, byte for byte"


def test_a_refused_restore_turns_restores_off_and_every_row_is_still_written(client):
    client, project, settings = client
    user = f"no_restore_{uuid.uuid4().hex[:8]}"
    client.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-restore"])
    try:
        limited = RedisSettings.parse(f"{settings.nodes[0][0]}:{settings.nodes[0][1]},username={user},password=pw")
        ids = [f"r{i}" for i in range(10)]
        writer = CheckedChunkWriter(limited, connections=1)
        writer.send(_chunk(project, ids, list(range(10)), [10_000] * 10, restore=True))
        assert writer.close() == 10
        assert writer.restored == 0 and "NOPERM" in writer.restore_refused
        assert not writer.wants_restores()
        assert _scores(client, project, ids) == list(range(10))
    finally:
        client.acl_deluser(user)


def test_key_ttl_is_set_on_every_key_written_as_feast_does(client):
    """Feast's `key_ttl_seconds`: each written key (created by RESTORE or rewritten check-and-set) gets the
    expiry; a row skipped as older leaves the key's expiry as it was."""
    client, project, settings = client
    encoder = layout.KeyEncoder(project, {"asset_id": ValueType.STRING})
    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ["kept", "older"], [1, 2], [10_000, 90_000]))
    assert writer.close() == 2
    assert [client.ttl(k) for k in encoder.keys([["kept", "older"]])] == [-1, -1]

    writer = CheckedChunkWriter(settings, connections=1)
    writer.send(_chunk(project, ["kept", "older", "new"], [3, 4, 5], [20_000] * 3, restore=True, key_ttl_s=600))
    assert writer.close() == 2 and writer.restored == 1 and writer.skipped_older == 1
    kept, older, new = (client.ttl(k) for k in encoder.keys([["kept", "older", "new"]]))
    assert 590 <= kept <= 600 and 590 <= new <= 600, "rewritten and restored keys expire after key_ttl_s"
    assert older == -1, "a key whose stored row is newer was not written, so its expiry is unchanged"
    assert _scores(client, project, ["kept", "older", "new"]) == [3, 2, 5]
