"""The feature server's HTTP/1.1 connections: httptools parsing, `FeatureServer.respond`, one write per response.

Of the request headers only the API key (`Authorization: Bearer`, `X-API-Key`) and `Expect` are kept: the
others are never copied into Python objects, so a header costs one comparison.

uvicorn still runs the process (binding, workers, signals, lifespan, graceful shutdown); this protocol replaces
its ASGI request cycle, which costs two socket writes and a dozen message dicts per response. Requests on one
connection are answered in order (pipelining); a malformed request gets a 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from http import HTTPStatus
from typing import Any, Optional

import httptools
import orjson

from redis_store.node import TIMER_SLACK_S
from serving.gateway import bearer
from serving.http_app import JSON, MAX_BODY_BYTES, FeatureServer

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


def _feature_server(app: Any) -> FeatureServer:
    """uvicorn may wrap the app in middleware; the protocol talks to the FeatureServer underneath."""
    while not isinstance(app, FeatureServer):
        app = getattr(app, "app", None)
        if app is None:
            raise TypeError("FeatureHttpProtocol serves serving.http_app.FeatureServer apps only")
    return app


class FeatureHttpProtocol(asyncio.Protocol):
    """One per connection; built by uvicorn (`Config(http=FeatureHttpProtocol)`)."""

    def __init__(self, config: Any, server_state: Any, app_state: Any = None,
                 _loop: Optional[asyncio.AbstractEventLoop] = None):
        self.app = _feature_server(config.loaded_app)
        self.loop = _loop or asyncio.get_event_loop()
        self.connections = server_state.connections
        self.keep_alive_s = config.timeout_keep_alive
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Optional[asyncio.Transport] = None
        self.pending: deque[tuple[str, bytes, Optional[bytes], bool, Optional[str]]] = deque()
        self.busy = False
        self.closing = False
        self.idle_since: Optional[float] = None  # loop time the connection went idle; None while a request runs
        self.idle_timer: Optional[asyncio.TimerHandle] = None
        self.url, self.chunks, self.size, self.expect_continue = b"", [], 0, False
        self.api_key: Optional[str] = None

    # connection events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(self)
        self.transport = transport  # type: ignore[assignment]
        self.idle_since = self.loop.time()
        self.idle_timer = self.loop.call_later(self.keep_alive_s, self._check_idle)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.connections.discard(self)
        self.closing = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after the responses in progress."""
        self.closing = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse("protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._refuse(f"malformed HTTP request: {exc}")

    # parser callbacks
    def on_message_begin(self) -> None:
        self.url, self.chunks, self.size, self.expect_continue = b"", [], 0, False
        self.api_key = None

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)  # most headers are ruled out by their length, without lowering the name
        if size == 13 and name.lower() == b"authorization":
            self.api_key = bearer(value) or self.api_key
        elif size == 9 and name.lower() == b"x-api-key":
            self.api_key = self.api_key or value.strip().decode("latin-1")
        elif size == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True

    def on_headers_complete(self) -> None:
        if self.expect_continue:  # curl asks before sending bodies over 1 kB
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= MAX_BODY_BYTES:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks) if self.size <= MAX_BODY_BYTES else None
        self.pending.append((self.parser.get_method().decode(), self.url, body, self.parser.should_keep_alive(),
                             self.api_key))
        if not self.busy:
            self.busy = True
            self.loop.create_task(self._answer())

    # responses
    async def _answer(self) -> None:
        """Answer the pending requests of this connection in order, each with one write."""
        transport = self.transport
        while self.pending and not transport.is_closing():  # type: ignore[union-attr]
            method, url, body, keep_alive, api_key = self.pending.popleft()
            try:
                path = httptools.parse_url(url).path.decode("latin-1")
            except httptools.HttpParserInvalidURLError:
                status, payload, kind, headers = 400, orjson.dumps({"error": f"invalid URL {url[:200]!r}",
                                                                    "code": "bad_request"}), JSON, ()
            else:
                status, payload, kind, headers = await self.app.respond(method, path, body, api_key)
            if transport.is_closing():  # type: ignore[union-attr]
                break  # the client went away while we were answering
            close = not keep_alive or self.closing
            transport.write(_head(status, kind, len(payload), close, headers)  # type: ignore[union-attr]
                            + (b"" if method == "HEAD" else payload))
            if close:
                transport.close()  # type: ignore[union-attr]
                break
        self.busy = False
        self.idle_since = self.loop.time()

    def _refuse(self, message: str) -> None:
        payload = orjson.dumps({"error": message, "code": "bad_request"})
        self.transport.write(_head(400, JSON, len(payload), True) + payload)  # type: ignore[union-attr]
        self.transport.close()  # type: ignore[union-attr]

    def _check_idle(self) -> None:
        """Close the connection once idle for `timeout_keep_alive` seconds. One timer per connection, re-armed
        when it fires, rather than one set and cancelled per request (about 3 us each on uvloop)."""
        if self.closing:
            return
        now, since = self.loop.time(), self.idle_since
        if since is not None and not self.busy and now - since >= self.keep_alive_s - TIMER_SLACK_S:
            self.transport.close()  # type: ignore[union-attr]
            return
        wait = self.keep_alive_s if since is None or self.busy else since + self.keep_alive_s - now
        self.idle_timer = self.loop.call_later(wait, self._check_idle)


def _head(status: int, kind: bytes, length: int, close: bool, headers=()) -> bytes:
    """The status line and headers; `headers` are extra (name, value) pairs (Retry-After, WWW-Authenticate)."""
    extra = b"".join(b"%s: %s\r\n" % pair for pair in headers) if headers else b""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s%s\r\n"
            % (status, _REASONS.get(status, b""), kind, length, extra, b"connection: close\r\n" if close else b""))
