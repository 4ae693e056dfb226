"""HTTP/1.1 connections of both servers (`featurectl serve`, `featurectl generate-server`): httptools parsing,
the app's `respond`, one write per response, and the limits that keep one client from holding a server.

An app is any object with `respond(method, path, body, api_key, request_id) -> (status, payload, content type,
headers)`, `max_body_bytes` and `http` (`common.config.HttpSettings`); one that also has `answer_soon` (the feature
server) may answer a request from a callback instead, with no task per request. Of the request headers only the API key
(`Authorization: Bearer`, `X-API-Key`), `X-Request-ID` (1 to 128 visible ASCII characters, else ignored) and
`Expect` are kept, and for an app with `arrow_media` (the feature server) `Content-Type` and `Accept`, passed to it
as `media` (`serving.media`): the others are never copied into Python objects, so a header costs one
comparison.

Limits, each answered with a JSON error, after the answers to the requests before it, and the connection closed:
414 past `max_url_bytes`, 431 past `max_header_bytes` or `max_headers` (also for a header line still growing past
them, so a never-ending header is cut off after one more read), 408 when a request is not whole within
`request_timeout_s` (slow or silent clients), 413 when the body is over `max_body_bytes`: at once when its
Content-Length says so (no 100 Continue, nothing more read), else once read to its end (the connection
survives). Flow control: when the client does not read its answers the server stops answering and
reading (`pause_writing`), and drops the connection after `request_timeout_s`; at most `max_pipelined` requests
are read ahead of their answers, then reading pauses until they are answered.

uvicorn still runs the process (binding, workers, signals, lifespan, graceful shutdown); this protocol replaces
its ASGI request cycle, which costs two socket writes and a dozen message dicts per response.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from http import HTTPStatus
from typing import Any, Optional

import httptools

from redis_store.node import TIMER_SLACK_S
from serving.gateway import bearer
from serving.json_body import error_json
from serving.media import media_of

JSON = b"application/json"
LINGER_S = 1.0  # after a refusal, what the client still sends is read and dropped this long, so it sees the answer
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_TEMPLATES: dict[tuple[int, bytes, bool], bytes] = {}  # response heads without extra headers, by status, type, close
_SPARE_HEAD_BYTES = 4096  # request line and line ends, beside the URL and header limits
# the lengths of the headers kept: authorization, x-api-key, expect and accept, x-request-id and content-type,
# content-length
_KEPT_SIZES = frozenset(map(len, (b"authorization", b"x-api-key", b"expect", b"x-request-id", b"content-length")))
_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")  # what the server logs and echoes: no spaces, no line breaks


def request_id(value: bytes) -> Optional[str]:
    """An `X-Request-ID` header's value, when it is one the server may log and echo."""
    return value.decode("ascii") if _REQUEST_ID.fullmatch(value) else None


def _served_app(app: Any) -> Any:
    """uvicorn may wrap the app in middleware; the protocol talks to the app underneath."""
    while not hasattr(app, "respond"):
        app = getattr(app, "app", None)
        if app is None:
            raise TypeError("HttpProtocol serves apps with a `respond` method (serving.http_app.FeatureServer, "
                            "inference.service.http_app.GenerationApp)")
    return app


