"""Every validation error names the object and the fix."""

from __future__ import annotations

import pytest

from dsl import (Aggregation, Attribute, DuplicateNameError, Entity, EventSource, FeatureLogging, FeatureService,
                 FeatureView, Float64, Int64, MissingTimestampError, Repository, String, Timestamp, TypeMismatchError,
                 UnknownColumnError, UnknownReferenceError, WindowError, col)
from dsl.errors import DefinitionError

ASSET = Entity("asset", join_keys={"asset_id": String})
SCHEMA = {"asset_id": String, "user_id": String, "event_type": String, "dwell_ms": Int64, "score": Float64,
          "event_time": Timestamp}
EVENTS = EventSource("events", SCHEMA, timestamp_field="event_time", kafka_topic="events", path="events")


def view(*features, **kwargs) -> FeatureView:
    return FeatureView(name=kwargs.pop("name", "activity"), entity=kwargs.pop("entity", ASSET),
                       source=kwargs.pop("source", EVENTS), features=list(features), **kwargs)


def test_valid_view_builds_and_names_features():
    v = view(Aggregation("count", windows=["1h", "24h"], filter=col("event_type") == "view", name="views"),
             Aggregation("mean", "dwell_ms", windows=["1h"]), Attribute("user_id", name="last_seen_user"))
    assert v.feature_names == ["views_1h", "views_24h", "dwell_ms_mean_1h", "last_seen_user"]
    assert v.output_schema()["dwell_ms_mean_1h"] is Float64
    assert v.output_schema()["views_24h"] is Int64


def test_unknown_column_in_aggregation():
    with pytest.raises(UnknownColumnError, match=r"feature view `activity`, aggregation `dwel_ms_sum`: "
                                                 r"unknown column `dwel_ms`.*use one of: asset_id"):
        view(Aggregation("sum", "dwel_ms", windows=["1h"]))


def test_unknown_column_in_filter():
    with pytest.raises(UnknownColumnError, match=r"filter uses unknown column `kind`.*event_type"):
        view(Aggregation("count", windows=["1h"], filter=col("kind") == "view", name="views"))


def test_unknown_column_in_attribute():
    with pytest.raises(UnknownColumnError, match=r"unknown column `colour`"):
        view(Attribute("colour"))


def test_sum_over_string_is_a_type_mismatch():
    with pytest.raises(TypeMismatchError, match=r"`sum` over string column `event_type`.*use a numeric column"):
        view(Aggregation("sum", "event_type", windows=["1h"]))


def test_mean_over_string_is_a_type_mismatch():
    with pytest.raises(TypeMismatchError, match=r"`mean` over string column `user_id`"):
        view(Aggregation("mean", "user_id", windows=["1h"]))


def test_filter_literal_of_wrong_type():
    with pytest.raises(TypeMismatchError, match=r"filter compares int64 column `dwell_ms` with str '10'"):
        view(Aggregation("count", windows=["1h"], filter=col("dwell_ms") > "10", name="long"))


def test_join_key_type_mismatch():
    other = Entity("asset", join_keys={"asset_id": Int64})
    with pytest.raises(TypeMismatchError, match=r"join key `asset_id` is int64 in entity `asset` but string"):
        view(Aggregation("count", windows=["1h"]), entity=other)


def test_join_key_missing_from_source():
    other = Entity("creator", join_keys={"creator_id": String})
    with pytest.raises(UnknownColumnError, match=r"join key `creator_id` of entity `creator` is not a column"):
        view(Aggregation("count", windows=["1h"]), entity=other)


def test_window_smaller_than_tile():
    with pytest.raises(WindowError, match=r"window `10m` is shorter than the view's tile \(1h\).*smaller tile"):
        view(Aggregation("count", windows=["10m"]), tile="1h")


def test_window_not_a_multiple_of_tile():
    with pytest.raises(WindowError, match=r"window `90m` is not a whole number of tiles \(1h\)"):
        view(Aggregation("count", windows=["90m"]), tile="1h")


@pytest.mark.parametrize("ttl", ["90m", "30m"])
def test_attribute_ttl_not_a_multiple_of_tile(ttl):
    with pytest.raises(WindowError, match=rf"ttl {ttl} is not a whole number of tiles \(1h\).*ttl=\"7d\""):
        view(Attribute("user_id"), tile="1h", ttl=ttl)


def test_ttl_needs_no_whole_tiles_without_attributes():
    assert view(Aggregation("count", windows=["1h"]), tile="1h", ttl="90m").ttl.total_seconds() == 5400


def test_malformed_window():
    with pytest.raises(WindowError, match=r"`1 hour` is not a duration.*e.g. `10m`, `1h`, `24h`, `7d`"):
        Aggregation("count", windows=["1 hour"])


def test_duplicate_feature_names_in_view():
    with pytest.raises(DuplicateNameError, match=r"feature name `views_1h` is used twice"):
        view(Aggregation("count", windows=["1h"], name="views"),
             Aggregation("count", windows=["1h"], filter=col("event_type") == "view", name="views"))


