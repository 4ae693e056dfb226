"""`featurectl assets similar ENTITY_ID`: the id on the command line is typed as the view's join key."""

from __future__ import annotations

import pytest

from common.errors import FeaturectlError
from dsl.types import ValueType
from featurectl.similar_commands import _typed_id


def test_an_integer_join_key_takes_the_id_as_a_whole_number():
    assert _typed_id("0", "item_id", ValueType.INT64) == 0
    assert _typed_id("-1099511627776", "item_id", ValueType.INT64) == -(2**40)
    assert _typed_id("007", "asset_id", ValueType.STRING) == "007"
    with pytest.raises(FeaturectlError, match=r"join key `item_id` is int64: `seven` is not a whole number"):
        _typed_id("seven", "item_id", ValueType.INT64)
