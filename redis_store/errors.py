"""What can go wrong talking to Redis, each message saying what to do."""

from __future__ import annotations

from common.errors import FeaturectlError


class RedisStoreError(FeaturectlError):
    """Base of every error of the Redis layout and its clients."""


class RedisConfigError(RedisStoreError):
    """`online_store.connection_string` cannot be used as written; the message names the part and the fix."""


class RedisUnavailableError(RedisStoreError):
    """Redis could not be reached, or did not answer in time; retrying later may help (HTTP 503)."""

    code = "redis_unavailable"


class RedisReplyError(RedisStoreError):
    """Redis answered with an error (a refused AUTH, a key of another type): retrying will not help."""
