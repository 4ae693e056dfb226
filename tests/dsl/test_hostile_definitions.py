"""Hostile definitions: names, topics, literals and durations that once reached SQL, Feast or Python's own limits
are refused eagerly with a one-line DefinitionError naming the object and field; what may pass (odd source
columns, any string in SQL) stays one identifier or one literal for Flink's own parser."""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import reduce
from operator import or_
from pathlib import Path

import pytest

from cli_helpers import copy_example_repo, featurectl
from common.flink import pin_planner
from dsl import (Aggregation, Attribute, Entity, EventSource, FeatureService, FeatureView, Float64, String,
                 Timestamp, col, load_repo)
from dsl.compile_flink import FROM_COMMITTED_OR_EARLIEST, SourceSettings, compile_view
from dsl.duration import MAX_DAYS
from dsl.errors import DefinitionError, WindowError
from dsl.sql import create_table, quote_ident
from streaming.job_sql import plan_job

HOSTILE_COLUMN = "x' VALUE 1) FROM t; DROP TABLE y; --"
HOSTILE_TOPIC = "t', 'scan.startup.mode' = 'latest-offset"
NAME_RULE = "use ASCII letters, digits and _, starting with a letter, at most 64 characters"
NO_TRUTH = "has no truth value"
AND_OR_NOT = "combine conditions with `&`, `|` and `~`, each in parentheses"

ASSET = Entity("asset", join_keys={"asset_id": String})
SCHEMA = {"asset_id": String, "score": Float64, "event_type": String, "event_time": Timestamp}


def source(**kwargs) -> EventSource:
    return EventSource(**{"name": "events", "schema": SCHEMA, "timestamp_field": "event_time",
                          "kafka_topic": "events", "path": "events", **kwargs})


def view(*features, **kwargs) -> FeatureView:
    return FeatureView(**{"name": "activity", "entity": ASSET, "source": source(),
                          "features": list(features) or [Aggregation("count", windows=["1h"])], **kwargs})


def _if(expr):
    """Python's `if` on an expression."""
    if expr:
        return expr


