"""Reading an ASGI request body under a size limit: what the feature and generation servers' ASGI faces share."""

from __future__ import annotations

from typing import Awaitable, Callable, Optional


async def read_body(receive: Callable[[], Awaitable[dict]], limit: int, too_large: Exception) -> Optional[bytes]:
    """The whole body, or None when the client went away first; `too_large` is raised past `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)
