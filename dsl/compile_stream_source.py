"""DSL -> Flink SQL: the streaming relation of an event source and its dead letters. Every event is either on
time (it reaches the tile queries) or a dead letter with a reason, decided once and the same way after a restart.

Why not Flink's watermarks (`CURRENT_WATERMARK`): with mini-batches on, Flink puts a processing-time
MiniBatchAssigner right after the source, which swallows the source's watermarks and emits wall-clock marks
instead, so `CURRENT_WATERMARK` returns the wall clock and a replay of older events is dropped whole; and they
restart from nothing after a recovery. Here the watermark is computed in SQL instead, per Kafka partition, from
the events themselves:

- `{source}__kafka` reads the topic's JSON leniently: every column as text, so a value of the wrong type is seen
  (and dead-lettered) rather than turned into NULL; malformed documents are skipped by the format.
- `{source}__checked` casts each column once, classifies each event (`missing_field:c`, `wrong_type:c`, keeping
  its fields as read when it has a problem) and carries the greatest event time of the valid events so far in its
  partition (a running MAX in keyed, checkpointed state, in log order). The watermark of an event is that maximum
  minus `watermark_delay`; the event is late when it is more than `allowed_lateness` behind it. The decision is a
  function of the partition's log, so a replay from a checkpoint repeats it exactly.
- `{source}` (the relation the compiled tile queries read) keeps the valid, on-time events, typed.
- the dead-letter query is the complement: errors, late events, and (from `{source}__raw`, the same topic read
  as bytes) the payloads that are not a JSON object, which the JSON format skips.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from dsl.expr import quote_ident
from dsl.feature_view import FeatureView
from dsl.source import ROWTIME, EventSource
from dsl.types import ValueType

KAFKA_SUFFIX = "__kafka"
RAW_SUFFIX = "__raw"
RAW_GROUP_SUFFIX = "-raw"  # the raw read of a topic commits its offsets under a group of its own
CHECKED_SUFFIX = "__checked"
ERROR = "__error"
MAX_SEEN = "__max_seen"
PAYLOAD = "__payload"
PARTITION = "__partition"
OFFSET = "__offset"
PROCTIME = "__proctime"

MALFORMED = "malformed_json"
LATE = "late"
FUTURE = "future"
RECORD_TIME = "__record_time"
# An event time further ahead of its Kafka record's timestamp is refused: counted, it would move the partition's
# watermark past every later event (all of them late) and the clock past any calendar.
MAX_AHEAD_MS = 3_600_000
DEAD_PAYLOAD_CHARS = 16_384  # a dead letter keeps the payload's start: a whole one may outgrow Kafka's record limit

# Columns of a dead letter, in order (the sink table and both branches of the dead-letter query).
DEAD_LETTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reason", "STRING"), ("source", "STRING"), ("kafka_partition", "INT"), ("kafka_offset", "BIGINT"),
    ("event_time", "BIGINT"), ("payload", "STRING"),
)


@dataclass(frozen=True)
class KafkaRead:
    """How a job reads a source topic: brokers, consumer group and where a job without a checkpoint starts."""

    bootstrap_servers: str
    group_id: str
    startup: Mapping[str, str]  # e.g. {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "..."}


@dataclass(frozen=True)
class SourceRelation:
    """DDL in execution order (tables, then views) and the SELECT of the source's dead letters."""

    ddl: tuple[str, ...]
    dead_letter_query: str


def create_table(name: str, columns: Sequence[str], options: Mapping[str, str]) -> str:
    """`CREATE TEMPORARY TABLE name (columns) WITH (options)`, the one shape of every table we declare."""
    body = ",\n  ".join(columns)
    with_ = ",\n".join(f"  '{k}' = '{v}'" for k, v in options.items())
    return f"CREATE TEMPORARY TABLE {quote_ident(name)} (\n  {body}\n) WITH (\n{with_}\n)"


def _kafka_options(source: EventSource, read: KafkaRead, group_suffix: str) -> dict[str, str]:
    return {
        "connector": "kafka",
        "topic": source.kafka_topic or source.name,
        "properties.bootstrap.servers": read.bootstrap_servers,
        "properties.group.id": read.group_id + group_suffix,
        **read.startup,
    }


