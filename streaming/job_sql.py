"""The SQL of one streaming job: each view's compiled tile query into an upsert-Kafka topic of tiles, and each
source's dead letters into a dead-letter topic, all in one Flink job (one StatementSet, one read per source).

The SQL is the compiler's (`dsl.compile_flink.compile_view`): its streaming source relation and dead-letter
query per source (with the source's cutover: events before it are history, counted from the batch side), and its
tile query per view, whose bookkeeping partials give the window writer each tile's version (`__events`) and
clock (`__clock`). The compiler stays the only author of the job's queries; this module adds the sinks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from common.errors import FeaturectlError
from dsl.compile_flink import TILE_START, CompiledView, SourceSettings, compile_view
from dsl.compile_stream_source import DEAD_LETTER_COLUMNS, SourceRelation, source_keys
from dsl.feature_view import FeatureView
from dsl.source import EventSource
from dsl.types import Vector
from dsl.sql import create_table, quote_ident
from streaming.partitioning import PARTITIONER_CLASS

# Transactions of the dead-letter sink must outlive a checkpoint interval; 15 minutes is the broker's default cap.
TRANSACTION_TIMEOUT_MS = 900_000


class StreamDefinitionError(FeaturectlError, ValueError):
    """A view cannot be streamed as defined; the message names it and the fix."""


@dataclass(frozen=True)
class ViewJob:
    """A streamed view: its definition, its compiled tile query, and the topic its tiles go to."""

    view: FeatureView
    compiled: CompiledView
    tiles_topic: str
    state_ttl_ms: int  # a tile's state outlives its last update by this much: tile + lateness + a margin

    @property
    def sink(self) -> str:
        return f"{self.view.name}__tiles"

    @property
    def query(self) -> str:
        return self.compiled.tile_query_with_state_ttl(self.state_ttl_ms)


@dataclass(frozen=True)
class SourceJob:
    """A source the job reads: its relation (as compiled) and the topic its dead letters go to."""

    source: EventSource
    relation: SourceRelation
    dead_letter_topic: str

    @property
    def sink(self) -> str:
        return f"{self.source.name}__dead_letters"

    @property
    def query(self) -> str:
        return self.relation.dead_letter_query


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
    cutovers: Mapping[str, int]  # per source with history: where its Kafka events start to count (epoch ms)

    @property
    def consumer_groups(self) -> list[str]:
        """The Kafka consumer groups the job commits offsets to."""
        return [self.group_id]

    def ddl(self) -> list[str]:
        """Functions, source tables and views, then the sink tables."""
        out = list(self.function_ddl)
        for source in self.sources:
            out.extend(source.relation.ddl)
            out.append(self._dead_letter_sink(source))
        out.extend(self._tiles_sink(v) for v in self.views)
        return out

    def inserts(self) -> list[str]:
        """Each view's tiles into its sink, then each source's dead letters into its own."""
        return [f"INSERT INTO {quote_ident(job.sink)}\n{job.query}" for job in (*self.views, *self.sources)]

    def _tiles_sink(self, job: ViewJob) -> str:
        keys = job.compiled.key_columns
        columns = [f"{quote_ident(k)} {kind.flink_sql}" for k, kind in zip(keys, job.compiled.key_types)]
        columns.append(f"{quote_ident(TILE_START)} BIGINT")
        columns += [f"{quote_ident(c.name)} {c.sql_type}" for c in job.compiled.tile_columns]
        columns.append(f"PRIMARY KEY ({', '.join(quote_ident(k) for k in (*keys, TILE_START))}) NOT ENFORCED")
        # A mini-batch emits its tile updates at once: 5 ms of linger packs them into a few produce requests.
        # All tiles of an entity go to one partition (streaming.partitioning), read by one window writer.
        options = {"connector": "upsert-kafka", "topic": job.tiles_topic,
                   "properties.bootstrap.servers": self.bootstrap_servers, "properties.linger.ms": "5",
                   "properties.partitioner.class": PARTITIONER_CLASS, "key.format": "json", "value.format": "json"}
        return create_table(job.sink, columns, options)

    def _dead_letter_sink(self, job: SourceJob) -> str:
        columns = [f"{quote_ident(name)} {kind}" for name, kind in DEAD_LETTER_COLUMNS]
        options = {"connector": "kafka", "topic": job.dead_letter_topic,
                   "properties.bootstrap.servers": self.bootstrap_servers, "format": "json",
                   "sink.delivery-guarantee": "exactly-once",
                   "sink.transactional-id-prefix": f"featurectl-{self.fingerprint}-{job.source.name}",
                   "properties.transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS)}
        return create_table(job.sink, columns, options)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def tile_topics_of(project: str, topics: Iterable[str]) -> list[str]:
    """Which of `topics` are tile topics of `project`'s streams, of any generation (each names its fingerprint)."""
    pattern = re.compile(re.escape(f"featurectl.{_slug(project)}.") + r"[A-Za-z][A-Za-z0-9_]*\.tiles-[0-9a-f]+")
    return sorted(t for t in topics if pattern.fullmatch(t))