CASES = {
    # SQL injection: a topic is refused, a column may be odd but its default feature name may not
    "hostile topic": (lambda: source(kafka_topic=HOSTILE_TOPIC),
                      [f"source `events`: kafka_topic `{HOSTILE_TOPIC}` is not a Kafka topic name",
                       "at most 236 characters"]),
    "topic too long": (lambda: source(kafka_topic="t" * 237), ["is not a Kafka topic name"]),
    "topic ..": (lambda: source(kafka_topic=".."), ["kafka_topic `..` is not a Kafka topic name"]),
    "hostile column as a default feature name": (
        lambda: view(Aggregation("count", HOSTILE_COLUMN, windows=["1h"]),
                     source=source(schema={**SCHEMA, HOSTILE_COLUMN: String})),
        [f"feature name `{HOSTILE_COLUMN}_count_1h` is not allowed", NAME_RULE,
         'or give the feature a name="..." that does']),
    "column with a line break": (lambda: source(schema={**SCHEMA, "a\nb": String}),
                                 ["column `a\\nb` cannot be a column name: it holds a line break"]),
    "empty column": (lambda: source(schema={**SCHEMA, "": String}), ["column `` cannot be a column name: it is empty"]),
    "column too long": (lambda: source(schema={**SCHEMA, "c" * 257: String}), ["more than Flink's 256"]),
    "reserved column prefix": (lambda: source(schema={**SCHEMA, "__payload": String}),
                               ["column `__payload` uses a reserved name", "names starting with `__`"]),
    "path with a NUL": (lambda: source(path="a\x00b"), ["path `a\\x00b` is not a printable str"]),
    "col with a line break": (lambda: col("a\nb"), ["col(`a\\nb`): is not a column name"]),
    # literals SQL cannot hold
    "nan": (lambda: col("score") > float("nan"), ["filter literal `nan`: NaN and infinities cannot be compared"]),
    "inf": (lambda: col("score") < float("inf"), ["filter literal `inf`: NaN and infinities"]),
    "-inf": (lambda: col("score").isin([float("-inf")]), ["filter literal `-inf`: NaN and infinities"]),
    "beyond BIGINT": (lambda: col("score") > 2**63, ["is beyond the range of a 64-bit integer"]),
    "None": (lambda: col("score") == None, ["filter literal `None`: has type NoneType", ".is_null()"]),  # noqa: E711
    "lone surrogate": (lambda: col("event_type") == "\ud800", ["is not valid Unicode"]),
    # Python's boolean operators on expressions
    "and": (lambda: (col("score") > 1) and (col("score") < 2), ["filter `score` > 1: " + NO_TRUTH, AND_OR_NOT]),
    "or": (lambda: (col("score") > 1) or (col("score") < 2), [NO_TRUTH, AND_OR_NOT]),
    "not": (lambda: not col("score").is_null(), ["filter `score` IS NULL: " + NO_TRUTH]),
    "if": (lambda: _if(col("event_type") == "view"), [NO_TRUTH]),
    "chained comparison": (lambda: 0 < col("score") < 1, [NO_TRUTH, "chained comparisons"]),
    # names that become Feast names and Redis keys
    "empty feature name": (lambda: Aggregation("count", windows=["1h"], name=""),
                           ["aggregation ``: name `` is not allowed", NAME_RULE]),
    "feature name with a colon": (lambda: Aggregation("count", windows=["1h"], name="a:b"),
                                  ["aggregation `a:b`: name `a:b` is not allowed"]),
    "feature name with a line break": (lambda: Attribute("score", name="a\nb"),
                                       ["attribute `score`: name `a\\nb` is not allowed"]),
    "empty attribute name": (lambda: Attribute("score", name=""), ["name `` is not allowed"]),
    "feature name too long": (lambda: Aggregation("count", windows=["1h"], name="n" * 62),
                              [f"feature name `{'n' * 62}_1h` is not allowed"]),
    "reserved feature name": (lambda: view(Attribute("score", name="event_timestamp")),
                              ["feature name `event_timestamp` is reserved"]),
    "view name with a colon": (lambda: view(name="a:b"), ["feature view `a:b`: name `a:b` is not allowed"]),
    "empty entity name": (lambda: Entity("", join_keys={"asset_id": String}), ["entity ``: name `` is not allowed"]),
    "join key with a space": (lambda: Entity("asset", join_keys={"asset id": String}),
                              ["join key `asset id` is not allowed"]),
    "source name with a line break": (lambda: source(name="a\nb"), ["source `a\\nb`: name `a\\nb` is not allowed"]),
    "service name with unicode": (lambda: FeatureService("é", features=["activity:count_1h"]),
                                  ["feature service `é`: name `é` is not allowed"]),
    "long name cut short": (lambda: Entity("x" * 10_000, join_keys={"asset_id": String}),
                            [f"entity `{'x' * 80}...`"]),
}
DURATIONS = {
    "window": (lambda d: Aggregation("count", windows=[d]), "aggregation `count` window"),
    "ttl": (lambda d: view(ttl=d), "feature view `activity` ttl"),
    "tile": (lambda d: view(tile=d), "feature view `activity` tile"),
    "watermark delay": (lambda d: source(watermark_delay=d), "source `events` watermark_delay"),
    "allowed lateness": (lambda d: source(allowed_lateness=d), "source `events` allowed_lateness"),
}


def refused(build, fragments: list[str], error: type = DefinitionError) -> None:
    with pytest.raises(error) as caught:
        build()
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_definition_is_refused_with_the_rule(case):
    refused(*CASES[case])


@pytest.mark.parametrize("field", DURATIONS)
@pytest.mark.parametrize("duration", ["99999999999d", timedelta(days=99_999_999), "9" * 5000 + "s", "36501d"])
def test_a_duration_past_100_years_names_the_object_and_field(field, duration):
    build, where = DURATIONS[field]
    refused(lambda: build(duration), [f"{where}: `", "is longer than 36500d (100 years)"], WindowError)


