"""Chunks of prebuilt HSET commands -> one Redis node, each chunk atomic and never older than what Redis holds.

Per chunk, two round trips on one connection: `WATCH` the keys and `HGET` their `_ts:{view}`; drop the rows whose
stored event time is newer than ours; `MULTI`, the remaining HSETs, `EXEC`. If anyone (a streaming writer, another
materialization) writes one of the watched keys in between, Redis refuses the EXEC and the chunk is checked
again, so an older row never overwrites a newer one even under concurrent writers. This is Redis's own optimistic
locking, much cheaper on the server than a Lua script that receives every value as an argument.

The commands arrive as Arrow binary arrays whose data buffer is the RESP stream itself (`serving.redis_columns`);
they go to the socket without a copy and the replies are parsed by hiredis, so the Python cost per row is a few
hundred nanoseconds. The writer runs on its own thread so that encoding the next batch overlaps Redis's work.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Optional

import hiredis
import numpy as np
import pyarrow as pa

from serving import redis_columns as columns
from serving.redis_layout import decode_timestamp_ms

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_UNWATCH = b"*1\r\n$7\r\nUNWATCH\r\n"
ATTEMPTS = 20


@dataclass(frozen=True)
class RowCommands:
    """Per row: the key as a RESP bulk string, the event time in ms, the HGET of its `_ts`, the whole HSET."""

    key_bulks: pa.BinaryArray
    millis: np.ndarray
    reads: pa.BinaryArray
    writes: pa.BinaryArray

    def __len__(self) -> int:
        return len(self.millis)

    def slice(self, lo: int, size: int) -> "RowCommands":
        return RowCommands(self.key_bulks.slice(lo, size), self.millis[lo:lo + size], self.reads.slice(lo, size),
                           self.writes.slice(lo, size))


class RedisWriteError(RuntimeError):
    """Redis refused a write, or kept changing the keys of a chunk; the message says which and what to do."""


class CheckedChunkWriter:
    """Writes chunks of RowCommands from background threads; `close` returns the rows written.

    Several connections work at once so that Redis never waits on one chunk's round trips; rows of one entity in
    chunks handled by different connections stay correct because each chunk is check-and-set atomically."""

    def __init__(self, client, connections: int = 3, depth: int = 64):
        self.pending: "queue.Queue[Optional[RowCommands]]" = queue.Queue(maxsize=depth)
        self.written = self.skipped_older = self.retries = 0
        self.error: Optional[BaseException] = None
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, name=f"redis-writer-{i}", daemon=True)
                         for i in range(connections)]
        for thread in self._threads:
            thread.start()

    def send(self, rows: RowCommands) -> None:
        if self.error:
            raise self.error
        self.pending.put(rows)

    def close(self) -> int:
        for _ in self._threads:
            self.pending.put(None)
        for thread in self._threads:
            thread.join()
        if self.error:
            raise self.error
        return self.written

    def _run(self) -> None:
        conn = self._pool.get_connection()
        try:
            conn.connect()
            channel = _Channel(conn)
            while (rows := self.pending.get()) is not None:
                if self.error:
                    continue
                written, skipped, retries = self._write(channel, rows)
                with self._lock:
                    self.written += written
                    self.skipped_older += skipped
                    self.retries += retries
        except BaseException as exc:  # surfaced to the caller by send() or close()
            self.error = exc
            conn.disconnect()
            while self.pending.get() is not None:
                pass
        finally:
            self._pool.release(conn)

    def _write(self, channel: "_Channel", rows: RowCommands) -> tuple[int, int, int]:
        """(rows written, rows skipped as older than Redis's, attempts refused by a concurrent write)."""
        n = len(rows)
        check = [columns.variadic_head(b"WATCH", n), columns.command_bytes(rows.key_bulks, 0, n),
                 columns.command_bytes(rows.reads, 0, n)]
        for attempt in range(ATTEMPTS):
            keep = _not_older(channel.round_trip(check, 1 + n)[1:], rows.millis)
            if len(keep) == 0:
                channel.round_trip([_UNWATCH], 1)
                return 0, n, attempt
            body = rows.writes if len(keep) == n else rows.writes.take(pa.array(keep))
            replies = channel.round_trip([_MULTI, columns.command_bytes(body, 0, len(body)), _EXEC], len(body) + 2)
            if replies[-1] is not None:
                failed = [r for r in replies[-1] if isinstance(r, hiredis.ReplyError)]
                if failed:
                    raise RedisWriteError(f"Redis refused {len(failed)} writes of a chunk: {failed[0]}")
                return len(body), n - len(body), attempt
        raise RedisWriteError(f"{ATTEMPTS} attempts to write a chunk of {n} keys were refused because other "
                              f"clients kept writing the same keys; retry when that writer is idle")


def _not_older(stored: list, millis: np.ndarray) -> np.ndarray:
    """Rows whose stored `_ts` is missing or not newer than ours (an equal time rewrites the same values)."""
    present = [i for i, value in enumerate(stored) if value is not None]
    if not present:
        return np.arange(len(stored))
    keep = np.ones(len(stored), dtype=bool)
    existing = np.array([decode_timestamp_ms(stored[i]) for i in present], dtype=np.int64)
    keep[present] = existing <= millis[present]
    return np.flatnonzero(keep)


class _Channel:
    """Raw RESP on a connection redis-py has opened, authenticated and (if configured) wrapped in TLS: the
    replies of a chunk are parsed by hiredis in one loop instead of one redis-py call per reply."""

    def __init__(self, conn):
        self.sock = conn._sock
        self.reader = hiredis.Reader()
        self.buffer = bytearray(1 << 20)

    def round_trip(self, payload: list, replies: int) -> list:
        """Send, then read exactly `replies` replies; a Redis error reply becomes a RedisWriteError."""
        for part in payload:
            self.sock.sendall(part)
        out = []
        while len(out) < replies:
            reply = self.reader.gets()
            if reply is False:
                size = self.sock.recv_into(self.buffer)
                if not size:
                    raise ConnectionError("Redis closed the connection while materializing")
                self.reader.feed(self.buffer, 0, size)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RedisWriteError(f"Redis refused a write: {reply}")
            out.append(reply)
        return out
