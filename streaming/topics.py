"""The Kafka topics a stream writes: per view, a compacted topic of tiles; per source, a dead-letter topic."""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dsl.compile_stream_source import lateness_ms
from streaming.job_sql import JobPlan

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000


def tiles_retention_ms(plan: JobPlan, topic: str) -> int:
    """A tile stays useful while it is in some window: the longest window (or ttl), the tile and its lateness,
    plus an hour of slack. Compaction keeps the latest version of each (entity, tile) meanwhile."""
    view = next(v.view for v in plan.views if v.tiles_topic == topic)
    longest = max([w.length for a in view.aggregations for w in a.parsed_windows]
                  + ([view.ttl] if view.attributes else []))
    return int((longest + view.tile).total_seconds() * 1000) + lateness_ms(view.source) + HOUR_MS


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
    """Events in the source topics past the offsets the job committed at its latest checkpoint (so it moves in
    checkpoint steps): small and steady when the job keeps up, growing when it does not."""

    def __init__(self, plan: JobPlan):
        self.consumer = Consumer({"bootstrap.servers": plan.bootstrap_servers, "group.id": plan.group_id})
        metadata = self.consumer.list_topics(timeout=10)
        self.partitions = [TopicPartition(s.source.kafka_topic, p) for s in plan.sources
                           for p in metadata.topics[s.source.kafka_topic].partitions]

    def events(self) -> int:
        lag = 0
        for tp in self.consumer.committed(self.partitions, timeout=10):
            low, high = self.consumer.get_watermark_offsets(tp, timeout=10)
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return lag

    def close(self) -> None:
        self.consumer.close()
