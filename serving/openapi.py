"""The feature server's OpenAPI 3.1 document, written out (the app has no framework to derive it from)."""

from __future__ import annotations

from typing import Any

from serving.media import ARROW_STREAM as ARROW_MEDIA

_ERROR = {"type": "object", "required": ["error", "code"], "properties": {
    "error": {"type": "string", "description": "what was wrong and what to do"},
    "code": {"type": "string", "examples": ["malformed_json", "unknown_feature", "bad_entities", "redis_unavailable"]},
}}
_REQUEST = {
    "type": "object",
    "required": ["entities"],
    "properties": {
        "features": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "^[^:]+:.+$"},
                     "description": "feature references `view:feature`; give this or `feature_service`"},
        "feature_service": {"type": "string", "minLength": 1, "description": "a feature service name"},
        "entities": {"type": "object", "minProperties": 1, "description": "join key -> one value per row",
                     "additionalProperties": {"type": "array", "maxItems": 10000,
                                              "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}},
        "full_feature_names": {"type": "boolean", "default": False,
                               "description": "name columns `view__feature` instead of `feature`"},
    },
    "oneOf": [{"required": ["features"]}, {"required": ["feature_service"]}],
}
_PUSH = {
    "type": "object",
    "required": ["push_source_name", "df"],
    "additionalProperties": False,
    "properties": {
        "push_source_name": {"type": "string", "minLength": 1,
                             "description": "an event source's name (events), or `{view}_push` of an attribute view "
                                            "(values)"},
        "df": {"type": "object", "minProperties": 1, "description": "column -> one value per row",
               "additionalProperties": {"type": "array", "maxItems": 10000}},
        "to": {"enum": ["online", "offline", "online_and_offline"], "default": "online"},
        "allow_registry_cache": {"type": "boolean", "default": True},
        "transform_on_write": {"type": "boolean", "default": True},
    },
}
_PUSHED = {"type": "object", "required": ["status", "push_source_name", "rows"], "properties": {
    "status": {"const": "ok"}, "push_source_name": {"type": "string"}, "to": {"type": "string"},
    "rows": {"type": "integer"}, "events_sent": {"type": "integer"},
    "history_file": {"type": ["string", "null"]}, "online_written": {"type": "integer"},
    "online_older_skipped": {"type": "integer"},
}}
_DOCUMENTS = {
    "type": "object",
    "required": ["features", "query"],
    "properties": {
        "features": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "^[^:]+:.+$"},
                     "description": "`view:feature` references of one view: exactly one vector feature (the one "
                                    "searched) and the features to return for each hit"},
        "query": {"type": "array", "minItems": 1, "items": {"type": "number"},
                  "description": "the query vector, of the vector feature's dimension"},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
        "api_version": {"type": "integer", "default": 1},
        "distance_metric": {"type": "string", "description": "ignored: the feature's declared metric is used"},
        "filters": {"type": "object", "description": "Feast's filters: {key, type: eq | in, value} comparisons, "
                                                     "alone or in {type: and, filters: [...]}"},
    },
}
_RESPONSE = {"type": "object", "required": ["metadata", "results"], "properties": {
    "metadata": {"type": "object", "properties": {"feature_names": {"type": "array", "items": {"type": "string"}}}},
    "results": {"type": "array", "items": {"type": "object", "properties": {
        "values": {"type": "array", "items": {}},
        "statuses": {"type": "array", "items": {"enum": ["PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"]}},
        "event_timestamps": {"type": "array", "items": {"type": "string", "format": "date-time"}},
    }}},
}}


ARROW_STREAM = ARROW_MEDIA.decode()
ARROW_REQUEST = ("an Arrow IPC stream: one column per join key (and on-demand request field); schema metadata "
                 "`features` (a JSON list) or `feature_service`, optionally `full_feature_names`")
ARROW_ANSWER = ("an Arrow IPC stream of one record batch: the join keys, then per feature its values, "
                "`{name}:status` and `{name}:event_timestamp`; errors stay JSON")


