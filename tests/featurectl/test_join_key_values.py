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
