"""What a feature request's `Content-Type` and `Accept` ask for, read by the HTTP protocol without pyarrow: Feast's
JSON, or Arrow IPC streams (`serving.arrow_ipc`)."""

from __future__ import annotations

from typing import Optional

ARROW_STREAM = b"application/vnd.apache.arrow.stream"
ARROW_BODY, ARROW_ANSWER = 1, 2  # bits of `media`: the body is an Arrow stream; the answer is to be one


def media_of(content_type: Optional[bytes], accept: Optional[bytes]) -> int:
    """The `media` bits of a request's `Content-Type` and `Accept` headers (0: Feast's JSON both ways)."""
    media = 0
    if content_type is not None and content_type.split(b";", 1)[0].strip().lower() == ARROW_STREAM:
        media |= ARROW_BODY
    if accept is not None and ARROW_STREAM in accept.lower():
        media |= ARROW_ANSWER
    return media
