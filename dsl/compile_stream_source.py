"""DSL -> Flink SQL: the streaming relation of an event source and its dead letters. Every event is either on
time (it reaches the tile queries), before the source's cutover (history: counted from Parquet instead), or a
dead letter with a reason, decided once and the same way after a restart.

Why not Flink's watermarks (`CURRENT_WATERMARK`): with mini-batches on, Flink puts a processing-time
MiniBatchAssigner right after the source, which swallows the source's watermarks and emits wall-clock marks
instead, so `CURRENT_WATERMARK` returns the wall clock and a replay of older events is dropped whole; and they
restart from nothing after a recovery. Here the watermark is computed in SQL instead, per Kafka partition, from
the events themselves:

- `{source}__kafka` reads the topic once, each record's bytes as they are, with its partition and offset.
- `{source}__checked` parses each payload strictly (`PARSE_EVENT`, a Java table function: a value counts only
  when its JSON type is exactly the column's, so `12.5` or `"42"` for an integer column is `wrong_type:c`, never a
  cast), classifies each event (`malformed_json`, `missing_field:c`, `wrong_type:c`, `future`) and carries the
  greatest event time of the valid events so far in its partition (a running MAX in keyed, checkpointed state, in
  log order). The watermark of an event is that maximum minus `watermark_delay`; the event is late when it is
  more than `allowed_lateness` behind it. The decision is a function of the partition's log, so a replay from a
  checkpoint repeats it exactly.
- `{source}` (the relation the compiled tile queries read) keeps the valid, on-time events at or after the
  source's cutover, typed.
- the dead-letter query is the complement, less the valid events before the cutover, each with the original
  bytes of its payload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from dsl.duration import milliseconds
from dsl.feature_view import FeatureView
from dsl.source import ROWTIME, EventSource
from dsl.sql import create_table, quote_ident, quote_string

KAFKA_SUFFIX = "__kafka"
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
DEAD_PAYLOAD_BYTES = 16_384  # a dead letter keeps the payload's start: a whole one may outgrow Kafka's record limit

# Columns of a dead letter, in order (the sink table and the dead-letter query). `payload` is the payload's first
# bytes as text when they are UTF-8 (`payload_encoding` "utf-8"), else in base64 ("base64").
DEAD_LETTER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("reason", "STRING"), ("source", "STRING"), ("kafka_partition", "INT"), ("kafka_offset", "BIGINT"),
    ("event_time", "BIGINT"), ("payload", "STRING"), ("payload_encoding", "STRING"),
)


@dataclass(frozen=True)
class KafkaRead:
    """How a job reads a source topic: brokers, consumer group and where a job without a checkpoint starts."""

    bootstrap_servers: str
    group_id: str
    startup: Mapping[str, str]  # e.g. {"scan.startup.mode": "timestamp", "scan.startup.timestamp-millis": "..."}


@dataclass(frozen=True)
class SourceRelation:
    """DDL in execution order (the table, then views) and the SELECT of the source's dead letters."""

    ddl: tuple[str, ...]
    dead_letter_query: str


def kafka_table_ddl(source: EventSource, read: KafkaRead) -> str:
    """The topic as it is: each record's bytes, partition, offset and timestamp (one read serves every view)."""
    columns = [f"{quote_ident(PAYLOAD)} BYTES", f"{quote_ident(PARTITION)} INT METADATA FROM 'partition' VIRTUAL",
               f"{quote_ident(OFFSET)} BIGINT METADATA FROM 'offset' VIRTUAL",
               f"{quote_ident(RECORD_TIME)} TIMESTAMP_LTZ(3) METADATA FROM 'timestamp'",
               f"{quote_ident(PROCTIME)} AS PROCTIME()"]
    options = {"connector": "kafka", "topic": source.kafka_topic or source.name,
               "properties.bootstrap.servers": read.bootstrap_servers, "properties.group.id": read.group_id,
               **read.startup, "format": "raw"}
    return create_table(source.name + KAFKA_SUFFIX, columns, options)


def source_keys(source: EventSource, views: Sequence[FeatureView]) -> tuple[str, ...]:
    """Join keys an event of `source` must carry: those of every view (of a repo) that reads it, so that which
    views one job streams never changes which events count."""
    keys = [k for v in views if v.source.name == source.name for k in v.entity.join_keys]
    return tuple(dict.fromkeys(keys))


def required_columns(source: EventSource, key_columns: Sequence[str]) -> list[str]:
    """Columns an event cannot do without: the join keys given (those of every view reading the source), then the
    event time."""
    return [*dict.fromkeys(key_columns), source.timestamp_field]


def parse_spec(source: EventSource, key_columns: Sequence[str]) -> str:
    """The `PARSE_EVENT` spec of `source`: its columns with their SQL types, and the required ones in order."""
    columns = [[name, kind.flink_sql] for name, kind in source.schema.items()]
    return json.dumps({"columns": columns, "required": required_columns(source, key_columns)})


def lateness_ms(source: EventSource) -> int:
    """How far behind the partition's greatest event time an event may be and still count."""
    return milliseconds(source.watermark_delay + source.allowed_lateness)


