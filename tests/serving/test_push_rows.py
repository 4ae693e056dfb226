"""Push requests and rows checked before anything is written, without services: the body's shape, each value
against its column's type (nothing cast), the row shapes the SDK takes, event times the stream can place."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from dsl.types import ValueType
from serving.errors import RequestError
from serving.push_request import parse_push_request
from serving.push_rows import MAX_ROWS, PushRowError, check_columns, check_event_times, columns_of

SCHEMA = {"asset_id": ValueType.STRING, "n": ValueType.INT32, "x": ValueType.FLOAT32, "ok": ValueType.BOOL,
          "t": ValueType.TIMESTAMP}
REQUIRED = {"asset_id": "a join key", "t": "its event time"}
WHAT = "source `s`"


@pytest.mark.parametrize("column, value, fragment", [
    ("asset_id", 3, "string takes a string, not int 3"),
    ("n", "42", "int32 takes an integer, not str '42'"),
    ("n", 12.5, "int32 takes an integer, not float 12.5"),
    ("n", True, "int32 takes an integer, not bool True"),
    ("n", 1 << 31, "out of the int32 range"),
    ("x", float("nan"), "nan is not a finite number"),
    ("x", 1e39, "out of the float32 range"),
    ("x", "1.5", "float32 takes a number"),
    ("ok", 1, "bool takes true or false, not int 1"),
    ("t", 1.7e12, "timestamp takes an integer (epoch milliseconds)"),
    ("t", None, "row 1, column `t`: no value, but source `s` needs one (its event time)"),
])
def test_a_value_not_of_its_columns_type_is_refused_with_its_row_and_column(column, value, fragment):
    columns = {"asset_id": ["a", "b"], "n": [1, 2], "x": [1, 2.5], "ok": [True, False], "t": [1, 2]}
    columns[column] = [columns[column][0], value]
    with pytest.raises(PushRowError, match="row 1, column") as caught:
        check_columns(columns, SCHEMA, REQUIRED, WHAT)
    assert fragment in str(caught.value)


def test_valid_rows_pass_and_absent_optional_values_are_null():
    assert check_columns({"asset_id": ["a", "b"], "t": [1, 2], "x": [None, 3]}, SCHEMA, REQUIRED, WHAT) == 2


@pytest.mark.parametrize("columns, needed, fragment", [
    ({"asset_id": ["a"], "t": [1], "y": [1]}, (), "source `s` has no column 'y'; its columns are `asset_id`, `n`"),
    ({"t": [1]}, (), "source `s` needs column `asset_id` (a join key)"),
    ({"asset_id": ["a"], "t": [1]}, ("n",), "needs every one of its columns, null where there is no value; "
                                           "missing: `n`"),
    ({"asset_id": ["a", "b"], "t": [1]}, (), "columns have different lengths ([1, 2])"),
    ({"asset_id": [], "t": []}, (), "nothing to push"),
    ({"asset_id": ["a"] * (MAX_ROWS + 1), "t": [1] * (MAX_ROWS + 1)}, (), f"at most {MAX_ROWS}"),
])
def test_rows_of_the_wrong_shape_are_refused(columns, needed, fragment):
    with pytest.raises(PushRowError) as caught:
        check_columns(columns, SCHEMA, REQUIRED, WHAT, needed)
    assert fragment in str(caught.value)


def test_the_sdk_takes_dicts_columns_and_dataframes_with_instants_as_epoch_ms():
    import numpy as np
    import pandas as pd

    at = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
    ms = 1767323045678
    assert columns_of([{"asset_id": "a", "t": at}, {"asset_id": "b", "n": 2}]) == \
        {"asset_id": ["a", "b"], "t": [ms, None], "n": [None, 2]}
    assert columns_of({"asset_id": np.array(["a"]), "t": [at.replace(tzinfo=None)]}) == {"asset_id": ["a"], "t": [ms]}
    frame = pd.DataFrame({"asset_id": ["a", "b"], "t": pd.to_datetime([ms, ms + 1], unit="ms", utc=True),
                          "n": pd.array([1, None], dtype="Int32"), "x": [np.nan, 1.5], "ok": [True, False]})
    columns = columns_of(frame)
    assert columns == {"asset_id": ["a", "b"], "t": [ms, ms + 1], "n": [1, None], "x": [None, 1.5],
                       "ok": [True, False]}
    assert check_columns(columns, SCHEMA, REQUIRED, WHAT) == 2
    with pytest.raises(PushRowError, match="a dict of columns"):
        columns_of("asset_id")
    with pytest.raises(PushRowError, match="column 'asset_id' must be a list"):
        columns_of({"asset_id": "a"})


def test_event_times_must_be_milliseconds_and_not_from_the_future():
    now = int(time.time() * 1000)
    check_event_times("t", [now, now + 3_600_000], now)
    with pytest.raises(PushRowError, match=r"row 1, column `t`: \d+ is before 1973-03-03 .* looks like seconds"):
        check_event_times("t", [now, now // 1000], now)
    with pytest.raises(PushRowError, match="row 0, column `t`: .* more than an hour ahead of now"):
        check_event_times("t", [now + 3_600_001], now)


@pytest.mark.parametrize("body, fragment", [
    (b"[1]", "must be a JSON object"),
    (b'{"push_source_name": "s"}', "`df` must be an object mapping each column to a list"),
    (b'{"push_source_name": "s", "df": {"a": 1}}', "`df` must be an object mapping each column to a list"),
    (b'{"df": {"a": [1]}}', "the push source (`push_source_name`) must be a non-empty string"),
    (b'{"push_source_name": "s", "df": {"a": [1]}, "to": "both"}', "`to` must be one of online, offline, "
                                                                  "online_and_offline; got 'both'"),
    (b'{"push_source_name": "s", "df": {"a": [1]}, "allow_registry_cache": "no"}', "must be true or false"),
    (b'{"push_source_name": "s", "df": {"a": [1]}, "mode": "online"}', "unknown field 'mode'"),
])
def test_push_bodies_of_the_wrong_shape_are_400s_naming_the_field(body, fragment):
    with pytest.raises(RequestError) as caught:
        parse_push_request(body)
    assert fragment in str(caught.value)


def test_feasts_push_request_shape_is_taken():
    body = (b'{"push_source_name": "asset_interactions", "df": {"asset_id": ["a"], "event_time": [1]}, '
            b'"to": "online_and_offline", "allow_registry_cache": false, "transform_on_write": true}')
    assert parse_push_request(body) == ("asset_interactions", {"asset_id": ["a"], "event_time": [1]},
                                        "online_and_offline")
    assert parse_push_request(b'{"push_source_name": "s", "df": {"a": [1]}}')[2] == "online"
