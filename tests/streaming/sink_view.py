"""The view both streaming-sink suites write (one node, a cluster): a sum over a window and a last value."""

from __future__ import annotations

from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, Float64, String, Timestamp

EVENTS = EventSource("orders", {"shop": String, "price": Float64, "kind": String, "ts": Timestamp},
                     timestamp_field="ts", kafka_topic="orders", path="orders")
VIEW = FeatureView("shop_orders", Entity("shop", join_keys={"shop": String}), EVENTS, tile="1m", ttl="1h",
                   features=[Aggregation("sum", "price", windows=["10m"], name="revenue"),
                             Attribute("kind", name="last_kind")])
T = 1_767_225_600_000  # 2026-01-01T00:00Z
