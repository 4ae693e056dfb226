"""Settings of the streaming runner (defaults suit one machine; `featurectl stream` flags override them)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class StreamSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    checkpoint_interval_s: float = Field(10.0, gt=0, description="how often Flink checkpoints its state and offsets")
    checkpoints_retained: int = Field(3, ge=1, description="completed checkpoints kept on disk")
    mini_batch_latency_ms: int = Field(500, gt=0, description="longest an event waits in a tile mini-batch")
    mini_batch_size: int = Field(100_000, gt=0, description="events per mini-batch at most; above "
                                 "what the latency gathers at 100,000 events/s, so batches close on time and "
                                 "a busy job emits fewer, fuller tile updates")
    state_ttl_margin_s: float = Field(60.0, ge=0, description="kept beyond tile + lateness before tile state expires")
    consume_batch: int = Field(30_000, gt=0, description="tile updates the writer takes from Kafka at once; while "
                               "behind, a bigger batch holds more versions of each busy tile, of which only the "
                               "newest is applied")
    coalesce_ms: int = Field(1_000, ge=0, description="while behind, the writer writes at most this often")
    status_interval_s: float = Field(1.0, gt=0, description="how often the status file is rewritten")
    parallelism: int = Field(1, ge=1, description="Flink parallelism and the number of window writer processes")
    partitions: Optional[int] = Field(None, ge=1, description="partitions of the topics the stream creates (None: "
                                      "the parallelism)")
    replication_factor: int = Field(1, ge=1, description="replicas of the topics the stream creates")
