"""`serving.row_values`: a one-row `get_features` dict written straight from the HMGET replies holds, value for value
and type for type, what the general path holds (`finish`, then `to_dict`): every stored type, nulls, absent fields,
non-finite floats, missing and stale views, the first time and from the remembered values."""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from dsl.types import ValueType, Vector
from redis_store.layout import FLOAT_CODES, NULL, encode_value
from serving.catalog import Catalog, FeatureSpec, ViewSpec
from serving.errors import EntityError
from serving.plan import build_plan
from serving.request import PreparedRequest

NOW_S = 1_795_948_917
KINDS: dict[str, Any] = {"views": ValueType.INT64, "big": ValueType.INT64, "rate": ValueType.FLOAT64,
                         "ratio": ValueType.FLOAT32, "name": ValueType.STRING, "flag": ValueType.BOOL,
                         "count": ValueType.INT32, "embedding": Vector(3), "raw": None, "rate2": ValueType.FLOAT64}
JOIN_KEYS = (("asset_id", ValueType.STRING),)


def _catalog() -> Catalog:
    """`activity`: every type, a 1 h ttl; `forever`: one string, no ttl; `owner`: another entity (its own hash)."""
    features = {name: FeatureSpec(name, kind, name.encode()) for name, kind in KINDS.items()}
    views = {"activity": ViewSpec("activity", "activity", JOIN_KEYS, dict(features), 3_600_000, b"_ts:activity"),
             "forever": ViewSpec("forever", "forever", JOIN_KEYS, {"name": features["name"]}, None, b"_ts:forever"),
             "owner": ViewSpec("owner", "owner", (("user_id", ValueType.INT64),),
                               {"count": features["count"]}, 60_000, b"_ts:owner")}
    return Catalog("proj", views, {}, version=1)


def _ts(seconds: int, nanos: int = 0) -> bytes:
    return Timestamp(seconds=seconds, nanos=nanos).SerializeToString()


def _stored(name: str, value: Any) -> Any:
    """What Redis holds for one field: bytes as given (stored by another writer), None (an absent field), NULL for
    a null, otherwise the value's encoding."""
    if isinstance(value, bytes) or value is None:
        return value
    if isinstance(value, float) and math.isnan(value):  # `encode_value` writes NaN as a null: another writer's NaN
        return encode_value(0.0, KINDS[name])[:1] + struct.pack("<" + FLOAT_CODES[KINDS[name]], value)
    return encode_value(value, KINDS[name])


def _same(ours: Any, theirs: Any) -> bool:
    """Equal with the same types (True is no 1), NaN equal to NaN, lists item by item."""
    if isinstance(ours, (list, tuple)) or type(theirs).__name__ == "RepeatedScalarContainer":
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if type(ours) is not type(theirs):
        return False
    return ours == theirs or (isinstance(ours, float) and math.isnan(ours) and math.isnan(theirs))


def _assert_same(ours: dict, general: dict) -> None:
    assert list(ours) == list(general)
    for name in ours:
        assert _same(ours[name], general[name]), (name, ours[name], general[name])


ROWS = [
    ({"views": 7, "big": 10 ** 15, "rate": 0.25, "ratio": 1.5, "name": 'é "q"\u2028', "flag": True, "count": -3,
      "embedding": [0.5, -1.0, 2.0], "raw": b"\x0a\x03abc", "rate2": -0.0}, _ts(NOW_S - 60, 5_000)),
    ({"views": 70_000, "big": -1, "rate": math.nan, "ratio": -math.inf, "name": "", "flag": False, "count": 0,
      "embedding": NULL, "raw": NULL, "rate2": math.inf}, _ts(NOW_S - 1, 123_000_000)),
    ({"views": NULL, "rate": None, "ratio": b"\x29" + bytes(8), "name": "x" * 300, "count": 2 ** 31 - 1,
      "rate2": 1e300}, _ts(NOW_S - 3600)),  # absent fields, a float stored as the other width, at the ttl's edge
    ({"views": 1, "rate": 2.0, "rate2": 3.0}, _ts(NOW_S - 3600, 1_000_000)),  # a millisecond past the ttl
    ({"views": 1, "rate": 2.0, "rate2": 3.0}, None),  # no row in the view
]


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("forever_ts", [None, _ts(0), _ts(NOW_S + 10)])
@pytest.mark.parametrize("values, activity_ts", ROWS)
def test_a_row_written_from_the_replies_holds_what_the_general_path_holds(values, activity_ts, forever_ts, full,
                                                                           monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW_S)
    activity = [name for name in KINDS if name != "name" or full]
    plan = build_plan(_catalog(), [*(f"activity:{name}" for name in activity), "forever:name"], full)
    replies = [[*(_stored(name, values.get(name)) for name in activity), activity_ts,
                encode_value("kept", ValueType.STRING), forever_ts]]
    for _ in range(3):  # the first time decoded, then from the remembered values
        request = PreparedRequest(plan, {"asset_id": ["asset_1"]})
        ours = request.to_dict(replies)
        _assert_same(ours, request.finish(replies).to_dict())


def test_views_of_two_entities_are_read_from_their_own_hashes(monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW_S)
    plan = build_plan(_catalog(), ["activity:views", "owner:count", "activity:embedding"], True)
    for owner_ts in (_ts(NOW_S - 30), _ts(NOW_S - 61), None):
        request = PreparedRequest(plan, [{"user_id": 12, "asset_id": "a"}])
        assert [command.count(b"HMGET") for command in request.commands] == [1, 1]
        replies = [[encode_value(5, ValueType.INT64), encode_value([1.0, 2.0, 3.0], Vector(3)), _ts(NOW_S)],
                   [encode_value(9, ValueType.INT32), owner_ts]]
        _assert_same(request.to_dict(replies), request.finish(replies).to_dict())


def test_answers_share_no_mutable_object_with_each_other_or_the_caller(monkeypatch):
    """A caller may change what it got back: neither its entity list nor a vector reaches the next answer."""
    monkeypatch.setattr("time.time", lambda: NOW_S)
    plan = build_plan(_catalog(), ["activity:embedding", "activity:views"])
    replies = [[encode_value([1.0, 2.0, 3.0], Vector(3)), encode_value(4, ValueType.INT64), _ts(NOW_S)]]
    ids = ["asset_1"]
    first = PreparedRequest(plan, {"asset_id": ids}).to_dict(replies)
    first["asset_id"].append("x")
    first["embedding"][0].append(9.0)
    first["views"].append(5)
    second = PreparedRequest(plan, {"asset_id": ids}).to_dict(replies)
    assert ids == ["asset_1"]
    assert second == {"asset_id": ["asset_1"], "embedding": [[1.0, 2.0, 3.0]], "views": [4]}


def test_other_requests_take_the_general_path_and_bad_rows_its_errors():
    plan = build_plan(_catalog(), ["activity:views"])
    request = PreparedRequest(plan, {"asset_id": ["a", "b"]})
    replies = [[encode_value(1, ValueType.INT64), None], [NULL, _ts(0)]]
    assert request.to_dict(replies) == request.finish(replies).to_dict()
    assert plan.row_values is None
    with pytest.raises(EntityError, match="takes string values; row 0 holds int 3"):
        PreparedRequest(plan, {"asset_id": [3]})
