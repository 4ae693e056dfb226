"""This project's feature definitions, in featurectl's DSL: an entity, an event source, a view of windowed
aggregations, a view of plain attributes and a feature service. `featurectl plan` shows what they compile to
(Feast objects, Flink SQL); `featurectl apply` registers them in the Feast registry."""

from dsl import (Aggregation, Attribute, Entity, EventSource, FeatureService, FeatureView, Float64, String, Timestamp,
                 col)

customer = Entity("customer", join_keys={"customer_id": String}, description="a customer of the shop")

orders = EventSource(
    name="orders",
    schema={"customer_id": String, "order_id": String, "status": String, "amount": Float64, "country": String,
            "event_time": Timestamp},  # status: placed | cancelled; event_time: epoch milliseconds
    timestamp_field="event_time",
    kafka_topic="orders",  # streaming: one JSON event per Kafka record
    path="orders",  # history: Parquet files under the data folder (platform.data_dir)
    watermark_delay="5s",
    description="one event per order placed or cancelled",
)

placed = col("status") == "placed"

customer_orders = FeatureView(
    name="customer_orders", entity=customer, source=orders, tile="1m", ttl="2d",
    features=[
        Aggregation("count", windows=["1h", "24h"], filter=placed, name="orders"),
        Aggregation("sum", "amount", windows=["24h"], filter=placed, name="spend"),
        Aggregation("count", windows=["24h"], filter=col("status") == "cancelled", name="cancellations"),
    ],
    description="how much each customer ordered lately",
)

customer_profile = FeatureView(
    name="customer_profile", entity=customer, source=orders, tile="1h", ttl="365d",
    features=[Attribute("country")], description="each customer's latest country",
)

checkout_model = FeatureService(
    "checkout_model", features=[customer_orders, customer_profile], description="the features a checkout model reads"
)