def checked_view_ddl(source: EventSource, key_columns: Sequence[str]) -> str:
    """Typed columns and the first problem of each event (`PARSE_EVENT`, then an event time more than
    `MAX_AHEAD_MS` ahead of its Kafka record's timestamp, taken to the minute), its payload, and the running
    maximum of valid event times in its partition."""
    names = [quote_ident(name) for name in source.schema]
    ts = quote_ident(source.timestamp_field)
    record_ms = f"CAST(TIMESTAMPDIFF(MINUTE, TO_TIMESTAMP_LTZ(0, 3), {quote_ident(RECORD_TIME)}) AS BIGINT) * 60000"
    # integers: no calendar overflows
    error = (f"CASE WHEN e.{quote_ident(ERROR)} IS NOT NULL THEN e.{quote_ident(ERROR)} "
             f"WHEN e.{ts} > {record_ms} + {MAX_AHEAD_MS} THEN {quote_string(FUTURE)} END")
    inner = (f"SELECT\n  {', '.join(f'e.{n}' for n in names)},\n  {error} AS {quote_ident(ERROR)},\n"
             f"  k.{quote_ident(PAYLOAD)}, k.{quote_ident(PARTITION)}, k.{quote_ident(OFFSET)}, "
             f"k.{quote_ident(PROCTIME)}\n"
             f"FROM {quote_ident(source.name + KAFKA_SUFFIX)} AS k,\n"
             f"  LATERAL TABLE(PARSE_EVENT(k.{quote_ident(PAYLOAD)}, {quote_string(parse_spec(source, key_columns))}))"
             f" AS e({', '.join([*names, quote_ident(ERROR)])})")
    running_max = (f"MAX(CASE WHEN {quote_ident(ERROR)} IS NULL THEN {ts} END) OVER (\n"
                   f"  PARTITION BY {quote_ident(PARTITION)} ORDER BY {quote_ident(PROCTIME)}\n"
                   f"  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS {quote_ident(MAX_SEEN)}")
    return (f"CREATE TEMPORARY VIEW {quote_ident(source.name + CHECKED_SUFFIX)} AS\n"
            f"SELECT *,\n{running_max}\nFROM (\n{inner}\n)")


def _on_time(source: EventSource) -> str:
    return f"{quote_ident(source.timestamp_field)} >= {quote_ident(MAX_SEEN)} - {lateness_ms(source)}"


def _after_cutover(source: EventSource, cutover_ms: Optional[int]) -> str:
    return "" if cutover_ms is None else f" AND {quote_ident(source.timestamp_field)} >= {cutover_ms}"


def on_time_view_ddl(source: EventSource, cutover_ms: Optional[int] = None) -> str:
    """The relation the tile queries read: valid, on-time events (at or after the cutover, when there is one),
    typed."""
    columns = [quote_ident(name) for name in source.schema]
    columns.append(f"TO_TIMESTAMP_LTZ({quote_ident(source.timestamp_field)}, 3) AS {quote_ident(ROWTIME)}")
    body = ",\n  ".join(columns)
    return (f"CREATE TEMPORARY VIEW {quote_ident(source.name)} AS\nSELECT\n  {body}\n"
            f"FROM {quote_ident(source.name + CHECKED_SUFFIX)}\n"
            f"WHERE {quote_ident(ERROR)} IS NULL AND {_on_time(source)}{_after_cutover(source, cutover_ms)}")


def dead_letter_query(source: EventSource, cutover_ms: Optional[int] = None) -> str:
    """Events with a problem, and late events at or after the cutover (a valid event before it is history, counted
    from Parquet whether or not it is late here), each with the original bytes of its payload's start."""
    payload = quote_ident(PAYLOAD)
    late = f"NOT ({_on_time(source)}){_after_cutover(source, cutover_ms)}"
    return (f"SELECT COALESCE({quote_ident(ERROR)}, {quote_string(LATE)}), {quote_string(source.name)}, "
            f"{quote_ident(PARTITION)}, {quote_ident(OFFSET)}, {quote_ident(source.timestamp_field)}, "
            f"PAYLOAD_TEXT({payload}, {DEAD_PAYLOAD_BYTES}), PAYLOAD_ENCODING({payload}, {DEAD_PAYLOAD_BYTES})\n"
            f"FROM {quote_ident(source.name + CHECKED_SUFFIX)}\n"
            f"WHERE {quote_ident(ERROR)} IS NOT NULL OR ({late})")


def source_relation(source: EventSource, read: KafkaRead, key_columns: Sequence[str],
                    cutover_ms: Optional[int] = None) -> SourceRelation:
    """Everything a streaming job needs to read `source`: `key_columns` are the join keys of its views; events
    before `cutover_ms` are history, counted from the batch side (None: every event counts here)."""
    ddl = (kafka_table_ddl(source, read), checked_view_ddl(source, key_columns),
           on_time_view_ddl(source, cutover_ms))
    return SourceRelation(ddl, dead_letter_query(source, cutover_ms))
