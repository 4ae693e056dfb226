"""The generation server's OpenAPI 3.1 document, written out (the app has no framework to derive it from); the
test suite fuzzes the server from it (tests/reliability/test_http_fuzz.py)."""

from __future__ import annotations

from typing import Any

_ERROR = {"type": "object", "required": ["error", "code"], "properties": {
    "error": {"type": "string", "description": "what was wrong and what to do"},
    "code": {"type": "string", "examples": ["bad_request", "queue_full", "expired", "unknown_job"]},
}}
_REQUEST = {
    "type": "object", "required": ["prompt"], "additionalProperties": False,
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "description": "what to generate"},
        "asset_id": {"type": "string", "description": "condition on this asset's online features"},
        "seed": {"type": "integer", "minimum": 0, "default": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "description": "sample; default greedy"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0, "description": "seconds to wait for the mesh (at most "
                      "10x the server's `--timeout`, its default); past them the answer is a job id to poll (202)"},
        "async": {"type": "boolean", "default": False, "description": "answer a job id at once (202)"},
    },
}
_JOB = {"type": "object", "required": ["job_id", "status", "poll"], "properties": {
    "job_id": {"type": "string"}, "status": {"enum": ["queued", "running"]}, "poll": {"type": "string"},
    "detail": {"type": "string", "description": "why a job id rather than the mesh: `timeout_s` passed first"},
    "model_version": {"type": "string", "description": "the registered model version (NAME/VERSION) that admitted "
                                                       "the job, when the server serves models:/NAME@champion"}}}
_LOCATION = {"Location": {"description": "the job's poll URL", "schema": {"type": "string"}}}


def _json(schema: Any) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"description": "an error, named", **_json({"$ref": "#/components/schemas/Error"})}
            for code in codes}


_MESH = {"description": "the mesh", "content": {"model/gltf-binary": {"schema": {"type": "string",
                                                                                   "format": "binary"}}}}


def _get(summary: str, *codes: int) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": {"description": "OK", **_json({"type": "object"})},
                                                      **_errors(*codes)}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "featurectl generation server", "version": "1",
             "description": "Cube 3D meshes conditioned on a prompt and an asset's online features"},
    "paths": {
        "/generate": {"post": {
            "summary": "A mesh for the prompt (or, with `async`, a job id to poll)",
            "requestBody": {"required": True, **_json({"$ref": "#/components/schemas/GenerateRequest"})},
            "responses": {"200": _MESH,
                          "202": {"description": "a job to poll: `async` asked for one, or `timeout_s` passed first",
                                  "headers": _LOCATION, **_json({"$ref": "#/components/schemas/Job"})},
                          **_errors(400, 401, 403, 422, 429, 503)},
        }},
        "/jobs/{job_id}": {"get": {
            "summary": "A job's mesh once done; 202 while queued or running",
            "parameters": [{"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": _MESH,
                          "202": {"description": "not done", "headers": _LOCATION,
                                  **_json({"$ref": "#/components/schemas/Job"})},
                          **_errors(401, 403, 404, 410, 422)},
        }},
        "/health": _get("The process is up"),
        "/ready": _get("Models loaded", 503),
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}}, **_errors(503)}}},
        "/stats": _get("Per-stage latency percentiles", 503),
        "/openapi.json": _get("This document"),
    },
    "components": {"schemas": {"GenerateRequest": _REQUEST, "Job": _JOB, "Error": _ERROR}},
}
