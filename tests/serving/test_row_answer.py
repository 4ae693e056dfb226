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
    written, outcome = request.answer_json(replies)
    general = request.finish(replies)
    assert written == orjson.dumps(general.to_feast_response())
    assert outcome == _outcome(general)
    assert request.answer_json(replies)[0] == written  # a second time, from the remembered texts


def _outcome(general) -> tuple:
    """The one-row outcome the general path's views' rows mean: per view, 0 present, 1 missing, 2 stale."""
    return tuple((name, 1 if rows.missing else 2 if rows.stale else 0) for name, rows in general.views.items())


def test_many_rows_take_the_general_path():
    plan = build_plan(_catalog(), ["activity:views"])
    assert PreparedRequest(plan, {"asset_id": ["a", "b"]}).answer_json([[None, None], [None, None]]) is None


FLOATS = {"f1": ValueType.FLOAT64, "f2": ValueType.FLOAT64, "f3": ValueType.FLOAT64, "g1": ValueType.FLOAT32,
          "g2": ValueType.FLOAT32, "n": ValueType.INT64}


def _float_catalog() -> Catalog:
    """Floats of both widths in one view (3 and 2), and a second view of a shorter ttl with one float."""
    features = {name: FeatureSpec(name, kind, name.encode()) for name, kind in FLOATS.items()}
    join_keys = (("asset_id", ValueType.STRING),)
    views = {"wide": ViewSpec("wide", "wide", join_keys, features, 3_600_000, b"_ts:wide"),
             "short": ViewSpec("short", "short", join_keys, {"f1": features["f1"]}, 60_000, b"_ts:short")}
    return Catalog("proj", views, {}, version=1)


@pytest.mark.parametrize("wide", [
    {"f1": 0.1, "f2": -0.0, "f3": 1e300, "g1": 1.5, "g2": 3.4e38, "n": 5},
    {"f1": 5e-324, "f2": 2.0 ** 53, "f3": -7.25, "g1": 1e-45, "g2": -2.5, "n": None},
    {"f1": None, "f2": 1.0, "f3": math.nan, "g1": math.inf, "g2": None, "n": 0},  # nulls and non-finite values
    {"f1": b"\x35\x00\x00\xc0\x3f", "f2": 1.0, "f3": 1.0, "g1": b"\x29" + bytes(8), "g2": 2.0, "n": 1},  # as stored
])
# no row, within its ttl, at its edge (kept), a millisecond past it, long past it
@pytest.mark.parametrize("short_ts", [None, _ts(NOW_S - 10), _ts(NOW_S - 60), _ts(NOW_S - 61, 999_000_000),
                                      _ts(NOW_S - 120)])
def test_floats_of_a_row_are_the_general_answer_byte_for_byte(wide, short_ts, monkeypatch):
    """Floats printed together (one unpack, one dumps per type) or, for any value not plain, one by one: the bytes
    of the general path either way; stored bytes of another width or type are decoded as stored. The same stored
    event time serves two views of different ttls."""
    monkeypatch.setattr("time.time", lambda: NOW_S)
    plan = build_plan(_float_catalog(), [*(f"wide:{name}" for name in FLOATS), "short:f1"], True)
    stored = [value if isinstance(value, bytes) else encode_value(value, FLOATS[name]) if value is not None
              else NULL for name, value in wide.items()]
    replies = [[*stored, _ts(NOW_S - 10), encode_value(wide["f3"], ValueType.FLOAT64), short_ts]]
    request = PreparedRequest(plan, {"asset_id": ["asset_1"]})
    for _ in range(2):  # the second time from the remembered event times
        written, outcome = request.answer_json(replies)
        general = request.finish(replies)
        assert written == orjson.dumps(general.to_feast_response())
        assert outcome == _outcome(general)