@pytest.mark.parametrize("duration", [timedelta(seconds=-5), timedelta(milliseconds=1500)])
def test_a_negative_or_fractional_timedelta_is_not_a_duration(duration):
    refused(lambda: view(ttl=duration), ["feature view `activity` ttl", "is not a duration",
                                         "a timedelta of whole seconds"], WindowError)


def test_100_years_is_the_longest_duration():
    assert view(ttl="36500d", tile="36500d", features=[Aggregation("count", windows=[timedelta(days=36500)])])


def test_a_number_too_large_for_python_names_the_file_and_line(tmp_path):
    (tmp_path / "features.py").write_text("from datetime import timedelta\n\nTTL = timedelta(days=99999999999)\n")
    refused(lambda: load_repo(tmp_path), ["feature repo file features.py, line 3: a number is too large",
                                          "durations are at most 36500d (100 years)"])


# Flink's own parser: odd columns stay one identifier each, and no string can add an option.

ODD_COLUMNS = [HOSTILE_COLUMN, "a`b", "``", "it's", 'say "hi"', "semi;colon", "-- no comment", "/* nor this */",
               "é 名", "select", "c" * 256]
ODD_STRINGS = [HOSTILE_TOPIC, "a'b", "''", "line\nbreak", "nul\x00", "back\\slash\\", "é 名 😀", ""]
ODD_SETTINGS = SourceSettings(f"b:1{HOSTILE_TOPIC}", Path("/tmp/it's', 'format' = 'csv"), f"group{HOSTILE_TOPIC}")


def odd_view() -> FeatureView:
    """A view over every odd column, filtered by every odd string, named afresh (tests share one Flink env)."""
    name = f"odd_{uuid.uuid4().hex[:8]}"
    schema = {"asset_id": String, **{c: String for c in ODD_COLUMNS}, "event_time": Timestamp}
    events = EventSource(name, schema, timestamp_field="event_time", kafka_topic=name, path=f"{name}/it's",
                         watermark_delay=timedelta(days=MAX_DAYS, seconds=-1))  # past an INT of seconds
    hostile = reduce(or_, [col(HOSTILE_COLUMN) == s for s in ODD_STRINGS])
    features = [Attribute(c, name=f"attr_{i}") for i, c in enumerate(ODD_COLUMNS)]
    return FeatureView(name, ASSET, events, [*features, Aggregation("approx_distinct", HOSTILE_COLUMN, ["1h"],
                                                                      filter=hostile, name="hostile")])


def columns(env, relation: str) -> list[str]:
    return list(env.from_path(quote_ident(relation)).get_resolved_schema().get_column_names())


def options(env, table: str) -> dict[str, str]:
    """The options Flink's catalog holds for a temporary table (PyFlink has no getter, hence the Java call)."""
    from pyflink.java_gateway import get_gateway

    ident = get_gateway().jvm.org.apache.flink.table.catalog.ObjectIdentifier.of(
        env.get_current_catalog(), env.get_current_database(), table)
    return dict(env._j_tenv.getCatalogManager().getTable(ident).get().getResolvedTable().getOptions())


@pytest.mark.integration
def test_any_name_and_string_read_back_from_flink_as_themselves(flink_env):
    table = f"{HOSTILE_COLUMN} {uuid.uuid4().hex[:8]}"
    wanted = {"connector": "datagen", HOSTILE_TOPIC: "key", **{f"k{i}": s for i, s in enumerate(ODD_STRINGS)}}
    flink_env.execute_sql(create_table(table, [f"{quote_ident(c)} STRING" for c in ODD_COLUMNS], wanted))
    assert columns(flink_env, table) == ODD_COLUMNS
    assert options(flink_env, table) == wanted


