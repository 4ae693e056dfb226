"""Our layout encoders and decoders agree byte for byte with Feast's own functions."""

from __future__ import annotations

import numpy as np
import pytest
from feast.infra.online_stores.helpers import _mmh3, _redis_key
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from google.protobuf.timestamp_pb2 import Timestamp

from dsl.types import ValueType
from redis_store import layout

PROTO_FIELD = {ValueType.STRING: "string_val", ValueType.INT32: "int32_val", ValueType.INT64: "int64_val",
               ValueType.FLOAT64: "double_val", ValueType.FLOAT32: "float_val", ValueType.BOOL: "bool_val",
               ValueType.TIMESTAMP: "unix_timestamp_val"}
SAMPLES = {
    ValueType.STRING: ["", "asset_000001", "ünïcødé ✓", "x" * 300],
    ValueType.INT32: [0, 1, -1, 2**31 - 1, -(2**31), 300],
    ValueType.INT64: [0, 1, 127, 128, 16383, 16384, -1, 2**63 - 1, -(2**63)],
    ValueType.FLOAT64: [0.0, -0.0, 1.5, -3.25e300, float("inf")],
    ValueType.FLOAT32: [0.0, 1.5, -2.0],
    ValueType.BOOL: [True, False],
    ValueType.TIMESTAMP: [0, 1_767_225_600, -5],
}


def _proto_bytes(value, kind: ValueType) -> bytes:
    return ValueProto(**{PROTO_FIELD[kind]: value}).SerializeToString()


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_encode_value_matches_protobuf(kind):
    for value in SAMPLES[kind]:
        assert layout.encode_value(value, kind) == _proto_bytes(value, kind), (kind, value)


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_decode_value_round_trips_protobuf(kind):
    for value in SAMPLES[kind]:
        decoded = layout.decode_value(_proto_bytes(value, kind))
        assert decoded == pytest.approx(value) if kind is ValueType.FLOAT32 else decoded == value


def test_null_is_an_empty_value():
    assert layout.encode_value(None, ValueType.INT64) == ValueProto().SerializeToString() == b""
    assert layout.encode_value(float("nan"), ValueType.FLOAT64) == b""
    assert layout.decode_value(b"") is None and layout.decode_value(None) is None


def test_encode_column_matches_scalar_encoding():
    floats = np.array([1.5, np.nan, -2.0])
    assert layout.encode_column(floats, ValueType.FLOAT64) == [_proto_bytes(1.5, ValueType.FLOAT64), b"",
                                                             _proto_bytes(-2.0, ValueType.FLOAT64)]
    ints = np.array([0, 5, 70000, -3], dtype=np.int64)
    mask = np.array([False, True, False, False])
    assert layout.encode_column(ints, ValueType.INT64, mask) == [
        _proto_bytes(0, ValueType.INT64), b"", _proto_bytes(70000, ValueType.INT64), _proto_bytes(-3, ValueType.INT64)]
    for kind in (ValueType.INT64, ValueType.INT32, ValueType.TIMESTAMP):
        values = np.array(SAMPLES[kind], dtype=np.int64)
        assert layout.encode_column(values, kind) == [_proto_bytes(v, kind) for v in SAMPLES[kind]], kind
    assert layout.encode_column(["a", "bé"], ValueType.STRING) == [_proto_bytes("a", ValueType.STRING),
                                                                 _proto_bytes("bé", ValueType.STRING)]


def test_field_names_match_feast():
    for view, feature in [("asset_activity", "views_1h"), ("v", "ü"), ("asset_attributes", "bbox_x")]:
        assert layout.field_name(view, feature) == _mmh3(f"{view}:{feature}")
    assert layout.ts_field("asset_activity") == b"_ts:asset_activity"


def _feast_key(project: str, keys: dict) -> bytes:
    entity_key = EntityKeyProto(join_keys=list(keys), entity_values=[
        ValueProto(string_val=v) if isinstance(v, str) else ValueProto(int64_val=v) for v in keys.values()])
    return _redis_key(project, entity_key, entity_key_serialization_version=3)


def test_single_string_key_matches_feast():
    encoder = layout.KeyEncoder("assets", {"asset_id": ValueType.STRING})
    ids = ["asset_000001", "é", ""]
    assert encoder.keys([ids]) == [_feast_key("assets", {"asset_id": i}) for i in ids]
    assert encoder.key(["asset_000001"]) == _feast_key("assets", {"asset_id": "asset_000001"})


def test_multi_key_entity_sorts_join_keys_like_feast():
    encoder = layout.KeyEncoder("shop", {"shop_id": ValueType.STRING, "item_id": ValueType.INT64})
    assert encoder.order == ["item_id", "shop_id"]
    assert encoder.key([42, "s1"]) == _feast_key("shop", {"shop_id": "s1", "item_id": 42})
    assert encoder.keys([[42, -7], ["s1", "s2"]])[1] == _feast_key("shop", {"item_id": -7, "shop_id": "s2"})


@pytest.mark.parametrize("millis", [0, 1, 999, 1_767_225_600_123, 1_767_225_600_000])
def test_timestamps_match_protobuf(millis):
    ts = Timestamp()
    ts.FromMilliseconds(millis)
    assert layout.encode_timestamp(millis) == ts.SerializeToString()
    assert layout.decode_timestamp_ms(ts.SerializeToString()) == millis
    assert layout.decode_timestamp_ms(None) is None