def _json(schema: Any) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _get(summary: str, ok: dict[str, Any], *extra: int) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "OK", **ok}}
    for code in extra:
        responses[str(code)] = {"description": "Redis unreachable", **_json({"$ref": "#/components/schemas/Error"})}
    return {"get": {"summary": summary, "responses": responses}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "featurectl feature server", "version": "1",
             "description": "Feast-compatible online feature retrieval from Redis"},
    "paths": {
        "/get-online-features": {"post": {
            "summary": "Feature values for entity rows (Feast's request and response shape)",
            "requestBody": {"required": True, "content": {
                **_json({"$ref": "#/components/schemas/GetOnlineFeaturesRequest"})["content"],
                ARROW_STREAM: {"schema": {"type": "string", "format": "binary", "description": ARROW_REQUEST}}}},
            "responses": {
                "200": {"description": "values in request order (Arrow when `Accept` asks for it)", "content": {
                    **_json({"$ref": "#/components/schemas/GetOnlineFeaturesResponse"})["content"],
                    ARROW_STREAM: {"schema": {"type": "string", "format": "binary", "description": ARROW_ANSWER}}}},
                "400": {"description": "malformed JSON, unknown feature or service, bad entity values",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "409": {"description": "a requested view's online values are of another version than the one "
                                       "applied (`version_conflict`)", **_json({"$ref": "#/components/schemas/Error"})},
                "413": {"description": "body too large", **_json({"$ref": "#/components/schemas/Error"})},
                "503": {"description": "Redis unreachable or too slow",
                        **_json({"$ref": "#/components/schemas/Error"})},
            },
        }},
        "/push": {"post": {
            "summary": "Write rows to a push source (Feast's push request shape): events into an event source's "
                       "Kafka topic and/or Parquet history, or values of an attribute view into Redis",
            "requestBody": {"required": True, **_json({"$ref": "#/components/schemas/PushRequest"})},
            "responses": {
                "200": {"description": "what was written", **_json(_PUSHED)},
                "400": {"description": "malformed JSON, unknown or refused push source, a bad row",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "401": {"description": "API keys on: no key, or an unknown one",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "403": {"description": "API keys on: the key may not push to this source",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "413": {"description": "body too large", **_json({"$ref": "#/components/schemas/Error"})},
                "429": {"description": "over the key's budget", **_json({"$ref": "#/components/schemas/Error"})},
                "503": {"description": "Redis or Kafka unreachable", **_json({"$ref": "#/components/schemas/Error"})},
            },
        }},
        "/retrieve-online-documents": {"post": {
            "summary": "Nearest entities of a vector feature (Feast's request shape): their join keys, the "
                       "requested features and `distance`, nearest first",
            "requestBody": {"required": True, **_json({"$ref": "#/components/schemas/RetrieveOnlineDocumentsRequest"})},
            "responses": {
                "200": {"description": "one result per column: join keys, features, distance", **_json(
                    {"$ref": "#/components/schemas/GetOnlineFeaturesResponse"})},
                "400": {"description": "malformed JSON, no vector feature, a query of another dimension, a bad "
                                       "filter (`bad_search`)", **_json({"$ref": "#/components/schemas/Error"})},
                "401": {"description": "API keys on: no key, or an unknown one",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "403": {"description": "API keys on: the key lacks the `*` grant (free feature lists)",
                        **_json({"$ref": "#/components/schemas/Error"})},
                "413": {"description": "body too large", **_json({"$ref": "#/components/schemas/Error"})},
                "429": {"description": "over the key's budget", **_json({"$ref": "#/components/schemas/Error"})},
                "503": {"description": "Redis unreachable", **_json({"$ref": "#/components/schemas/Error"})},
            },
        }},
        "/health": _get("The process is up", _json({"type": "object"})),
        "/ready": _get("Registry loaded and Redis answering; `registry.state` is `cached` while the registry is "
                       "unreachable (the definitions read last are served)", _json({"type": "object"}), 503),
        "/metrics": _get("Prometheus metrics", {"content": {"text/plain": {"schema": {"type": "string"}}}}),
        "/stats": _get("Latency percentiles per endpoint and feature service, rows served per view, the sampled "
                       "served values per profiled feature (`drift`: counts per bin of its profile, PSI)",
                       _json({"type": "object"})),
        "/openapi.json": _get("This document", _json({"type": "object"})),
    },
    "components": {"schemas": {"GetOnlineFeaturesRequest": _REQUEST, "GetOnlineFeaturesResponse": _RESPONSE,
                               "PushRequest": _PUSH, "RetrieveOnlineDocumentsRequest": _DOCUMENTS,
                               "Error": _ERROR}},
}