@pytest.mark.integration
def test_odd_columns_stay_one_identifier_each_in_the_streaming_sql(flink_env):
    view = odd_view()
    compiled = compile_view(view, ODD_SETTINGS)
    *ddl, query = compiled.statements("streaming")
    for statement in ddl:
        flink_env.execute_sql(statement)
    pin_planner(flink_env)
    flink_env.explain_sql(query)
    flink_env.explain_sql(compiled.streaming_source.dead_letter_query)
    assert columns(flink_env, view.name) == [*view.source.schema, "__rowtime"]
    assert list(flink_env.sql_query(query).get_resolved_schema().get_column_names()) == [
        "asset_id", "tile_start", *(c.name for c in compiled.tile_columns)]
    assert options(flink_env, f"{view.name}__kafka") == {
        "connector": "kafka", "topic": view.name, "properties.bootstrap.servers": ODD_SETTINGS.bootstrap_servers,
        "properties.group.id": ODD_SETTINGS.consumer_group, **FROM_COMMITTED_OR_EARLIEST, "format": "raw"}


@pytest.mark.integration
def test_odd_columns_paths_and_a_100_year_watermark_stay_whole_in_the_batch_source(flink_env):
    view = odd_view()
    compiled = compile_view(view, ODD_SETTINGS)
    assert "INTERVAL '36499 23:59:59' DAY(5) TO SECOND" in compiled.batch_source_ddl
    flink_env.execute_sql(compiled.batch_source_ddl)
    assert columns(flink_env, view.name) == [*view.source.schema, "__rowtime"]
    path = (ODD_SETTINGS.data_dir / view.source.path).as_uri()
    assert options(flink_env, view.name) == {"connector": "filesystem", "path": path, "format": "parquet"}


@pytest.mark.integration
def test_the_streaming_jobs_sinks_keep_their_options(flink_env):
    view = odd_view()
    plan = plan_job("p", [view], [view], ODD_SETTINGS, {})
    for statement in plan.ddl():
        flink_env.execute_sql(statement)
    tiles = options(flink_env, plan.views[0].sink)
    assert tiles["topic"] == plan.views[0].tiles_topic and tiles["connector"] == "upsert-kafka"
    assert tiles["properties.bootstrap.servers"] == ODD_SETTINGS.bootstrap_servers
    assert columns(flink_env, plan.views[0].sink) == ["asset_id", "tile_start",
                                                      *(c.name for c in plan.views[0].compiled.tile_columns)]
    assert options(flink_env, plan.sources[0].sink)["topic"] == f"{view.name}.dead-letters"


# The CLI: a hostile definition is one error line and a non-zero exit for `plan` and `apply`.

HOSTILE_LINES = {
    "topic": (f"EventSource('hostile', {{'id': String, 'ts': Timestamp}}, 'ts', kafka_topic={HOSTILE_TOPIC!r})",
              "kafka_topic `t', 'scan.startup.mode'"),
    "nan": ("col('dwell_ms') > float('nan')", "filter literal `nan`"),
    "and": ("(col('dwell_ms') > 1) and (col('dwell_ms') < 9)", "has no truth value"),
    "feature name": ("Attribute('style', name='a:b')", "name `a:b` is not allowed"),
    "window": ("Aggregation('count', windows=['99999999999d'])", "`99999999999d` is longer than 36500d"),
    "timedelta": ("__import__('datetime').timedelta(days=99999999999)", "line {line}: a number is too large"),
}


@pytest.mark.parametrize("case", HOSTILE_LINES)
def test_plan_and_apply_refuse_a_hostile_definition_in_one_line(tmp_path, case):
    line, fragment = HOSTILE_LINES[case]
    repo = copy_example_repo(tmp_path, "hostile", {"path": f"sqlite:///{tmp_path / 'registry.db'}"})
    features = repo / "features.py"
    fragment = fragment.format(line=len(features.read_text().splitlines()) + 2)
    features.write_text(f"{features.read_text()}\nhostile = {line}\n")
    for command in ("plan", "apply"):
        done = featurectl("--repo", str(repo), command)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        errors = [e for e in done.stderr.splitlines() if e.startswith("Error: ")]
        assert len(errors) == 1 and fragment in errors[0], done.stderr
