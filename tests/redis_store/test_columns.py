"""The column encoders write exactly the bytes of the row-by-row layout encoders, and well-formed RESP."""

from __future__ import annotations

import datetime as dt

import hiredis
import numpy as np
import pyarrow as pa
import pytest

from dsl.types import ValueType
from redis_store import columns, layout

SAMPLES = {
    ValueType.STRING: (pa.string(), ["", "asset_000001", "ünïcødé ✓", "x" * 300, None, "y" * 20_000]),
    ValueType.INT32: (pa.int32(), [0, 1, -1, 2**31 - 1, -(2**31), 300, None]),
    ValueType.INT64: (pa.int64(), [0, 1, 127, 128, 16383, 16384, -1, 2**63 - 1, -(2**63), None, 2**56]),
    ValueType.FLOAT64: (pa.float64(), [0.0, -0.0, 1.5, -3.25e300, float("inf"), float("nan"), None]),
    ValueType.FLOAT32: (pa.float32(), [0.0, 1.5, -2.0, None, float("nan")]),
    ValueType.BOOL: (pa.bool_(), [True, False, None]),
    ValueType.TIMESTAMP: (pa.int64(), [0, 1_767_225_600, -5, None]),
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_value_column_matches_the_row_encoder(kind):
    arrow_type, values = SAMPLES[kind]
    got = columns.value_column(pa.array(values, arrow_type), kind).to_pylist()
    assert got == [layout.encode_value(v, kind) for v in values]


def test_value_column_of_many_random_rows_and_chunked_input():
    rng = np.random.default_rng(3)
    numbers = rng.integers(-2**62, 2**62, 5_000) >> rng.integers(0, 62, 5_000)
    mask = rng.random(5_000) < 0.1
    chunked = pa.chunked_array([pa.array(numbers[:2_000], mask=mask[:2_000]), pa.array(numbers[2_000:],
                                                                                          mask=mask[2_000:])])
    want = [None if m else int(v) for v, m in zip(numbers, mask)]
    assert columns.value_column(chunked, ValueType.INT64).to_pylist() == [
        layout.encode_value(v, ValueType.INT64) for v in want]


def test_timestamp_features_are_epoch_seconds():
    stamps = [dt.datetime(2026, 11, 29, 10, 0, 0, 999_000, tzinfo=dt.timezone.utc), None]
    got = columns.value_column(pa.array(stamps, pa.timestamp("ms", "UTC")), ValueType.TIMESTAMP).to_pylist()
    assert got == [layout.encode_value(int(stamps[0].timestamp()), ValueType.TIMESTAMP), b""]


def test_timestamp_column_matches_protobuf_timestamps():
    millis = np.array([0, 1, 999, 1000, 1001, 1_767_225_600_123, 2**41, -1500])
    assert columns.timestamp_column(millis).to_pylist() == [layout.encode_timestamp(int(m)) for m in millis]


@pytest.mark.parametrize("join_keys", [{"asset_id": ValueType.STRING},
                                       {"shop_id": ValueType.STRING, "item_id": ValueType.INT64},
                                       {"slot": ValueType.INT32}])
def test_key_column_matches_the_key_encoder(join_keys):
    encoder = layout.KeyEncoder("proj", join_keys)
    samples = {ValueType.STRING: ["a", "ünï", "asset_0000001"], ValueType.INT64: [0, -7, 2**40],
               ValueType.INT32: [1, -1, 2**31 - 1]}
    cols = [samples[join_keys[name]] for name in encoder.order]
    got = columns.key_column(encoder, [pa.array(c) for c in cols]).to_pylist()
    assert got == [encoder.key(values) for values in zip(*cols)]


def test_null_entity_keys_are_refused():
    encoder = layout.KeyEncoder("proj", {"asset_id": ValueType.STRING})
    with pytest.raises(ValueError, match="join keys"):
        columns.key_column(encoder, [pa.array(["a", None])])


def test_commands_are_the_resp_of_their_arguments_and_slice_without_copy():
    keys = pa.array([b"k1", b"key-two", b"\x00\r\n"], pa.binary())
    values = pa.array([b"", b"v" * 300, b"\r\n"], pa.binary())
    hset = columns.hset_commands(columns.bulk(keys), [b"f", b"_ts:v"], [values, values])
    want = [hiredis.pack_command(("HSET", k, b"f", v, b"_ts:v", v)) for k, v in zip(keys.to_pylist(),
                                                                                    values.to_pylist())]
    assert hset.to_pylist() == want
    assert bytes(columns.command_bytes(hset, 0, 3)) == b"".join(want)
    assert bytes(columns.command_bytes(hset.slice(1, 2), 0, 2)) == b"".join(want[1:])
    assert columns.hget_commands(columns.bulk(keys), b"_ts:v").to_pylist() == [
        hiredis.pack_command(("HGET", k, b"_ts:v")) for k in keys.to_pylist()]
    watch = columns.variadic_head(b"WATCH", 3) + bytes(columns.command_bytes(columns.bulk(keys), 0, 3))
    assert watch == hiredis.pack_command(("WATCH", *keys.to_pylist()))


def test_empty_columns_make_no_commands():
    empty = pa.array([], pa.binary())
    assert len(columns.hset_commands(columns.bulk(empty), [b"f"], [empty])) == 0


def test_long_values_get_long_length_headers():
    values = pa.array([b"a" * 255, b"b" * 256, b"c" * 100_000], pa.binary())
    assert columns.bulk(values).to_pylist() == [b"$%d\r\n%s\r\n" % (len(v), v) for v in values.to_pylist()]
