"""The Kafka topics of a stream: per view, a compacted topic of tiles; per source, a dead-letter topic and the
source topic itself; their partitions checked against the parallelism."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from common.errors import FeaturectlError
from streaming.config import StreamSettings
from streaming.job_sql import JobPlan, tile_topics_of

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


def tiles_retention_ms(plan: JobPlan, topic: str) -> int:
    """A tile stays useful while it is in some window: the longest window (or ttl), the tile and its lateness,
    and for a ttl after that, since when it left a window dates its entity's last change (`_ts`) on a restart;
    plus an hour of slack. Compaction keeps the latest version of each (entity, tile) meanwhile."""
    compiled = next(v.compiled for v in plan.views if v.tiles_topic == topic)
    return compiled.lookback_ms + compiled.ttl_ms + HOUR_MS


class TopicLayoutError(FeaturectlError, ValueError):
    """The stream's topics cannot serve its parallelism; the message names the topic and what to do."""


@dataclass(frozen=True)
class TopicSpec:
    """How one topic is created when missing, and the fewest partitions it may have."""

    partitions: int
    replication: int
    config: Optional[dict[str, str]] = None


def topic_specs(plan: JobPlan, settings: StreamSettings) -> dict[str, TopicSpec]:
    """Every topic of the stream: its source topics, tile topics and dead-letter topics. Partitions: a source's
    `kafka_partitions` for its own topic, else `settings.partitions`, else the parallelism; each at least the
    parallelism (a Flink source task or a window writer with no partition would do nothing)."""
    default = settings.partitions or settings.parallelism
    specs: dict[str, TopicSpec] = {}
    for job in plan.sources:
        source = job.source
        replicas = source.kafka_replication_factor or settings.replication_factor
        specs[source.kafka_topic] = TopicSpec(source.kafka_partitions or default, replicas)
        specs[job.dead_letter_topic] = TopicSpec(default, replicas)
        for view in plan.views:
            if view.view.source.name == source.name:
                specs[view.tiles_topic] = TopicSpec(default, replicas, {
                    "cleanup.policy": "compact,delete", "retention.ms": str(tiles_retention_ms(plan, view.tiles_topic)),
                    "segment.ms": str(HOUR_MS)})
    for topic, spec in specs.items():
        if spec.partitions < settings.parallelism:
            raise TopicLayoutError(f"topic {topic} would get {spec.partitions} partitions, fewer than the "
                                   f"parallelism {settings.parallelism}: raise `platform.kafka.partitions` (or the "
                                   "source's `kafka_partitions`) or lower `--parallelism`")
    return specs


def ensure_topics(plan: JobPlan, settings: StreamSettings, timeout_s: float = 30.0) -> None:
    """Create the stream's missing topics (tiles, dead letters, and a source topic nobody has written yet: the Kafka
    source fails on a topic that does not exist) and check that existing source and tile topics have partitions
    enough for the parallelism: a Flink source task or window writer without one would idle, not scale."""
    specs = topic_specs(plan, settings)
    dead = {s.dead_letter_topic for s in plan.sources}  # any count will do: writers share out what there is
    admin = AdminClient({"bootstrap.servers": plan.bootstrap_servers})
    metadata = admin.list_topics(timeout=timeout_s)
    for topic, spec in specs.items():
        have = metadata.topics.get(topic)
        if have is not None and topic not in dead and len(have.partitions) < settings.parallelism:
            raise TopicLayoutError(_too_few(plan, topic, len(have.partitions), settings.parallelism))
    brokers = len(metadata.brokers)
    wanted = [NewTopic(t, s.partitions, s.replication, config=s.config or {}) for t, s in specs.items()
              if t not in metadata.topics]
    for topic in wanted:
        if topic.replication_factor > brokers:
            raise TopicLayoutError(f"topic {topic.topic} would get {topic.replication_factor} replicas but Kafka at "
                                   f"{plan.bootstrap_servers} has {brokers} broker(s): lower "
                                   "`platform.kafka.replication_factor` (or the source's `kafka_replication_factor`)")
    if not wanted:
        return
    for topic, future in admin.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result()
            log.info("created topic %s (%d partitions)", topic, specs[topic].partitions)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def _too_few(plan: JobPlan, topic: str, partitions: int, parallelism: int) -> str:
    if any(v.tiles_topic == topic for v in plan.views):
        fix = (f"run it with `--parallelism {partitions}` or lower, or start a new generation with `--reset` "
               "(new tile topics)")
    else:
        fix = (f"add partitions (`kafka-topics.sh --alter --topic {topic} --partitions {parallelism}`) or run with "
               f"`--parallelism {partitions}`")
    return f"topic {topic} has {partitions} partition(s), fewer than the parallelism {parallelism}: {fix}"


class SourceLag:
    """Where the job stands in its source topics: the offsets it committed at its latest checkpoint (so they move
    in checkpoint steps) against the topics' ends."""

    def __init__(self, plan: JobPlan):
        self.consumer = Consumer({"bootstrap.servers": plan.bootstrap_servers, "group.id": plan.group_id})
        metadata = self.consumer.list_topics(timeout=10)
        self.partitions = [TopicPartition(s.source.kafka_topic, p) for s in plan.sources
                           for p in metadata.topics[s.source.kafka_topic].partitions]

    def offsets(self) -> list[tuple[str, int, int, int]]:
        """(topic, partition, offset the job has applied up to, end offset) per source partition. Flink commits an
        offset once the checkpoint holding it completes, after its sinks have flushed every tile update of the
        events before it: committed = end means every event produced so far is in the tile topics."""
        out = []
        for tp in self.consumer.committed(self.partitions, timeout=10):
            low, high = self.consumer.get_watermark_offsets(tp, timeout=10)
            out.append((tp.topic, tp.partition, tp.offset if tp.offset >= 0 else low, high))
        return out

    def close(self) -> None:
        self.consumer.close()


def delete_topics(bootstrap_servers: str, topics: list[str], timeout_s: float = 30.0,
                  project: Optional[str] = None) -> list[str]:
    """Delete those of `topics` that exist (a torn-down stream's tiles and dead letters) and, with `project`, every
    tile topic of that project's streams (earlier generations' too: a reset names new ones); the names deleted."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    listed = admin.list_topics(timeout=timeout_s).topics
    present = sorted({t for t in topics if t in listed} | set(tile_topics_of(project, listed) if project else ()))
    if not present:
        return []
    for future in admin.delete_topics(present, operation_timeout=timeout_s).values():
        future.result()
    return present
