"""Property tests: any generated definition either compiles to SQL that Flink accepts, or is rejected with a
DefinitionError whose message names the object; never another exception."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from common.flink import pin_planner
from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, ValueType, col
from dsl.aggregates import OPS
from dsl.compile_flink import SourceSettings, compile_view
from dsl.errors import DefinitionError

NAMES = st.sampled_from(["a", "b", "user_id", "price", "kind", "qty", "x1"] * 12
                        + ["tile_start", "__rowtime", "event_timestamp"])
TYPES = st.sampled_from(list(ValueType))
WINDOWS = st.sampled_from(["1h", "2h", "24h", "7d"] * 8 + ["1m", "5m", "10m", "30s", "90m", "0m", "1 hour", "h1"])
LITERAL_OF = {ValueType.STRING: st.text(max_size=4), ValueType.BOOL: st.booleans(),
              ValueType.FLOAT32: st.floats(-2, 2, allow_nan=False, width=32),
              ValueType.FLOAT64: st.floats(-1e6, 1e6, allow_nan=False)}
ANY_LITERAL = st.one_of(st.integers(-5, 5), st.floats(-2, 2, allow_nan=False), st.text(max_size=4), st.booleans())


def usually(draw, good, bad):
    """The valid choice 85 % of the time, so that most examples get as far as Flink."""
    return draw(good if draw(st.integers(0, 99)) < 85 else bad)


@st.composite
def filters(draw, schema):
    name = draw(st.sampled_from(list(schema)))
    column = col(name)
    literal = usually(draw, LITERAL_OF.get(schema[name], st.integers(-5, 5)), ANY_LITERAL)
    kind = draw(st.sampled_from(["eq", "ne", "gt", "isin", "null", "and", "not"]))
    if kind == "eq":
        return column == literal
    if kind == "ne":
        return column != literal
    if kind == "gt":
        return column > literal
    if kind == "isin":
        return column.isin([literal])
    if kind == "null":
        return column.is_null()
    if kind == "and":
        return (column == literal) & col(draw(st.sampled_from(list(schema)))).not_null()
    return ~(column == literal)


@st.composite
def definitions(draw):
    schema = {"id": ValueType.STRING, "event_time": ValueType.TIMESTAMP,
              **draw(st.dictionaries(NAMES, TYPES, min_size=1, max_size=5))}
    columns = list(schema)
    key = usually(draw, st.just("id"), st.sampled_from(columns))
    timestamp = usually(draw, st.just("event_time"), st.sampled_from([*columns, None, "nope"]))
    features = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from([*OPS, "attribute"]))
        column = usually(draw, st.sampled_from(columns), st.sampled_from(["missing", None]))
        if op == "attribute":
            features.append((op, column or "missing", None, None))
            continue
        windows = draw(st.lists(WINDOWS, min_size=1, max_size=3))
        row_filter = draw(st.one_of(st.none(), filters(schema)))
        features.append((op, column, windows, row_filter))
    tile = draw(st.sampled_from(["1m", "5m", "1h"]))
    key_type = usually(draw, st.just(schema[key]), st.sampled_from([ValueType.STRING, ValueType.INT64]))
    return schema, key, key_type, timestamp, features, tile


def build(schema, key, key_type, timestamp, features, tile) -> FeatureView:
    entity = Entity("thing", join_keys={key: key_type})
    source = EventSource("events", schema, timestamp_field=timestamp, kafka_topic="events", path="events")
    built = []
    for i, (op, column, windows, row_filter) in enumerate(features):
        if op == "attribute":
            built.append(Attribute(column, name=f"attr_{i}"))
        else:
            built.append(Aggregation(op, column, windows, filter=row_filter, name=f"f{i}"))
    return FeatureView("things", entity, source, features=built, tile=tile)


@pytest.mark.integration
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(definitions())
def test_every_definition_compiles_to_accepted_sql_or_is_rejected_with_a_message(flink_env, definition):
    try:
        view = build(*definition)
    except DefinitionError as exc:
        assert str(exc).split(":")[0] and exc.problem, exc
        event("rejected with a message")
        return
    event("compiled and accepted by Flink")
    compiled = compile_view(view, SourceSettings("127.0.0.1:1", Path("/tmp/events")))
    suffix = uuid.uuid4().hex[:8]
    statements = [s.replace("`events", f"`events_{suffix}") for s in compiled.statements("streaming")]
    for ddl in statements[:-1]:
        flink_env.execute_sql(ddl)
    pin_planner(flink_env)
    flink_env.explain_sql(statements[-1])  # raises if Flink rejects the query
