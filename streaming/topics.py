"""The Kafka topics a stream writes: per view, a compacted topic of tiles; per source, a dead-letter topic."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streaming.job_sql import JobPlan

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


def tiles_retention_ms(plan: JobPlan, topic: str) -> int:
    """A tile stays useful while it is in some window: the longest window (or ttl), the tile and its lateness,
    plus an hour of slack. Compaction keeps the latest version of each (entity, tile) meanwhile."""
    compiled = next(v.compiled for v in plan.views if v.tiles_topic == topic)
    return compiled.lookback_ms + HOUR_MS


def ensure_topics(plan: JobPlan, timeout_s: float = 30.0) -> None:
    """Create the topics that are missing (one partition each): tiles, dead letters, and a source topic nobody has
    written yet (the Kafka source fails on a topic that does not exist); existing ones are kept as they are."""
    admin = AdminClient({"bootstrap.servers": plan.bootstrap_servers})
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [NewTopic(s.source.kafka_topic, 1, 1) for s in plan.sources if s.source.kafka_topic not in existing]
    wanted += [NewTopic(v.tiles_topic, 1, 1, config={
        "cleanup.policy": "compact,delete", "retention.ms": str(tiles_retention_ms(plan, v.tiles_topic)),
        "segment.ms": str(HOUR_MS)}) for v in plan.views if v.tiles_topic not in existing]
    wanted += [NewTopic(s.dead_letter_topic, 1, 1) for s in plan.sources if s.dead_letter_topic not in existing]
    if not wanted:
        return
    for topic, future in admin.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result()
            log.info("created topic %s", topic)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise



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
