"""The serving error hierarchy: each error says what was wrong and what to do; HTTP maps them to 400 / 409 / 503.
Redis's own errors (unreachable, an error reply) are `redis_store.errors`'."""

from __future__ import annotations

from common.errors import FeaturectlError


class ServingError(FeaturectlError):
    """Base of every error raised by the online SDK and the feature server."""


class RequestError(ServingError, ValueError):
    """The request itself is wrong (unknown feature, bad entity values): the caller must change it (HTTP 400)."""

    code = "bad_request"


class UnknownFeatureError(RequestError):
    code = "unknown_feature"


class UnknownServiceError(RequestError):
    code = "unknown_feature_service"


class EntityError(RequestError):
    """Entity rows missing a join key, of the wrong type, or of unequal lengths."""

    code = "bad_entities"


class RegistryError(ServingError):
    """The Feast registry could not be read, or holds definitions the server cannot serve."""

    code = "registry_error"


class PushUnavailableError(ServingError):
    """Kafka did not take pushed events (HTTP 503); the message says which were taken, if any, and what to do."""

    code = "kafka_unavailable"


class VersionConflictError(ServingError):
    """A view's online values were written by another version of it than the one applied (HTTP 409): served, they
    would be read as the applied definition's values."""

    code = "version_conflict"
