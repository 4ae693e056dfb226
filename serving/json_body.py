"""JSON request bodies and error replies of both HTTP servers, bounded: a body nested deeper than `MAX_DEPTH` is
refused before any work is done on it, and an error message is cut to `MAX_ERROR_CHARS` whatever it quotes."""

from __future__ import annotations

from typing import Any

import orjson

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