class HttpProtocol(asyncio.Protocol):
    """One per connection; built by uvicorn (`Config(http=HttpProtocol)`)."""

    def __init__(self, config: Any, server_state: Any, app_state: Any = None,
                 _loop: Optional[asyncio.AbstractEventLoop] = None):
        self.app = _served_app(config.loaded_app)
        self.answer_soon = getattr(self.app, "answer_soon", None)  # what it answers without a task, if anything
        self.arrow_media = getattr(self.app, "arrow_media", False)  # whether it takes `media`
        limits = self.app.http
        self.max_url, self.max_head, self.max_headers = limits.max_url_bytes, limits.max_header_bytes, \
            limits.max_headers
        self.max_body, self.max_pipelined = self.app.max_body_bytes, limits.max_pipelined
        self.request_timeout_s, self.keep_alive_s = limits.request_timeout_s, limits.keep_alive_s
        self.period_s = min(self.request_timeout_s, self.keep_alive_s)  # the longest the timer ever waits
        self.loop = _loop or asyncio.get_event_loop()
        self.connections = server_state.connections
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Optional[asyncio.Transport] = None
        # requests read and not yet answered; a refusal is queued as (None, its response bytes, ...)
        self.pending: deque[tuple[Optional[str], bytes, Optional[bytes], bool, Optional[str], Optional[str], int]] = \
            deque()
        self.busy = False
        self.closing = False
        self.refused = False       # a refusal is queued: nothing more is parsed on this connection
        self.read_paused = False
        self.writable: Optional[asyncio.Future] = None  # set while the transport's buffer is over its high mark
        self.write_paused_at = 0.0
        self.idle_since: Optional[float] = None  # loop time the connection went idle; None while a request runs
        self.request_since: Optional[float] = None  # loop time the request being received began
        self.timer: Optional[asyncio.TimerHandle] = None
        self.messages = 0
        self.in_head = False
        self.url, self.chunks, self.size, self.expect_continue = b"", [], 0, False
        self.head_size, self.header_count = 0, 0
        self.api_key: Optional[str] = None
        self.request_id: Optional[str] = None
        self.content_type: Optional[bytes] = None
        self.accept: Optional[bytes] = None

    # connection events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(self)
        self.transport = transport  # type: ignore[assignment]
        self.idle_since = self.loop.time()
        self.timer = self.loop.call_later(self.period_s, self._check_timers)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.connections.discard(self)
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)  # the answering task sees the transport closing and ends

    def pause_writing(self) -> None:
        self.writable = self.loop.create_future()
        self.write_paused_at = self.loop.time()
        self._flow()

    def resume_writing(self) -> None:
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None
        self._flow()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after the responses in progress."""
        self.closing = True
        if not self.busy and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # lingering after a refusal: dropped
        self.idle_since = None
        spanning, message = self.in_head, self.messages
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrades are not supported", "bad_request")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"malformed HTTP request: {exc}", "bad_request")
        else:
            if spanning and self.in_head and message == self.messages:  # this whole read was one request's head
                self.head_size += len(data)
                if self.head_size > self.max_url + self.max_head + _SPARE_HEAD_BYTES:
                    self._refuse(431, f"request headers over {self.max_head} bytes", "headers_too_large")

    # parser callbacks
    def on_message_begin(self) -> None:
        self.messages += 1
        self.in_head = True
        self.request_since = self.loop.time()
        self.url, self.chunks, self.size, self.expect_continue = b"", [], 0, False
        self.head_size, self.header_count = 0, 0
        self.api_key, self.request_id, self.content_type, self.accept = None, None, None, None

    def on_url(self, url: bytes) -> None:
        if len(self.url) + len(url) > self.max_url:
            self._refuse(414, f"request target over {self.max_url} bytes", "uri_too_long")
        elif not self.refused:
            self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value)
        self.header_count += 1
        if self.head_size > self.max_head or self.header_count > self.max_headers:
            self._refuse(431, f"request headers over {self.max_head} bytes or {self.max_headers} lines",
                         "headers_too_large")
            return
        if len(name) not in _KEPT_SIZES:  # most headers are ruled out by their length, without lowering the name
            return
        name = name.lower()
        if name == b"authorization":
            self.api_key = bearer(value) or self.api_key
        elif name == b"x-api-key":
            self.api_key = self.api_key or value.strip().decode("latin-1")
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True
        elif name == b"x-request-id":
            self.request_id = request_id(value)
        elif name == b"content-length" and value.strip().isdigit() and int(value) > self.max_body:
            self._refuse(413, f"request body of {int(value)} bytes is over {self.max_body}; send a smaller one",
                         "body_too_large")
        elif name == b"content-type" and self.arrow_media and value != JSON:  # JSON, the usual one, is media 0
            self.content_type = value
        elif name == b"accept" and self.arrow_media:
            self.accept = value

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.expect_continue and not self.refused:  # curl asks before sending bodies over 1 kB
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[union-attr]

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= self.max_body:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        self.request_since = None
        body = b"".join(self.chunks) if self.size <= self.max_body else None
        media = media_of(self.content_type, self.accept) if self.content_type or self.accept else 0
        self.pending.append((self.parser.get_method().decode(), self.url, body, self.parser.should_keep_alive(),
                             self.api_key, self.request_id, media))
        if len(self.pending) >= self.max_pipelined:
            self._flow()
        if not self.busy:
            self.busy = True
            if not self._answer_soon():
                self.loop.create_task(self._answer())

    # responses
    def _answer_soon(self) -> bool:
        """Hand the first pending request to the app's `answer_soon` (the feature server's one-row reads: answered
        from a callback, with no task); False when the app leaves it to `_answer`."""
        method, url, body, _, api_key, _, media = self.pending[0]
        return self.answer_soon is not None and method is not None and self.writable is None \
            and self.answer_soon(method, url, body, api_key, self._answered_soon, media)

    def _answered_soon(self, answer: tuple) -> None:
        """Write what `answer_soon` answered, then go on with the requests that came meanwhile."""
        method, _, _, keep_alive, _, _, _ = self.pending.popleft()
        if self.read_paused:
            self._flow()
        if self._write(method, keep_alive, *answer) and (self.pending or self.writable is not None):
            self.loop.create_task(self._answer(written=True))
            return
        self.busy = False
        self.idle_since = self.loop.time()

    async def _answer(self, written: bool = False) -> None:
        """Answer the pending requests of this connection in order, each with one write; `written`: an answer was
        just written (by `_answered_soon`)."""
        transport = self.transport
        if written and self.writable is not None:  # the client reads slower than we answer: wait for it
            await self.writable
        while self.pending and not transport.is_closing():  # type: ignore[union-attr]
            method, url, body, keep_alive, api_key, request_id, media = self.pending.popleft()
            if self.read_paused:
                self._flow()
            if method is None:  # a refusal: its response, then no more on this connection
                self._write_last(url)
                break
            try:
                path = httptools.parse_url(url).path.decode("latin-1")
            except httptools.HttpParserInvalidURLError:
                status, payload, kind, headers = 400, error_json(f"invalid URL {url[:200]!r}", "bad_request"), \
                    JSON, ()
            else:
                extra = (media,) if self.arrow_media else ()
                status, payload, kind, headers = await self.app.respond(method, path, body, api_key, request_id,
                                                                        *extra)
            if not self._write(method, keep_alive, status, payload, kind, headers):
                break
            if self.writable is not None:  # the client reads slower than we answer: wait for it
                await self.writable
        self.busy = False
        self.idle_since = self.loop.time()

    def _write(self, method: str, keep_alive: bool, status: int, payload: bytes, kind: bytes, headers) -> bool:
        """One response in one write; False when the connection ends (closed after it, or by the client while
        we were answering)."""
        transport = self.transport
        if transport.is_closing():  # type: ignore[union-attr]
            return False
        close = not keep_alive or self.closing
        transport.write(_head(status, kind, len(payload), close, headers)  # type: ignore[union-attr]
                        + (b"" if method == "HEAD" else payload))
        if close:
            transport.close()  # type: ignore[union-attr]
        return not close

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Queue a JSON error after the answers owed, then stop parsing this connection."""
        if self.refused:
            return
        self.refused, self.in_head, self.request_since = True, False, None
        payload = error_json(message, code)
        self.pending.append((None, _head(status, JSON, len(payload), True) + payload, None, False, None, None, 0))
        if not self.busy:
            self.busy = True
            self.loop.create_task(self._answer())

    def _write_last(self, response: bytes) -> None:
        """Write a refusal, end our side, and close once the client had `LINGER_S` to read it: closing at once
        with its unread bytes still arriving would reset the connection and lose the answer."""
        transport = self.transport
        transport.write(response)  # type: ignore[union-attr]
        if transport.can_write_eof():  # type: ignore[union-attr]
            transport.write_eof()  # type: ignore[union-attr]
        self.loop.call_later(LINGER_S, transport.close)  # type: ignore[union-attr]

    def _flow(self) -> None:
        """Read only while the client reads its answers and fewer than `max_pipelined` wait for one."""
        stop = self.writable is not None or len(self.pending) >= self.max_pipelined
        if stop != self.read_paused and not self.refused and not self.transport.is_closing():  # type: ignore
            if stop:
                self.transport.pause_reading()  # type: ignore[union-attr]
            else:
                self.transport.resume_reading()  # type: ignore[union-attr]
            self.read_paused = stop

    def _check_timers(self) -> None:
        """One timer per connection, re-armed when it fires, rather than one set and cancelled per request (about
        3 us each on uvloop): it closes a connection idle for `keep_alive_s`, answers 408 to a request not whole
        within `request_timeout_s`, and drops a client that has not read its answers for as long. It never waits
        longer than the shorter of the two, so a deadline that begins between two firings is still met exactly."""
        if self.closing or self.refused:
            return
        now, timeout = self.loop.time(), self.request_timeout_s
        if self.request_since is not None:
            wait = self.request_since + timeout - now
            if wait <= TIMER_SLACK_S:
                self._refuse(408, f"the request was not received whole within {timeout:g} s", "request_timeout")
                return
        elif self.writable is not None:
            wait = self.write_paused_at + timeout - now
            if wait <= TIMER_SLACK_S:
                self.transport.abort()  # type: ignore[union-attr]
                return
        elif self.idle_since is not None and not self.busy:
            wait = self.idle_since + self.keep_alive_s - now
            if wait <= TIMER_SLACK_S:
                self.transport.close()  # type: ignore[union-attr]
                return
        else:
            wait = timeout
        self.timer = self.loop.call_later(min(wait, self.period_s), self._check_timers)


def _head(status: int, kind: bytes, length: int, close: bool, headers=()) -> bytes:
    """The status line and headers; `headers` are extra (name, value) pairs (Retry-After, WWW-Authenticate). Heads
    without extra headers are filled into a template kept per status, type and close (one `%d`)."""
    if not headers:
        template = _TEMPLATES.get((status, kind, close))
        if template is None:
            template = _TEMPLATES[(status, kind, close)] = _template(status, kind, b"", close)
        return template % length
    return _template(status, kind, b"".join(b"%s: %s\r\n" % pair for pair in headers), close) % length


def _template(status: int, kind: bytes, extra: bytes, close: bool) -> bytes:
    """A response head with `%d` where its content length goes."""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %%d\r\n%s%s\r\n"
            % (status, _REASONS.get(status, b""), kind, extra.replace(b"%", b"%%"),
               b"connection: close\r\n" if close else b""))