def test_a_feature_named_like_a_join_key_says_so():
    with pytest.raises(DuplicateNameError, match=r"feature name `asset_id` is a join key of entity `asset`.*another "
                                                  r"name"):
        view(Attribute("asset_id"))


def test_duplicate_windows():
    with pytest.raises(DuplicateNameError, match=r"windows `60m` and `1h` are the same length"):
        Aggregation("count", windows=["60m", "1h"])


def test_duplicate_view_names_in_repo():
    a = view(Aggregation("count", windows=["1h"]))
    b = view(Aggregation("count", windows=["24h"]))
    with pytest.raises(DuplicateNameError, match=r"feature view `activity`: is defined twice"):
        Repository.of([a, b])


def test_service_with_unknown_feature():
    v = view(Aggregation("count", windows=["1h"], name="views"))
    service = FeatureService("ranking", features=["activity:views_24h"])
    with pytest.raises(UnknownReferenceError, match=r"feature service `ranking`: names unknown feature "
                                                  r"`activity:views_24h`; `activity` has: views_1h"):
        Repository.of([v, service])


def test_service_with_unknown_view():
    v = view(Aggregation("count", windows=["1h"], name="views"))
    with pytest.raises(UnknownReferenceError, match=r"names unknown feature view `clicks`"):
        Repository.of([v, FeatureService("ranking", features=["clicks:views_1h"])])


def test_projection_of_unknown_feature_fails_eagerly():
    v = view(Aggregation("count", windows=["1h"], name="views"))
    with pytest.raises(UnknownReferenceError, match=r"has no feature likes_1h; pick from: views_1h"):
        v[["likes_1h"]]


def test_source_without_timestamp():
    with pytest.raises(MissingTimestampError, match=r"source `events`: has no timestamp_field.*event_time"):
        EventSource("events", SCHEMA, timestamp_field=None, kafka_topic="events")


def test_source_timestamp_not_in_schema():
    with pytest.raises(MissingTimestampError, match=r"timestamp_field `ts` is not in the schema"):
        EventSource("events", SCHEMA, timestamp_field="ts", kafka_topic="events")


def test_source_timestamp_of_wrong_type():
    with pytest.raises(TypeMismatchError, match=r"timestamp_field `dwell_ms` has type int64"):
        EventSource("events", SCHEMA, timestamp_field="dwell_ms", kafka_topic="events")


def test_source_needs_a_location():
    with pytest.raises(DefinitionError, match=r"has neither kafka_topic nor path"):
        EventSource("events", SCHEMA, timestamp_field="event_time")


def test_unknown_op_lists_valid_ones():
    with pytest.raises(DefinitionError, match=r"unknown op `median`; use one of: count, sum, mean"):
        Aggregation("median", "dwell_ms", windows=["1h"])


def test_op_without_column():
    with pytest.raises(DefinitionError, match=r"`max` needs a column"):
        Aggregation("max", windows=["1h"])


def test_example_repo_loads():
    from pathlib import Path

    from dsl import load_repo

    repo = load_repo(Path(__file__).resolve().parents[2] / "feature_repo")
    assert {v.name for v in repo.views} == {"asset_activity", "asset_attributes", "user_activity", "asset_geometry"}
    assert {s.name for s in repo.services} == {"asset_ranking", "cube3d_conditioning"}


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, float("nan"), float("inf"), True, "0.1", None])
def test_feature_logging_takes_a_fraction_of_requests(rate):
    with pytest.raises(DefinitionError, match=r"feature logging: sample_rate `.*` is not a fraction of requests; "
                                              r"give a number in \(0, 1\]"):
        FeatureLogging(sample_rate=rate)


def test_feature_service_logging_must_be_feature_logging():
    assert FeatureLogging(sample_rate=1).sample_rate == 1.0
    with pytest.raises(DefinitionError, match=r"feature service `ranking`: logging must be a FeatureLogging, got "
                                              r"float; write logging=FeatureLogging\(sample_rate=0.1\)"):
        FeatureService("ranking", features=["activity:views_24h"], logging=0.1)


def test_the_ttl_is_in_the_version_of_a_view_with_attributes_only():
    """An Attribute is `last` over the ttl, so the ttl changes its values; aggregations' windows do not read it."""
    from dsl.compile_flink import SourceSettings, compile_view
    from dsl.view_version import view_version

    def version(*features, ttl: str) -> str:
        v = view(*features, tile="1h", ttl=ttl)
        return view_version(v, compile_view(v, SourceSettings("", "/data")))

    counted = Aggregation("count", windows=["1h"])
    assert version(counted, ttl="7d") == version(counted, ttl="8d")
    assert version(counted, Attribute("user_id"), ttl="7d") != version(counted, Attribute("user_id"), ttl="8d")


def test_a_change_shows_an_empty_description_as_empty_quotes():
    from dsl.view_version import changes

    [added] = changes({"features": {}}, {"features": {"n": {"op": "count", "description": ""}}})
    assert str(added) == 'features.n: added (op count, description "")'
