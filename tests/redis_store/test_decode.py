"""Column decoders against Feast's own protobuf parse of what Feast's own code serializes, fast paths and
fallbacks alike."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from dsl.types import ValueType
from redis_store.decode import column_decoder


def _feast_bytes(value, kind: ValueType) -> bytes:
    from feast.type_map import python_values_to_proto_values

    return python_values_to_proto_values([value], kind.feast_value_type())[0].SerializeToString()


def _feast_value(raw):
    from feast.protos.feast.types.Value_pb2 import Value

    proto = Value.FromString(raw or b"")
    kind = proto.WhichOneof("val")
    return None if kind in (None, "null_val") else getattr(proto, kind)


VALUES = {
    ValueType.INT64: st.integers(-(2 ** 63), 2 ** 63 - 1) | st.integers(0, 20000),
    ValueType.INT32: st.integers(-(2 ** 31), 2 ** 31 - 1) | st.integers(0, 5000),
    ValueType.FLOAT64: st.floats(allow_nan=False),
    ValueType.FLOAT32: st.floats(width=32, allow_nan=False),
    ValueType.STRING: st.text(max_size=200),
    ValueType.BOOL: st.booleans(),
}


@pytest.mark.parametrize("kind", list(VALUES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_columns_decode_like_protobuf(kind, data):
    values = data.draw(st.lists(VALUES[kind] | st.none(), max_size=12))
    column = [_feast_bytes(v, kind) if v is not None else data.draw(st.sampled_from([None, b""])) for v in values]
    decoded = column_decoder(kind)(column)
    assert decoded == [_feast_value(raw) for raw in column]
    assert [type(v) for v in decoded] == [type(_feast_value(raw)) for raw in column]


def test_full_float_columns_take_the_packed_path_and_keep_specials():
    values = [0.0, -0.0, 1.5, float("inf"), -1e-308, 3.0]
    decoded = column_decoder(ValueType.FLOAT64)([_feast_bytes(v, ValueType.FLOAT64) for v in values])
    assert decoded == values and math.copysign(1, decoded[1]) == -1
    from feast.protos.feast.types.Value_pb2 import Value

    # both writers store NaN as NULL, but a NaN double written by another client decodes as NaN
    nan = column_decoder(ValueType.FLOAT64)([Value(double_val=float("nan")).SerializeToString()] * 5)
    assert len(nan) == 5 and all(v != v for v in nan)


def test_a_value_of_another_type_falls_back_to_the_generic_decoder():
    column = [_feast_bytes(3, ValueType.INT64), _feast_bytes("x", ValueType.STRING), None, None]
    assert column_decoder(ValueType.FLOAT64)(column) == [3, "x", None, None]
    assert column_decoder(None)(column) == [3, "x", None, None]


def test_string_columns_remember_values_and_still_decode_new_ones():
    decode = column_decoder(ValueType.STRING)
    first = [_feast_bytes(v, ValueType.STRING) for v in ("cat_a", "cat_b", "cat_a")]
    assert decode(first) == ["cat_a", "cat_b", "cat_a"]
    assert decode(first) == ["cat_a", "cat_b", "cat_a"]  # now from the table of seen values
    mixed = [first[1], _feast_bytes("new é" * 40, ValueType.STRING), None, b"", first[0]]
    assert decode(mixed) == ["cat_b", "new é" * 40, None, None, "cat_a"]
