"""Batch path: Flink backfill over historical files, materialization to Redis, point-in-time training sets."""
