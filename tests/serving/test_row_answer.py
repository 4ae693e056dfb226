"""`serving.row_answer`: a one-row answer written straight from the HMGET replies is byte for byte the JSON of the
general path (`finish`, then `to_feast_response`), for present, null, missing, stale and non-finite values."""

from __future__ import annotations

import math

import orjson
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from dsl.types import ValueType
from redis_store.layout import NULL, encode_value
from serving.catalog import Catalog, FeatureSpec, ViewSpec
from serving.plan import build_plan
from serving.request import PreparedRequest

NOW_S = 1_795_948_917
KINDS = {"views": ValueType.INT64, "big": ValueType.INT64, "rate": ValueType.FLOAT64, "ratio": ValueType.FLOAT32,
         "name": ValueType.STRING, "flag": ValueType.BOOL, "count": ValueType.INT32}


def _catalog() -> Catalog:
    features = {name: FeatureSpec(name, kind, name.encode()) for name, kind in KINDS.items()}
    join_keys = (("asset_id", ValueType.STRING),)
    views = {"activity": ViewSpec("activity", "activity", join_keys, dict(features), 3_600_000, b"_ts:activity"),
             "forever": ViewSpec("forever", "forever", join_keys, {"name": features["name"]}, None, b"_ts:forever")}
    return Catalog("proj", views, {"svc": ["activity:views", "forever:name"]}, version=1)


def _ts(seconds: int, nanos: int = 0) -> bytes:
    return Timestamp(seconds=seconds, nanos=nanos).SerializeToString()


def _reply(values: dict, activity_ts, forever_ts) -> list:
    """An HMGET reply in the plan's field order: each view's requested fields, then its `_ts`."""
    return [*(values.get(name) for name in KINDS), activity_ts, values.get("forever"), forever_ts]


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("values, activity_ts, forever_ts", [
    ({"views": encode_value(7, ValueType.INT64), "big": encode_value(10 ** 15, ValueType.INT64),
      "rate": encode_value(0.25, ValueType.FLOAT64), "ratio": encode_value(1.5, ValueType.FLOAT32),
      "name": encode_value('é "q"\u2028', ValueType.STRING), "flag": encode_value(True, ValueType.BOOL),
      "count": encode_value(-3, ValueType.INT32), "forever": encode_value("x", ValueType.STRING)},
     _ts(NOW_S - 60, 5_000), _ts(0)),
    ({"rate": encode_value(math.nan, ValueType.FLOAT64), "ratio": encode_value(-math.inf, ValueType.FLOAT32),
      "views": NULL}, _ts(NOW_S - 1, 123_000_000), None),
    ({"rate": encode_value(math.inf, ValueType.FLOAT64)}, _ts(NOW_S - 7200), _ts(12, 1)),  # stale activity
    ({}, None, None),  # the entity is unknown
])
def test_one_row_answer_is_the_general_answer_byte_for_byte(values, activity_ts, forever_ts, full, monkeypatch):
    monkeypatch.setattr("time.time", lambda: NOW_S)
    features = [f"activity:{name}" for name in KINDS] + ["forever:name"] if full else \
        [f"activity:{name}" for name in KINDS if name != "name"] + ["forever:name"]
    plan = build_plan(_catalog(), features, full)
    replies = [[*_reply(values, activity_ts, forever_ts)]]
    if not full:  # `activity:name` is not requested: drop its field from the reply
        del replies[0][list(KINDS).index("name")]
    request = PreparedRequest(plan, {"asset_id": ["asset_1"]})
    written, views = request.answer_json(replies)
    general = request.finish(replies)
    assert written == orjson.dumps(general.to_feast_response())
    assert {name: (rows.missing, rows.stale) for name, rows in views.items()} == \
        {name: (rows.missing, rows.stale) for name, rows in general.views.items()}
    assert request.answer_json(replies)[0] == written  # a second time, from the remembered texts


def test_many_rows_take_the_general_path():
    plan = build_plan(_catalog(), ["activity:views"])
    assert PreparedRequest(plan, {"asset_id": ["a", "b"]}).answer_json([[None, None], [None, None]]) is None
