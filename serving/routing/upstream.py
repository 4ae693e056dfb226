"""The gateway's HTTP/1.1 client: keep-alive connections to one replica, reused across requests.

An asyncio protocol with httptools' response parser (the servers' own parser), one request in flight per
connection, idle connections kept for the next request: none of a general client's layers per request (httpx's
async client goes through httpcore and anyio each time), as the gateway's whole budget is 1 ms (`featurectl bench
gateway` measures what it adds).
Idle connections are dropped after `idle_s`, shorter than the replicas' keep-alive, so a request is not sent on a
connection the replica is closing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Optional

import httptools

# response headers the gateway writes itself (or that belong to one hop) rather than passing on
_OWN_HEADERS = frozenset((b"content-type", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
                          b"date", b"server"))


class ReplicaUnreachable(Exception):
    """No connection to the replica: the request was never sent, so any request may go elsewhere."""


class ReplicaFailed(Exception):
    """The request was sent and no whole answer came back (reset, closed, timed out): the replica may have
    started it."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: bytes
    headers: list[tuple[bytes, bytes]]  # the replica's other headers, to pass on


class _Connection(asyncio.Protocol):
    """One keep-alive connection; `send` returns a future settled with the answer or a `ReplicaFailed`."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: Optional[asyncio.Transport] = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: Optional[asyncio.Future] = None
        self.closed = False
        self.keep_alive = False  # the last answer allows another request on this connection
        self.idle_since = 0.0
        self.content_type = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        self.fail(f"the replica closed the connection ({exc or 'end of stream'}) before answering")

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail(f"the replica's answer is not HTTP ({exc})")
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.content_type = value
        elif name not in _OWN_HEADERS:
            self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:  # an interim answer (100 Continue): the final one follows
            self.content_type, self.headers, self.chunks = b"", [], []
            return
        self.keep_alive = self.parser.should_keep_alive()  # read here: the parser forgets it once reset
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Answer(self.parser.get_status_code(), b"".join(self.chunks), self.content_type,
                                          self.headers))

    def send(self, request: bytes) -> asyncio.Future:
        self.content_type, self.headers, self.chunks, self.keep_alive = b"", [], [], False
        self.waiter = self.loop.create_future()
        self.transport.write(request)  # type: ignore[union-attr]
        return self.waiter

    def reusable(self) -> bool:
        return not self.closed and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def fail(self, why: str) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ReplicaFailed(why))


class ReplicaClient:
    """Requests to one replica (`host:port`) over a pool of keep-alive connections."""

    def __init__(self, host: str, port: int, connect_timeout_s: float = 1.0, idle_s: float = 15.0,
                 max_idle: int = 64):
        self.host, self.port = host, port
        self.connect_timeout_s, self.idle_s, self.max_idle = connect_timeout_s, idle_s, max_idle
        self.idle: deque[_Connection] = deque()
        self._host_header = f"{host}:{port}".encode()

    async def request(self, method: str, path: str, body: bytes = b"", headers: bytes = b"",
                      timeout_s: float = 60.0) -> Answer:
        """The replica's answer; `headers`: extra header lines, each ending with CRLF. Raises `ReplicaUnreachable`
        (never sent) or `ReplicaFailed` (sent, no whole answer within `timeout_s`)."""
        conn = await self._connection()
        request = b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
            method.encode(), path.encode("latin-1"), self._host_header, len(body), headers, body)
        waiter = conn.send(request)
        timer = conn.loop.call_later(timeout_s, conn.fail, f"no answer within {timeout_s:g} s")
        try:
            answer = await waiter
        except BaseException:  # failed, timed out or cancelled: the connection's state is unknown
            conn.close()
            raise
        finally:
            timer.cancel()
        if conn.reusable() and len(self.idle) < self.max_idle:
            conn.idle_since = conn.loop.time()
            self.idle.append(conn)
        else:
            conn.close()
        return answer

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        while self.idle:
            conn = self.idle.pop()  # the most recently used: the least likely to be closing
            if not conn.closed and loop.time() - conn.idle_since < self.idle_s:
                return conn
            conn.close()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self.host, self.port), self.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise ReplicaUnreachable(f"cannot connect to {self.host}:{self.port} ({exc or 'timed out'})") from None
        return conn

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()