def _metadata_columns() -> list[str]:
    return [f"{quote_ident(PARTITION)} INT METADATA FROM 'partition' VIRTUAL",
            f"{quote_ident(OFFSET)} BIGINT METADATA FROM 'offset' VIRTUAL"]


def kafka_table_ddl(source: EventSource, read: KafkaRead) -> str:
    """The topic as JSON with every column read as text (a JSON number or object keeps its text)."""
    columns = [f"{quote_ident(name)} STRING" for name in source.schema]
    columns += [*_metadata_columns(), f"{quote_ident(RECORD_TIME)} TIMESTAMP_LTZ(3) METADATA FROM 'timestamp'",
                f"{quote_ident(PROCTIME)} AS PROCTIME()"]
    options = {**_kafka_options(source, read, ""), "format": "json", "json.fail-on-missing-field": "false",
               "json.ignore-parse-errors": "true"}
    return create_table(source.name + KAFKA_SUFFIX, columns, options)


def raw_table_ddl(source: EventSource, read: KafkaRead) -> str:
    """The same topic as raw text, for the payloads the JSON format cannot read."""
    options = {**_kafka_options(source, read, RAW_GROUP_SUFFIX), "format": "raw"}
    return create_table(source.name + RAW_SUFFIX, ["`payload` STRING", *_metadata_columns()], options)


def _typed(name: str, kind: ValueType) -> str:
    """The typed value of a text column; NULL when absent or not of the type."""
    column = quote_ident(name)
    return column if kind is ValueType.STRING else f"TRY_CAST({column} AS {kind.flink_sql})"


def source_keys(source: EventSource, views: Sequence[FeatureView]) -> tuple[str, ...]:
    """Join keys an event of `source` must carry: those of every view (of a repo) that reads it, so that which
    views one job streams never changes which events count."""
    keys = [k for v in views if v.source.name == source.name for k in v.entity.join_keys]
    return tuple(dict.fromkeys(keys))


def required_columns(source: EventSource, key_columns: Sequence[str]) -> list[str]:
    """Columns an event cannot do without: the join keys given (those of every view reading the source), then the
    event time."""
    return [*dict.fromkeys(key_columns), source.timestamp_field]


def error_sql(source: EventSource, key_columns: Sequence[str]) -> str:
    """The first problem of an event, or NULL: a missing required field, a value of the wrong type, then an event
    time more than `MAX_AHEAD_MS` ahead of its Kafka record's timestamp (taken to the minute)."""
    cases = [f"WHEN {quote_ident(c)} IS NULL THEN 'missing_field:{c}'" for c in required_columns(source, key_columns)]
    for name, kind in source.schema.items():
        if kind is not ValueType.STRING:
            cases.append(f"WHEN {quote_ident(name)} IS NOT NULL AND {_typed(name, kind)} IS NULL "
                         f"THEN 'wrong_type:{name}'")
    ts = _typed(source.timestamp_field, source.schema[source.timestamp_field])
    record_ms = f"CAST(TIMESTAMPDIFF(MINUTE, TO_TIMESTAMP_LTZ(0, 3), {quote_ident(RECORD_TIME)}) AS BIGINT) * 60000"
    cases.append(f"WHEN {ts} > {record_ms} + {MAX_AHEAD_MS} THEN '{FUTURE}'")  # integers: no calendar overflows
    return "CASE\n    " + "\n    ".join(cases) + "\n  END"


def lateness_ms(source: EventSource) -> int:
    """How far behind the partition's greatest event time an event may be and still count."""
    return int((source.watermark_delay + source.allowed_lateness).total_seconds() * 1000)


def _json_object(source: EventSource) -> str:
    fields = ", ".join(f"'{name}' VALUE {quote_ident(name)}" for name in source.schema)
    return f"JSON_OBJECT({fields} ABSENT ON NULL)"


