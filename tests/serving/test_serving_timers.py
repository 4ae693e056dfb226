"""The per-connection timers and write coalescing of the async Redis connection and the HTTP protocol, without
sockets: requests of one loop turn share a write, one timer fails the oldest unanswered request, and a keep-alive
connection closes once idle (never while a request is answered)."""

from __future__ import annotations

import asyncio
import types

import hiredis
import pytest

from common.config import HttpSettings
from fake_transport import FakeTransport
from redis_store.errors import RedisUnavailableError
from redis_store.node import _ReplyProtocol
from serving.http_app import FeatureServer
from serving.http_protocol import HttpProtocol


def _connected(protocol):
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport


def _redis_connection(timeout_s: float) -> tuple[_ReplyProtocol, FakeTransport]:
    return _connected(_ReplyProtocol("test:6379", asyncio.get_running_loop(), timeout_s))


def test_requests_of_one_loop_turn_share_one_write_and_get_their_own_replies():
    async def scenario():
        protocol, transport = _redis_connection(1.0)
        first = protocol.request([hiredis.pack_command((b"GET", b"a"))])
        second = protocol.request([hiredis.pack_command((b"GET", b"b")), hiredis.pack_command((b"GET", b"c"))])
        assert transport.writes == []  # written at the end of this turn, not one by one
        await asyncio.sleep(0)
        assert transport.writes == [b"".join(hiredis.pack_command((b"GET", k)) for k in (b"a", b"b", b"c"))]
        protocol.data_received(b"$1\r\n1\r\n$1\r\n2\r\n")
        assert await first == [b"1"] and not second.done()
        protocol.data_received(b"$1\r\n3\r\n")
        assert await second == [b"2", b"3"]
        protocol.connection_lost(None)

    asyncio.run(scenario())


def test_one_timer_fails_the_oldest_unanswered_request_and_closes_the_connection():
    async def scenario():
        protocol, transport = _redis_connection(0.5)
        answered = protocol.request([b"PING"])
        watchdog = protocol.watchdog
        late = protocol.request([b"PING"])
        assert protocol.watchdog is watchdog  # one timer per connection, not one per request
        await asyncio.sleep(0.05)
        protocol.data_received(b"+PONG\r\n")
        assert await answered == [b"PONG"]
        with pytest.raises(RedisUnavailableError, match="did not answer within"):
            await asyncio.wait_for(late, 5.0)
        assert transport.aborted

    asyncio.run(scenario())


def test_a_cancelled_request_does_not_expire_the_connection():
    async def scenario():
        protocol, transport = _redis_connection(0.05)
        protocol.request([b"PING"]).cancel()
        await asyncio.sleep(0.1)
        assert not transport.aborted
        protocol.data_received(b"+PONG\r\n")  # its late reply is dropped; the connection keeps serving
        follower = protocol.request([b"PING"])
        await asyncio.sleep(0)
        protocol.data_received(b"+PONG\r\n")
        assert await follower == [b"PONG"] and not transport.aborted
        protocol.connection_lost(None)

    asyncio.run(scenario())


def _http_connection(keep_alive_s: float) -> tuple[HttpProtocol, FakeTransport]:
    app = FeatureServer(lambda: None, http=HttpSettings(keep_alive_s=keep_alive_s))
    config = types.SimpleNamespace(loaded_app=app)
    return _connected(HttpProtocol(config, types.SimpleNamespace(connections=set()),
                                   _loop=asyncio.get_running_loop()))


def test_keep_alive_connections_close_once_idle_for_the_timeout():
    async def scenario():
        protocol, transport = _http_connection(0.6)
        await asyncio.sleep(0.4)
        protocol.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.01)
        assert transport.writes and transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
        await asyncio.sleep(0.3)  # 0.7 s after connecting but only 0.3 s idle: still open
        assert not transport.closed
        await asyncio.sleep(0.6)
        assert transport.closed

    asyncio.run(scenario())


def test_a_connection_with_a_request_half_received_is_not_idle():
    async def scenario():
        protocol, transport = _http_connection(0.05)
        protocol.data_received(b"GET /health HTTP/1.1\r\n")
        await asyncio.sleep(0.15)
        assert not transport.closed
        protocol.data_received(b"Host: x\r\n\r\n")
        await asyncio.sleep(0.12)
        assert transport.writes and transport.closed

    asyncio.run(scenario())
