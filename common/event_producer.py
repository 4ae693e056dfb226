"""Events into a source's Kafka topic as the compiled stream reads them: one JSON object per record (event times in
epoch milliseconds, `null` for no value), keyed by the event's join keys, so that one entity's events stay in one
partition and in order (the stream's watermark is kept per partition). `featurectl datagen live`, the demo and
`push` (SDK and `POST /push`) all produce through `EventProducer`; the benchmarks write pre-built bytes instead.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from common.errors import FeaturectlError

KEY_SEPARATOR = b"\x1f"  # between the values of a key of several join keys


class EventDeliveryError(FeaturectlError):
    """Kafka did not take every event of a `deliver` call; `delivered` counts those it took and `failed` lists the
    positions of the others."""

    def __init__(self, message: str, delivered: int, failed: list[int]):
        super().__init__(message)
        self.delivered = delivered
        self.failed = failed


def encode_event(row: Mapping[str, Any]) -> bytes:
    """The record value: compact JSON; NaN and infinities are refused (JSON has no such numbers)."""
    return json.dumps(row, separators=(",", ":"), allow_nan=False).encode()


def event_key(row: Mapping[str, Any], key_columns: Sequence[str]) -> Optional[bytes]:
    """The record key: the event's join key values (one key: its value as text, as `datagen` always wrote)."""
    if not key_columns:
        return None
    return KEY_SEPARATOR.join(str(row[k]).encode() for k in key_columns)


class _Reports:
    """Delivery reports of one `deliver` call, filled by librdkafka's callbacks on whichever thread polls."""

    def __init__(self, count: int):
        self.count = count
        self.delivered: set[int] = set()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.done = threading.Event()
        if count == 0:
            self.done.set()

    def callback(self, position: int):
        def report(error, _message) -> None:
            with self._lock:
                if error is None:
                    self.delivered.add(position)
                else:
                    self.errors.append(str(error))
                if len(self.delivered) + len(self.errors) == self.count:
                    self.done.set()
        return report


class EventProducer:
    """One Kafka producer (thread-safe), idempotent so that its own retries never duplicate an event. A message
    Kafka has not taken within `delivery_timeout_s` is reported failed, so every `deliver` ends with a verdict for
    each of its events."""

    def __init__(self, bootstrap_servers: str, delivery_timeout_s: float = 300.0, **settings: Any):
        from confluent_kafka import Producer

        self.bootstrap_servers = bootstrap_servers
        self.delivery_timeout_s = delivery_timeout_s
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 5,
                                   "compression.type": "lz4", "enable.idempotence": True,
                                   "message.timeout.ms": int(delivery_timeout_s * 1000), **settings})

    def produce(self, topic: str, rows: Sequence[Mapping[str, Any]], key_columns: Sequence[str],
                on_delivery: Optional[Any] = None) -> None:
        """Queue the events (`on_delivery(position)` makes each one's delivery callback); waits only while
        the local queue is full."""
        for position, row in enumerate(rows):
            value, key = encode_event(row), event_key(row, key_columns)
            callback = on_delivery(position) if on_delivery is not None else None
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key, on_delivery=callback)
                    break
                except BufferError:  # the local queue is full: let librdkafka send some
                    self._producer.poll(0.1)
        self._producer.poll(0)

    def deliver(self, topic: str, rows: Sequence[Mapping[str, Any]], key_columns: Sequence[str]) -> int:
        """Produce the events and wait until Kafka has taken each one or given up on it; returns how many it took,
        or raises EventDeliveryError naming the events it did not take."""
        reports = _Reports(len(rows))
        self.produce(topic, rows, key_columns, reports.callback)
        deadline = time.monotonic() + self.delivery_timeout_s + 5.0
        while not reports.done.is_set() and time.monotonic() < deadline:
            self._producer.poll(0.05)
        failed = [p for p in range(len(rows)) if p not in reports.delivered]
        if failed:
            reason = reports.errors[0] if reports.errors else f"no delivery report within {self.delivery_timeout_s:g}s"
            raise EventDeliveryError(f"Kafka at {self.bootstrap_servers} did not take {len(failed)} of {len(rows)} "
                                     f"events for topic {topic} ({reason})", len(reports.delivered), failed)
        return len(rows)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for the queued events; returns how many are still not delivered."""
        return self._producer.flush(timeout_s)