def checked_view_ddl(source: EventSource, key_columns: Sequence[str]) -> str:
    """Typed columns (cast once), the first problem of the event, its fields as read when it has one, and the
    running maximum of valid event times in its partition."""
    typed = [f"{_typed(name, kind)} AS {quote_ident(name)}" for name, kind in source.schema.items()]
    inner = (f"SELECT\n  {', '.join(typed)},\n  {error_sql(source, key_columns)} AS {quote_ident(ERROR)},\n"
             f"  CASE WHEN {error_sql(source, key_columns)} IS NOT NULL THEN {_json_object(source)} END AS "
             f"{quote_ident(PAYLOAD)},\n  {quote_ident(PARTITION)}, {quote_ident(OFFSET)}, {quote_ident(PROCTIME)}\n"
             f"FROM {quote_ident(source.name + KAFKA_SUFFIX)}")
    ts = quote_ident(source.timestamp_field)
    running_max = (f"MAX(CASE WHEN {quote_ident(ERROR)} IS NULL THEN {ts} END) OVER (\n"
                   f"  PARTITION BY {quote_ident(PARTITION)} ORDER BY {quote_ident(PROCTIME)}\n"
                   f"  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS {quote_ident(MAX_SEEN)}")
    return (f"CREATE TEMPORARY VIEW {quote_ident(source.name + CHECKED_SUFFIX)} AS\n"
            f"SELECT *,\n{running_max}\nFROM (\n{inner}\n)")


def _on_time(source: EventSource) -> str:
    return f"{quote_ident(source.timestamp_field)} >= {quote_ident(MAX_SEEN)} - {lateness_ms(source)}"


def on_time_view_ddl(source: EventSource) -> str:
    """The relation the tile queries read: valid, on-time events, typed."""
    columns = [quote_ident(name) for name in source.schema]
    columns.append(f"TO_TIMESTAMP_LTZ({quote_ident(source.timestamp_field)}, 3) AS {quote_ident(ROWTIME)}")
    body = ",\n  ".join(columns)
    return (f"CREATE TEMPORARY VIEW {quote_ident(source.name)} AS\nSELECT\n  {body}\n"
            f"FROM {quote_ident(source.name + CHECKED_SUFFIX)}\n"
            f"WHERE {quote_ident(ERROR)} IS NULL AND {_on_time(source)}")


def dead_letter_query(source: EventSource) -> str:
    """Field errors (their fields as read) and late events (as typed), then payloads that are not JSON objects."""
    name = source.name.replace("'", "''")
    checked = (f"SELECT COALESCE({quote_ident(ERROR)}, '{LATE}'), '{name}', {quote_ident(PARTITION)}, "
               f"{quote_ident(OFFSET)}, {quote_ident(source.timestamp_field)}, "
               f"SUBSTRING(COALESCE({quote_ident(PAYLOAD)}, {_json_object(source)}) FROM 1 FOR {DEAD_PAYLOAD_CHARS})\n"
               f"FROM {quote_ident(source.name + CHECKED_SUFFIX)}\n"
               f"WHERE {quote_ident(ERROR)} IS NOT NULL OR NOT ({_on_time(source)})")
    # The JSON format also reads a document behind a byte order mark, so such a payload is not malformed.
    raw = (f"SELECT '{MALFORMED}', '{name}', {quote_ident(PARTITION)}, {quote_ident(OFFSET)}, "
           f"CAST(NULL AS BIGINT), SUBSTRING(`payload` FROM 1 FOR {DEAD_PAYLOAD_CHARS})\n"
           f"FROM {quote_ident(source.name + RAW_SUFFIX)}\n"
           f"WHERE NOT (TRIM(LEADING U&'\\FEFF' FROM `payload`) IS JSON OBJECT)")
    return f"{checked}\nUNION ALL\n{raw}"


def source_relation(source: EventSource, read: KafkaRead, key_columns: Sequence[str]) -> SourceRelation:
    """Everything a streaming job needs to read `source`: `key_columns` are the join keys of its views."""
    ddl = (kafka_table_ddl(source, read), raw_table_ddl(source, read), checked_view_ddl(source, key_columns),
           on_time_view_ddl(source))
    return SourceRelation(ddl, dead_letter_query(source))
