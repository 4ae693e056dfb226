"""One Redis server, spoken to directly: packed commands out, hiredis-parsed replies in, bounded waits. The one
client stack of our own protocol work: the SDK and both servers read through it, materialization and the
streaming sink write through it.

redis-py's pipeline costs more than the round trip itself for one small HMGET (about 50 us against 17 us on
loopback), so the hot path writes pre-packed RESP bytes to a socket and parses replies with `hiredis.Reader`.
Sync callers take a connection from a small pool (one per concurrent thread); async callers share one
connection per node, whose replies come back in order (Redis answers each connection FIFO), so concurrent
requests pipeline on their own. Bulk writers hold a `Connection` each.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import ssl
import time
from collections import deque
from typing import Callable, Optional

import hiredis

from redis_store.errors import RedisReplyError, RedisUnavailableError
from redis_store.settings import RedisSettings, auth_hint

logger = logging.getLogger(__name__)

PING = hiredis.pack_command((b"PING",))
TIMER_SLACK_S = 0.001  # asyncio's timers fire up to a millisecond early


def check_replies(replies: list, where: str) -> list:
    """Redis answered, but with an error (wrong key type, auth...): not retryable, so say what it was."""
    for reply in replies:
        if isinstance(reply, hiredis.ReplyError):
            raise RedisReplyError(f"redis at {where} answered with an error: {reply}{auth_hint(reply)}")
    return replies


def refused_then_closed(replies: list, where: str) -> Optional[RedisReplyError]:
    """The AUTH refusal among the replies Redis sent before closing the connection (it does so after refusing an
    unauthenticated client's long command), which says more than the close; None when there is none."""
    for reply in replies:
        if isinstance(reply, hiredis.ReplyError) and auth_hint(reply):
            return RedisReplyError(f"redis at {where} answered with an error: {reply}{auth_hint(reply)}")
    return None


def unavailable(where: str, exc: BaseException, timeout_s: float, tls: bool = False) -> RedisUnavailableError:
    """What a failed connection, read or write means to a user, and what to do (`tls`: it timed out connecting
    with TLS, as it does against a port that does not speak TLS: Redis waits for a command that never comes)."""
    if tls and isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return RedisUnavailableError(f"TLS with redis at {where} failed (no TLS handshake within {timeout_s:g}s); "
                                     "is it running, and is that its tls-port? ssl=true in "
                                     "online_store.connection_string needs one")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return RedisUnavailableError(f"redis at {where} did not answer within {timeout_s:g}s; is it overloaded "
                                     "or stopped? retry later")
    if isinstance(exc, ssl.SSLError):
        return RedisUnavailableError(f"TLS with redis at {where} failed ({exc}); check ssl=true and ssl_ca_certs "
                                     "(and ssl_certfile/ssl_keyfile) in online_store.connection_string")
    if isinstance(exc, ConnectionResetError):  # a TLS port hangs up on a plain connection's first command
        return RedisUnavailableError(f"cannot reach redis at {where} ({exc}); is it running? (a port that takes "
                                     "only TLS hangs up without ssl=true in online_store.connection_string)")
    return RedisUnavailableError(f"cannot reach redis at {where} ({exc}); is it running? "
                                 "(`featurectl services up` starts the local one)")


class Connection:
    """A non-blocking socket and its reply parser. A read first polls the socket for `spin_s` without sleeping,
    then waits in poll(2) up to the timeout: on a virtual machine a thread that sleeps for a reply pays the wake-up
    of an idle vCPU (about 50 us here, more than Redis's answer), so a short spin halves a small request's round
    trip. Spinning costs CPU only while a reply is awaited, and never longer than `spin_s`. Error replies come
    back as `hiredis.ReplyError` values among the others; socket failures raise OSError."""

    def __init__(self, settings: RedisSettings, address: tuple[str, int]):
        sock = socket.create_connection(address, timeout=settings.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.reader = hiredis.Reader()
        self.timeout_s, self.spin_s = settings.timeout_s, settings.spin_s
        self.where = f"{address[0]}:{address[1]}"
        try:
            if settings.ssl_context is not None:
                try:
                    self.sock = settings.ssl_context.wrap_socket(sock, server_hostname=address[0])
                except TimeoutError as exc:
                    raise unavailable(self.where, exc, settings.connect_timeout_s, tls=True) from exc
            self.sock.setblocking(False)
            self.poller = select.poll()
            self.poller.register(self.sock, select.POLLIN)
            handshake = settings.handshake()
            if handshake:
                self.write(b"".join(handshake))
                check_replies(self.read(len(handshake)), self.where)
        except BaseException:
            sock.close()
            raise

    def write(self, payload: bytes) -> None:
        view, deadline = memoryview(payload), None
        while view:
            try:
                view = view[self.sock.send(view):]
            except (BlockingIOError, ssl.SSLWantWriteError):
                deadline = deadline or time.monotonic() + self.timeout_s
                self._wait(select.POLLOUT, deadline)

    def read(self, count: int) -> list:
        replies, reader = [], self.reader
        spin_until, deadline = time.perf_counter() + self.spin_s, None
        while len(replies) < count:
            reply = reader.gets()
            if reply is not False:
                replies.append(reply)
                continue
            try:
                data, deadline = self._recv(spin_until, deadline)
            except ConnectionResetError:
                refusal = refused_then_closed(replies, self.where)
                if refusal is None:
                    raise
                self.close()
                raise refusal from None
            reader.feed(data)
        return replies

    def read_expected(self, expected: bytes, count: int) -> Optional[list]:
        """The next `count` replies; None when their bytes are exactly `expected` (e.g. `count` times `+OK`), known
        without parsing one reply each."""
        received = bytearray()
        spin_until, deadline = time.perf_counter() + self.spin_s, None
        while len(received) < len(expected) and expected.startswith(received):
            data, deadline = self._recv(spin_until, deadline)
            received += data
        if received == expected:
            return None
        self.reader.feed(bytes(received))
        return self.read(count)

    def _recv(self, spin_until: float, deadline: Optional[float]) -> tuple[bytes, Optional[float]]:
        """What the socket has (at least a byte): spinning until `spin_until`, then waiting in poll(2) until the
        read's deadline (set at its first wait, `timeout_s` later)."""
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, ssl.SSLWantReadError):
                if time.perf_counter() < spin_until:
                    continue
                deadline = deadline or time.monotonic() + self.timeout_s
                self._wait(select.POLLIN, deadline)
                continue
            if not data:
                raise ConnectionResetError("connection closed by redis")
            return data, deadline

    def _wait(self, event: int, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.poller.modify(self.sock, event)
        self.poller.poll(left * 1000)

    def close(self) -> None:
        self.sock.close()


class SyncNode:
    """A pool of blocking connections to one server; a connection that failed is dropped, never reused."""

    def __init__(self, settings: RedisSettings, address: tuple[str, int], max_idle: int = 8):
        self.settings = settings
        self.address = address
        self.where = f"{address[0]}:{address[1]}"
        self._idle: list[Connection] = []
        self._max_idle = max_idle

    def send(self, commands: list[bytes]) -> tuple[Connection, bool, bytes]:
        """Write the commands; `receive` reads the replies (so a cluster can write to every node first)."""
        payload = b"".join(commands)
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = None
        if conn is not None:
            try:
                conn.write(payload)
                return conn, True, payload
            except OSError:  # closed by the server since it was pooled
                conn.close()
        conn = self._connect()
        self._write(conn, payload)
        return conn, False, payload

    def receive(self, pending: tuple[Connection, bool, bytes], count: int) -> list:
        conn, pooled, payload = pending
        try:
            replies = conn.read(count)
        except (OSError, hiredis.ProtocolError) as exc:
            conn.close()
            if pooled and not isinstance(exc, TimeoutError):
                # a pooled connection the server closed since (restart, idle timeout): one fresh try
                fresh = self._connect()
                self._write(fresh, payload)
                return self.receive((fresh, False, payload), count)
            raise unavailable(self.where, exc, self.settings.timeout_s) from exc
        if len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()
        return replies

    def _connect(self) -> Connection:
        try:
            return Connection(self.settings, self.address)
        except OSError as exc:
            raise unavailable(self.where, exc, self.settings.connect_timeout_s) from exc

    def _write(self, conn: Connection, payload: bytes) -> None:
        try:
            conn.write(payload)
        except OSError as exc:
            conn.close()
            raise unavailable(self.where, exc, self.settings.timeout_s) from exc

    def execute(self, commands: list[bytes]) -> list:
        return self.receive(self.send(commands), len(commands))

    def read(self, keys: list[bytes], commands: list[bytes]) -> list:
        """The replies to `commands` (one per key), in order; the keys matter only to a cluster."""
        return check_replies(self.execute(commands), self.where)

    def ping(self) -> None:
        check_replies(self.execute([PING]), self.where)

    def info(self, section: str = "server") -> dict[str, str]:
        """`INFO section` as field -> value (e.g. `redis_version`, `run_id`)."""
        [reply] = self.read([], [hiredis.pack_command(("INFO", section))])
        return dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


Answered = Callable[[Optional[list], Optional[BaseException]], None]  # (replies, None) or (None, the failure)


class _Callback:
    """A waiter that hands its replies (or its failure) straight to a function, from the reply's own
    `data_received`: no future, no done-callback, no handle and no loop turn between the reply and the answer.
    Quacks like the future `_ReplyProtocol` otherwise keeps (`done`, `set_result`, `set_exception`); a function
    that raises is logged, never let into the protocol, whose other waiters it would fail."""

    __slots__ = ("answered", "called")

    def __init__(self, answered: Answered):
        self.answered = answered
        self.called = False

    def done(self) -> bool:
        return self.called

    def set_result(self, replies: list) -> None:
        self._call(replies, None)

    def set_exception(self, error: BaseException) -> None:
        self._call(None, error)

    def _call(self, replies: Optional[list], error: Optional[BaseException]) -> None:
        self.called = True
        try:
            self.answered(replies, error)
        except Exception:
            logger.exception("the answer to a redis reply failed")


class _ReplyProtocol(asyncio.Protocol):
    """Feeds replies to the requests waiting on this connection, in the order they were written.

    Requests made in the same turn of the event loop go out in one write (one packet, one wake-up of Redis),
    and one timer per connection, not one per request, fails the oldest request left unanswered `timeout_s`.
    """

    def __init__(self, where: str, loop: asyncio.AbstractEventLoop, timeout_s: float):
        self.where = where
        self.loop = loop  # kept: asyncio.get_running_loop() costs a getpid() system call on Python 3.11
        self.timeout_s = timeout_s
        self.reader = hiredis.Reader()
        self.waiting: deque = deque()  # [future, count, replies, deadline]
        self.outbox: list[bytes] = []  # commands written at the end of this turn of the loop
        self.transport: Optional[asyncio.Transport] = None
        self.lost = False
        self.watchdog: Optional[asyncio.TimerHandle] = None  # armed for the oldest unanswered request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, commands: list[bytes], waiter: Optional[_Callback] = None) -> asyncio.Future | _Callback:
        """The future of the replies to `commands`; with `waiter`, they go to it instead (and the future returned
        is that waiter)."""
        future = waiter or self.loop.create_future()
        deadline = self.loop.time() + self.timeout_s
        self.waiting.append([future, len(commands), [], deadline])
        if not self.outbox:
            self.loop.call_soon(self._flush)
        self.outbox += commands
        if self.watchdog is None:
            self.watchdog = self.loop.call_at(deadline, self._watch)
        return future

    def _flush(self) -> None:
        commands, self.outbox = self.outbox, []
        if not self.transport.is_closing():  # type: ignore[union-attr]  # else connection_lost fails the waiters
            self.transport.write(b"".join(commands))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        reader, waiting = self.reader, self.waiting
        reader.feed(data)
        while waiting:
            entry = waiting[0]
            replies, count = entry[2], entry[1]
            while len(replies) < count:
                reply = reader.gets()
                if reply is False:
                    return
                replies.append(reply)
            waiting.popleft()
            if not entry[0].done():
                entry[0].set_result(replies)

    def _watch(self) -> None:
        """Replies come in order, so only the oldest unanswered request can be overdue; when it is not, sleep
        until its deadline."""
        self.watchdog = None
        if self.lost:
            return
        for future, _, _, deadline in self.waiting:
            if future.done():  # its caller gave up (cancelled): its reply no longer matters
                continue
            if deadline <= self.loop.time() + TIMER_SLACK_S:
                # the connection is suspect: close it, so that everyone waiting on it fails fast
                future.set_exception(unavailable(self.where, TimeoutError(), self.timeout_s))
                self.transport.abort()  # type: ignore[union-attr]
            else:
                self.watchdog = self.loop.call_at(deadline, self._watch)
            return

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.lost = True
        if self.watchdog is not None:
            self.watchdog.cancel()
        error = unavailable(self.where, exc or ConnectionResetError("connection closed by redis"), 0)
        while self.waiting:
            future, _, replies, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(refused_then_closed(replies, self.where) or error)


class AsyncNode:
    """One multiplexed connection to one server, opened on first use and reopened after a failure."""

    def __init__(self, settings: RedisSettings, address: tuple[str, int]):
        self.settings = settings
        self.address = address
        self.where = f"{address[0]}:{address[1]}"
        self._protocol: Optional[_ReplyProtocol] = None
        self._connecting: Optional[asyncio.Future] = None

    def is_open(self) -> bool:
        protocol = self._protocol
        return protocol is not None and not protocol.lost and not protocol.transport.is_closing()  # type: ignore

    async def _connection(self) -> _ReplyProtocol:
        if self.is_open():
            return self._protocol  # type: ignore[return-value]
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> _ReplyProtocol:
        loop = asyncio.get_running_loop()
        context = self.settings.ssl_context
        tls = {"ssl": context, "server_hostname": self.address[0]} if context is not None else {}
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: _ReplyProtocol(self.where, loop, self.settings.timeout_s),
                                       *self.address, **tls),
                self.settings.connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise unavailable(self.where, exc, self.settings.connect_timeout_s, context is not None) from exc
        handshake = self.settings.handshake()
        if handshake:
            try:
                check_replies(await protocol.request(handshake), self.where)
            except BaseException:
                protocol.transport.close()  # type: ignore[union-attr]
                raise
        self._protocol = protocol
        return protocol

    def submit(self, commands: list[bytes], answered: Answered) -> None:
        """Hand the replies to `commands` (not checked: `check_replies`), or the failure (`RedisUnavailableError`
        within the timeout, the connection's loss), to `answered`, called from the reply's own callback: no
        coroutine, task, future or loop turn on the way. Only while the connection `is_open` (`execute` opens
        one)."""
        self._protocol.request(commands, _Callback(answered))  # type: ignore[union-attr]

    async def execute(self, commands: list[bytes]) -> list:
        return await (await self._connection()).request(commands)

    async def read(self, keys: list[bytes], commands: list[bytes]) -> list:
        return check_replies(await self.execute(commands), self.where)

    async def ping(self) -> None:
        check_replies(await self.execute([PING]), self.where)

    async def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None
