"""The streaming runner: Kafka -> Flink SQL (tiles, dead letters) -> window writer -> Redis in Feast's layout.

`featurectl stream` runs it; `docs/streaming.md` describes it and the README states its guarantee.
"""
