"""The sync client's connection: a short busy poll, then poll(2) up to the timeout; large commands and replies
cross the non-blocking socket whole."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import hiredis
import pytest

from redis_store.errors import RedisUnavailableError
from redis_store.node import SyncNode
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
