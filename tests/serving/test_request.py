"""Entity rows checked against the join keys and request fields a request needs: numpy scalars taken as the
Python values they hold, and mistakes named for what they are."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from dsl.types import ValueType
from serving.errors import EntityError
from serving.request import entity_columns

KEYS = {"store_id": ValueType.INT64}
FIELDS = {"mult": ValueType.INT64, "discount": ValueType.FLOAT64, "flag": ValueType.BOOL, "tag": ValueType.STRING}


def test_numpy_scalars_are_taken_as_python_values():
    rows = {"store_id": [np.int64(3), 4], "mult": [np.int32(2), np.uint8(1)], "discount": [np.float32(0.5), 1],
            "flag": [np.bool_(True), False], "tag": [np.str_("t"), "u"]}
    keys, n, request = entity_columns(rows, KEYS, FIELDS)
    assert n == 2 and keys == {"store_id": [3, 4]}
    assert request == {"mult": [2, 1], "discount": [0.5, 1], "flag": [True, False], "tag": ["t", "u"]}
    assert {type(v) for column in (*keys.values(), *request.values()) for v in column} == {int, float, bool, str}
    one = [np.int64(7)]
    assert entity_columns({"store_id": one}, KEYS) == ({"store_id": [7]}, 1, {})  # the one-key path
    assert type(one[0]) is np.int64  # the caller's list is left as it was


@pytest.mark.parametrize("column, message", [
    ({"mult": [np.float64(3.0)]}, r"request field `mult` takes int64 values; row 0 holds float 3.0$"),
    ({"mult": [np.bool_(True)]}, r"request field `mult` takes int64 values; row 0 holds bool True$"),
    ({"flag": [np.int64(1)]}, r"request field `flag` takes bool values; row 0 holds int 1$"),
    ({"mult": [2**63]}, r"request field `mult` takes int64 values; row 0 holds int 9223372036854775808 "
                        r"\(out of range\)"),
    # JSON's whole numbers below int64 parse as floats (orjson): out of range as well
    ({"mult": orjson.loads(b"[-9223372036854775809]")}, r"request field `mult` takes int64 values; row 0 holds "
                                                        r"float -9.22\d*e\+18 \(out of range\)"),
    ({"discount": 0.1}, r"request field `discount` must be a list of values, one per row; got float"),
    ({"store_id": 3}, r"entity `store_id` must be a list of values, one per row; got int"),
])
def test_mistakes_say_what_the_value_is(column, message):
    rows = {"store_id": [3], "mult": [2], "discount": [0.5], "flag": [True], "tag": ["t"], **column}
    with pytest.raises(EntityError, match=message):
        entity_columns(rows, KEYS, FIELDS)