def job_name(project: str, views: Sequence[FeatureView]) -> str:
    return _slug(".".join([project, *sorted(v.name for v in views)]))


def state_ttl_ms(compiled: CompiledView, margin_ms: int) -> int:
    """How long a tile's state outlives its last update: no event can reach it after its tile plus the lateness."""
    return compiled.tile_ms + compiled.lateness_ms + margin_ms


def plan_job(project: str, views: Sequence[FeatureView], all_views: Sequence[FeatureView],
             settings: SourceSettings, startup: dict[str, str], state_ttl_margin_ms: int = 60_000,
             generation: int = 0) -> JobPlan:
    """The job streaming `views` (of a repo whose views are `all_views`); `startup` places a job without a
    checkpoint in its source topics and is left out of the fingerprint; `settings.cutovers` and `generation`
    (when the stream's state began, see `streaming.bootstrap`) are in it."""
    for view in views:
        if not view.source.kafka_topic:
            raise StreamDefinitionError(f"feature view `{view.name}`: source `{view.source.name}` has no "
                                        "kafka_topic; give the source a topic to stream it")
        _check_no_vectors(view)
    name = job_name(project, views)

    def compiled_for(group_id: str, start: dict[str, str]) -> list[CompiledView]:
        placed = dataclasses.replace(settings, consumer_group=group_id, startup=start)
        return [compile_view(v, placed, source_keys(v.source, all_views)) for v in views]

    unplaced = compiled_for("", {})  # the SQL without the job's consumer group and start position
    ttls = [state_ttl_ms(c, state_ttl_margin_ms) for c in unplaced]
    queries = [c.tile_query_with_state_ttl(t) for c, t in zip(unplaced, ttls)]
    source_sql = [sql for _, r in _relations(views, unplaced).values() for sql in (*r.ddl, r.dead_letter_query)]
    text = "\n".join([project, str(generation), *queries, *source_sql])
    fingerprint = hashlib.sha256(text.encode()).hexdigest()[:12]
    group_id = f"featurectl.{name}.{fingerprint}"
    compiled = compiled_for(group_id, startup)
    view_jobs = tuple(ViewJob(v, c, f"featurectl.{_slug(project)}.{v.name}.tiles-{fingerprint}", t)
                      for v, c, t in zip(views, compiled, ttls))
    sources = _relations(views, compiled).values()
    source_jobs = tuple(SourceJob(source, relation, f"{source.kafka_topic}.dead-letters")
                        for source, relation in sources)
    cutovers = {s.name: settings.cutovers[s.name] for s, _ in sources if s.name in settings.cutovers}
    return JobPlan(name, fingerprint, settings.bootstrap_servers, group_id, view_jobs, source_jobs,
                   compiled[0].function_ddl, cutovers)


def _check_no_vectors(view: FeatureView) -> None:
    """A stream reads Kafka JSON with `PARSE_EVENT`, which types scalar values only: a vector column is refused here
    rather than failing inside Flink."""
    vectors = [f"`{name}` ({kind.value})" for name, kind in view.source.schema.items() if isinstance(kind, Vector)]
    if vectors:
        raise StreamDefinitionError(
            f"feature view `{view.name}`: source `{view.source.name}` has vector column {', '.join(vectors)}, and "
            "streams do not read vectors; backfill and materialize the view instead, or push its rows online "
            f"(`client.push(\"{view.name}_push\", ...)`), which also indexes them for search")


def _relations(views: Sequence[FeatureView], compiled: list[CompiledView]) -> dict[str, tuple]:
    """(source, compiled relation) per source name: views of one source compile it identically, and the job
    reads each topic once."""
    return {v.source.name: (v.source, c.streaming_source) for v, c in zip(views, compiled)}
