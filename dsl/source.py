"""Event sources: one schema for a Kafka topic (streaming) and a Parquet folder (history)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Optional

from dsl.duration import parse_duration
from dsl.errors import DefinitionError, MissingTimestampError, TypeMismatchError, backticked
from dsl.names import check_name, check_topic
from dsl.sql import MAX_IDENTIFIER, identifier_problem
from dsl.types import FeatureType, ValueType, is_feature_type

# Names the compiled SQL adds to every source table; a user column may not take them, nor start with `__` (the
# prefix of the streaming relation's own columns).
ROWTIME = "__rowtime"
RESERVED_COLUMNS = frozenset({ROWTIME, "tile_start", "event_timestamp"})
RESERVED_PREFIX = "__"


@dataclass(frozen=True)
class EventSource:
    """Events with an event-time field (epoch milliseconds in both Kafka JSON and Parquet).

    `watermark_delay` is the bounded out-of-orderness of the Flink watermark (the watermark trails the greatest
    event time seen by this much); `allowed_lateness` is how far behind the watermark an event may still arrive
    and count: later events go to the dead-letter topic instead. `kafka_topic` feeds streaming jobs; `path`
    (a Parquet folder, relative to the repo's data folder unless absolute or a Flink filesystem URI such as
    `s3://bucket/events`) feeds backfills. `kafka_partitions`
    and `kafka_replication_factor` are how `featurectl stream` creates the topic and its dead-letter and tile
    topics when they do not exist (default: `platform.kafka`, partitions else the stream's parallelism).
    """

    name: str
    schema: Mapping[str, FeatureType]
    timestamp_field: Optional[str]
    kafka_topic: Optional[str] = None
    path: Optional[str] = None
    watermark_delay: str | timedelta = "5s"
    allowed_lateness: str | timedelta = "30s"
    description: str = ""
    kafka_partitions: Optional[int] = None
    kafka_replication_factor: Optional[int] = None

    def __post_init__(self) -> None:
        where = f"source {backticked(self.name)}"
        check_name(where, "name", self.name)
        if not self.schema:
            raise DefinitionError(where, "has an empty schema", "list its columns: schema={\"col\": String, ...}")
        for column, kind in self.schema.items():
            _check_column(where, column)
            if not is_feature_type(kind):
                raise TypeMismatchError(where, f"column `{column}` has type {kind!r}",
                                        "use a dsl type: String, Int32, Int64, Float32, Float64, Bool, Timestamp, "
                                        "Vector(dim)")
        if not self.timestamp_field:
            raise MissingTimestampError(where, "has no timestamp_field",
                                        "name the event-time column: timestamp_field=\"event_time\"")
        if self.timestamp_field not in self.schema:
            raise MissingTimestampError(where, f"timestamp_field `{self.timestamp_field}` is not in the schema",
                                        f"add it as Timestamp or pick one of: {', '.join(self.schema)}")
        if self.schema[self.timestamp_field] is not ValueType.TIMESTAMP:
            raise TypeMismatchError(where, f"timestamp_field `{self.timestamp_field}` has type "
                                    f"{self.schema[self.timestamp_field].value}",
                                    "declare it as Timestamp (epoch milliseconds)")
        if not self.kafka_topic and not self.path:
            raise DefinitionError(where, "has neither kafka_topic nor path", "give a topic, a Parquet path, or both")
        if self.kafka_topic is not None:
            check_topic(where, self.kafka_topic)
        for field in ("kafka_partitions", "kafka_replication_factor"):
            value = getattr(self, field)
            if value is not None and (type(value) is not int or not 1 <= value <= 10_000):
                raise DefinitionError(where, f"{field} {value!r} is not an int from 1 to 10000",
                                      "give a count of partitions or replicas, or leave it out for the platform's")
        if self.path is not None and not (isinstance(self.path, str) and self.path.isprintable()):
            raise DefinitionError(where, f"path {backticked(self.path)} is not a printable str",
                                  "give the Parquet folder as a str without line breaks or control characters")
        object.__setattr__(self, "schema", dict(self.schema))
        object.__setattr__(self, "watermark_delay", parse_duration(self.watermark_delay, f"{where} watermark_delay"))
        object.__setattr__(self, "allowed_lateness", parse_duration(self.allowed_lateness,
                                                                     f"{where} allowed_lateness", allow_zero=True))


def _check_column(where: str, column: object) -> None:
    """Columns follow the data, so any name Flink can quote is allowed, less those the compiler reserves."""
    problem = identifier_problem(column)
    if problem:
        raise DefinitionError(where, f"column {backticked(column)} cannot be a column name: {problem}",
                              f"rename it to 1 to {MAX_IDENTIFIER} printable characters")
    if column in RESERVED_COLUMNS or column.startswith(RESERVED_PREFIX):
        raise DefinitionError(where, f"column `{column}` uses a reserved name",
                              f"rename the column: {', '.join(sorted(RESERVED_COLUMNS))} and names starting with "
                              f"`{RESERVED_PREFIX}` are the compiler's")
