"""The ASGI face of both servers' apps: any ASGI server can run an app that has `respond(method, path, body,
api_key, request_id)` and `max_body_bytes`; ours run it on `serving.http_protocol` instead, and use ASGI for
lifespan only."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Optional

from common.errors import registry_unavailable
from serving.gateway import key_from_headers
from serving.http_protocol import request_id

_GONE = object()


async def answer_http(app: Any, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
    """One ASGI HTTP request answered by `app.respond` (the body None when over `app.max_body_bytes`)."""
    body: Any = await _read_body(receive, app.max_body_bytes) if scope["method"] == "POST" else b""
    if body is _GONE:
        return  # the client went away: nobody is left to read an answer
    asked = scope.get("headers", ())
    given_id = next((request_id(value) for name, value in asked if name.lower() == b"x-request-id"), None)
    status, payload, kind, headers = await app.respond(scope["method"], scope["path"], body, key_from_headers(asked),
                                                       given_id)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(payload)), *headers]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else payload})


async def refuse_startup(send: Callable, log: logging.Logger, who: str, exc: BaseException) -> None:
    """Answer the lifespan start-up with a failure that says why in one line (for a registry database that is
    down, which database and how to start it), and log the same line."""
    why = registry_unavailable(exc) or str(exc)
    log.error("%s cannot start: %s", who, why)
    await send({"type": "lifespan.startup.failed", "message": why})


class AsgiApp:
    """The ASGI entry of an app with `respond` and an async `_lifespan(receive, send)`."""

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)  # type: ignore[attr-defined]
        elif scope["type"] == "http":
            await answer_http(self, scope, receive, send)


async def _read_body(receive: Callable[[], Awaitable[dict]], limit: int) -> Optional[bytes]:
    """The whole body; None past `limit` bytes (the rest is read and dropped); `_GONE` if the client left first."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE  # type: ignore[return-value]
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks) if size <= limit else None
