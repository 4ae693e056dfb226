"""JSON request bodies and error replies of both HTTP servers, bounded: a body nested deeper than `MAX_DEPTH` is
refused before any work is done on it, and an error message is cut to `MAX_ERROR_CHARS` whatever it quotes."""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from common.errors import shown

MAX_DEPTH = 32
MAX_ERROR_CHARS = 512


class JsonBodyError(ValueError):
    """The body is not JSON, or nested too deep; the message says which."""


def load_json(body: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The parsed body. Nesting is measured only when the body holds more brackets than `max_depth` (never for
    the requests the servers expect), so the common case costs two `bytes.count` calls."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise JsonBodyError(f"malformed JSON body: {str(exc)[:200]}") from None
    if body.count(b"[") + body.count(b"{") > max_depth and _deeper_than(data, max_depth):
        raise JsonBodyError(f"the JSON body is nested more than {max_depth} levels deep; no request needs that")
    return data


def load_object(body: bytes, fields: Sequence[str], needs: str, takes: str,
                malformed: type[Exception], invalid: type[Exception]) -> dict[str, Any]:
    """The body as a JSON object of known `fields` only: `malformed` when it is no JSON, `invalid` when it is no
    object (it `needs` ...) or has another field (`takes` ... names the request)."""
    try:
        data = load_json(body)
    except JsonBodyError as exc:
        raise malformed(str(exc)) from None
    if not isinstance(data, dict):
        raise invalid(f"the body must be a JSON object with {needs}")
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise invalid(f"unknown field {shown(unknown[0])}; {takes} takes {', '.join(f'`{f}`' for f in fields)}")
    return data


def _deeper_than(data: Any, limit: int) -> bool:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False


def error_json(message: str, code: str) -> bytes:
    """`{"error": ..., "code": ...}` with the message cut to `MAX_ERROR_CHARS`."""
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS] + f"... ({len(message) - MAX_ERROR_CHARS} more characters)"
    return orjson.dumps({"error": message, "code": code})
