"""The SQL of one streaming job: each view's compiled tile query into an upsert-Kafka topic of tiles, and each
source's dead letters into a dead-letter topic, all in one Flink job (one StatementSet, one read per source).

The tile queries are the compiler's, for the view plus two bookkeeping aggregations the window writer needs per
tile: the number of events (`__events`, a version: a replayed update carries fewer events than one already
applied) and the greatest event time (`__clock`, the writer's event-time clock). Adding them as aggregations
keeps the compiler the only author of tile SQL.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Sequence

from dsl.compile_flink import TILE_START, CompiledView, SourceSettings, compile_view
from dsl.expr import quote_ident
from dsl.feature_view import FeatureView
from dsl.features import Aggregation
from dsl.source import EventSource
from streaming.source_sql import (DEAD_LETTER_COLUMNS, RAW_GROUP_SUFFIX, KafkaRead, SourceRelation,
                                  source_relation)

EVENTS_FEATURE = "__events"
CLOCK_FEATURE = "__clock"
EVENTS_COLUMN = f"{EVENTS_FEATURE}__count"
CLOCK_COLUMN = f"{CLOCK_FEATURE}__max"
# Transactions of the dead-letter sink must outlive a checkpoint interval; 15 minutes is the broker's default cap.
TRANSACTION_TIMEOUT_MS = 900_000


class StreamDefinitionError(ValueError):
    """A view cannot be streamed as defined; the message names it and the fix."""


def with_bookkeeping(view: FeatureView) -> FeatureView:
    """The view plus the per-tile event count and greatest event time."""
    extra = [Aggregation("count", windows=[view.tile], name=EVENTS_FEATURE),
             Aggregation("max", view.source.timestamp_field, windows=[view.tile], name=CLOCK_FEATURE)]
    return dataclasses.replace(view, features=[*view.features, *extra])


@dataclass(frozen=True)
class ViewJob:
    """A streamed view: its definition, its compiled (bookkept) tile query, and the topic its tiles go to."""

    view: FeatureView
    compiled: CompiledView
    tiles_topic: str

    @property
    def sink(self) -> str:
        return f"{self.view.name}__tiles"


@dataclass(frozen=True)
class SourceJob:
    source: EventSource
    relation: SourceRelation
    dead_letter_topic: str

    @property
    def sink(self) -> str:
        return f"{self.source.name}__dead_letters"


@dataclass(frozen=True)
class JobPlan:
    """Everything the Flink job runs; `fingerprint` changes whenever its SQL does (checkpoints are per fingerprint)."""

    name: str
    fingerprint: str
    bootstrap_servers: str
    group_id: str  # the job's Kafka consumer group (offsets committed at checkpoints)
    views: tuple[ViewJob, ...]
    sources: tuple[SourceJob, ...]
    function_ddl: tuple[str, ...]

    @property
    def consumer_groups(self) -> list[str]:
        """The Kafka consumer groups the job commits offsets to (one per read of a topic)."""
        return [self.group_id, self.group_id + RAW_GROUP_SUFFIX]

    def ddl(self) -> list[str]:
        """Functions, source tables and views, then the sink tables."""
        out = list(self.function_ddl)
        for source in self.sources:
            out.extend(source.relation.ddl)
            out.append(self._dead_letter_sink(source))
        out.extend(self._tiles_sink(v) for v in self.views)
        return out

    def inserts(self) -> list[str]:
        out = [f"INSERT INTO {quote_ident(v.sink)}\n{v.compiled.tile_query}" for v in self.views]
        out += [f"INSERT INTO {quote_ident(s.sink)}\n{s.relation.dead_letter_query}" for s in self.sources]
        return out

    def _tiles_sink(self, job: ViewJob) -> str:
        keys = job.compiled.key_columns
        kinds = job.view.entity.join_keys
        columns = [f"{quote_ident(k)} {kinds[k].flink_sql}" for k in keys]
        columns.append(f"{TILE_START} BIGINT")
        columns += [f"{quote_ident(c.name)} {c.sql_type}" for c in job.compiled.tile_columns]
        columns.append(f"PRIMARY KEY ({', '.join(quote_ident(k) for k in (*keys, TILE_START))}) NOT ENFORCED")
        options = {"connector": "upsert-kafka", "topic": job.tiles_topic,
                   "properties.bootstrap.servers": self.bootstrap_servers, "key.format": "json",
                   "value.format": "json"}
        return _create_table(job.sink, columns, options)

    def _dead_letter_sink(self, job: SourceJob) -> str:
        columns = [f"{quote_ident(name)} {kind}" for name, kind in DEAD_LETTER_COLUMNS]
        options = {"connector": "kafka", "topic": job.dead_letter_topic,
                   "properties.bootstrap.servers": self.bootstrap_servers, "format": "json",
                   "sink.delivery-guarantee": "exactly-once",
                   "sink.transactional-id-prefix": f"featurectl-{self.fingerprint}-{job.source.name}",
                   "properties.transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS)}
        return _create_table(job.sink, columns, options)


def _create_table(name: str, columns: list[str], options: dict[str, str]) -> str:
    body = ",\n  ".join(columns)
    with_ = ",\n".join(f"  '{k}' = '{v}'" for k, v in options.items())
    return f"CREATE TEMPORARY TABLE {quote_ident(name)} (\n  {body}\n) WITH (\n{with_}\n)"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def job_name(project: str, views: Sequence[FeatureView]) -> str:
    return _slug(".".join([project, *sorted(v.name for v in views)]))


def source_keys(source: EventSource, all_views: Sequence[FeatureView]) -> tuple[str, ...]:
    """Join keys an event of `source` must carry: those of every view of the repo that reads it, so that which
    views one job streams never changes which events count."""
    keys = [k for v in all_views if v.source.name == source.name for k in v.entity.join_keys]
    return tuple(dict.fromkeys(keys))


def plan_job(project: str, views: Sequence[FeatureView], all_views: Sequence[FeatureView],
             settings: SourceSettings, startup: dict[str, str]) -> JobPlan:
    """The job streaming `views` (of a repo whose views are `all_views`); `startup` places a job without a
    checkpoint in its source topics and is left out of the fingerprint."""
    for view in views:
        if not view.source.kafka_topic:
            raise StreamDefinitionError(f"feature view `{view.name}`: source `{view.source.name}` has no "
                                        "kafka_topic; give the source a topic to stream it")
    name = job_name(project, views)
    bootstrap_servers = settings.bootstrap_servers
    compiled = [compile_view(with_bookkeeping(v), settings) for v in views]
    sources = list({v.source.name: v.source for v in views}.values())
    keys = {s.name: source_keys(s, all_views) for s in sources}
    relations = {s.name: source_relation(s, KafkaRead(bootstrap_servers, "", {}), keys[s.name]) for s in sources}
    text = "\n".join([project, *(c.tile_query for c in compiled),
                      *(sql for r in relations.values() for sql in (*r.ddl, r.dead_letter_query))])
    fingerprint = hashlib.sha256(text.encode()).hexdigest()[:12]
    read = KafkaRead(bootstrap_servers, f"featurectl.{name}.{fingerprint}", startup)
    view_jobs = tuple(ViewJob(v, c, f"featurectl.{_slug(project)}.{v.name}.tiles-{fingerprint}")
                      for v, c in zip(views, compiled))
    source_jobs = tuple(SourceJob(s, source_relation(s, read, keys[s.name]), f"{s.kafka_topic}.dead-letters")
                        for s in sources)
    return JobPlan(name, fingerprint, bootstrap_servers, read.group_id, view_jobs, source_jobs,
                   compiled[0].function_ddl)
