"""The sync client's connection: a short busy poll, then poll(2) up to the timeout; large commands and replies
cross the non-blocking socket whole. The async node's `submit`: replies handed to a function from the reply's own
callback, in order, a function that raises kept out of the connection, the timeout's failure handed over too."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import hiredis
import pytest

from redis_store.errors import RedisUnavailableError
from redis_store.node import AsyncNode, SyncNode
from redis_store.settings import RedisSettings


def _fake_redis(answer_after_s: float | None) -> tuple[socket.socket, tuple[str, int]]:
    """A server that reads one command and answers +PONG after a delay (None: never answers)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            if answer_after_s is None:
                time.sleep(3)
                return
            time.sleep(answer_after_s)
            conn.sendall(b"+PONG\r\n")
            time.sleep(0.5)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()


def test_a_reply_later_than_the_spin_is_still_read():
    server, (host, port) = _fake_redis(answer_after_s=0.05)
    with server:
        settings = RedisSettings(((host, port),), timeout_s=1.0, spin_s=0.0002)
        node = SyncNode(settings, (host, port))
        assert node.execute([hiredis.pack_command((b"PING",))]) == [b"PONG"]
        node.close()


def test_no_reply_fails_within_the_timeout_with_the_reason():
    server, (host, port) = _fake_redis(answer_after_s=None)
    with server:
        settings = RedisSettings(((host, port),), timeout_s=0.2, spin_s=0.0002)
        node = SyncNode(settings, (host, port))
        started = time.monotonic()
        with pytest.raises(RedisUnavailableError, match="did not answer within 0.2s"):
            node.ping()
        assert time.monotonic() - started < 1.5


@pytest.mark.integration
def test_large_commands_and_replies_cross_whole(local_services):
    host, port = local_services.redis_host_port
    node = SyncNode(RedisSettings(((host, port),), timeout_s=5.0), (host, port))
    key, value = f"big_{uuid.uuid4().hex}".encode(), bytes(range(256)) * 40_000  # 10 MB: many sends and recvs
    try:
        assert node.execute([hiredis.pack_command((b"SET", key, value))]) == [b"OK"]
        assert node.execute([hiredis.pack_command((b"GET", key))]) == [value]
    finally:
        node.execute([hiredis.pack_command((b"DEL", key))])
        node.close()


@pytest.mark.integration
def test_submitted_replies_reach_their_functions_in_order(local_services):
    host, port = local_services.redis_host_port
    key = f"soon_{uuid.uuid4().hex}".encode()

    async def scenario() -> list:
        node = AsyncNode(RedisSettings(((host, port),), timeout_s=5.0), (host, port))
        await node.ping()  # opens the connection: `submit` needs an open one
        answered: list = []
        done = asyncio.get_running_loop().create_future()

        def broken(replies, error):
            raise RuntimeError("a bug in the answering code")

        node.submit([hiredis.pack_command((b"SET", key, b"1"))], lambda replies, error: answered.append(replies))
        node.submit([hiredis.pack_command((b"GET", key))], broken)  # logged; the next one is still answered
        node.submit([hiredis.pack_command((b"GET", key)), hiredis.pack_command((b"DEL", key))],
                    lambda replies, error: (answered.append(replies), done.set_result(error)))
        assert await asyncio.wait_for(done, 5) is None
        assert node.is_open()
        await node.close()
        return answered

    assert asyncio.run(scenario()) == [[b"OK"], [b"1", 1]]


def test_a_submitted_read_without_reply_gets_the_timeout_error():
    server, (host, port) = _fake_redis(answer_after_s=None)

    async def scenario() -> BaseException:
        node = AsyncNode(RedisSettings(((host, port),), timeout_s=0.2), (host, port))
        await node._connection()
        failed = asyncio.get_running_loop().create_future()
        node.submit([hiredis.pack_command((b"PING",))], lambda replies, error: failed.set_result((replies, error)))
        replies, error = await asyncio.wait_for(failed, 2)
        await node.close()
        assert replies is None
        return error

    with server:
        with pytest.raises(RedisUnavailableError, match="did not answer within 0.2s"):
            raise asyncio.run(scenario())
