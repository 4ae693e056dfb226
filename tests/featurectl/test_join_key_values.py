"""A join key's value on the command line (`delete --entity`, `assets similar ENTITY_ID`) is typed as the key."""

from __future__ import annotations

import pytest

from common.errors import FeaturectlError
from dsl.types import ValueType
from featurectl.params import join_key_value


def test_an_integer_join_key_takes_the_value_as_a_whole_number():
    assert join_key_value("0", ValueType.INT64, "item_id") == 0
    assert join_key_value("-1099511627776", ValueType.INT64, "item_id") == -(2**40)
    assert join_key_value("007", ValueType.STRING, "asset_id") == "007"
    with pytest.raises(FeaturectlError, match=r"join key `item_id` is INT64: `seven` is not a whole number"):
        join_key_value("seven", ValueType.INT64, "item_id")


def test_a_value_outside_the_keys_integer_type_is_refused_with_its_range():
    assert join_key_value(str(2**63 - 1), ValueType.INT64, "item_id") == 2**63 - 1
    assert join_key_value(str(-(2**31)), ValueType.INT32, "slot") == -(2**31)
    with pytest.raises(FeaturectlError, match=r"`item_id` is INT64: `9223372036854775808` is out of its range "
                                              r"\[-9223372036854775808, 9223372036854775807\]"):
        join_key_value("9223372036854775808", ValueType.INT64, "item_id")
    with pytest.raises(FeaturectlError, match=r"`slot` is INT32: `2147483648` is out of its range"):
        join_key_value("2147483648", ValueType.INT32, "slot")
