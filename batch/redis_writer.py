"""Chunks of rows -> one Redis node, each row written only if nothing newer is there, in as few commands as it takes.

New keys first: a chunk's rows that can be (`redis_store.dump`) are sent as `RESTORE key ttl payload` without
REPLACE, which creates the whole hash in one command and refuses a key that exists: that is an atomic "create if
absent", and costs Redis a third of an HSET. The rows refused go the checked way.

Checked, per chunk: `WATCH` the keys and `HGET` their `_ts:{view}`; drop the rows whose stored event time is newer
than ours, and an equal one where a stream may have written it (as Feast's own writer does: a stream's values at
that very instant may hold more events; `RowCommands.newest_replaceable`);
`MULTI`, the remaining HSETs, `EXEC`. If anyone (a streaming writer, another materialization) writes one of the
watched keys in between, Redis refuses the EXEC and the chunk is checked again, so an older row never overwrites
a newer one even under concurrent writers. This is Redis's own optimistic locking, much cheaper on the
server than a Lua script that receives every value as an argument. Checked chunks stay small (64 keys) because
Redis checks each WATCHed key against the connection's others; in steady state one round trip carries one
chunk's transaction and the next chunk's check.

The commands are Arrow binary arrays whose data buffer is the RESP stream itself (`redis_store.columns`); they
go to the socket in one write per round trip on a `redis_store.node.Connection` (the client every part uses)
and the replies are parsed by hiredis, so the Python cost per row is small. Writer threads (one connection each)
run beside the encoding of the next batch."""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import FeaturectlError
from redis_store import columns, dump
from redis_store.dump import Encoded
from redis_store.layout import decode_timestamp_ms
from redis_store.node import Connection, SyncNode, unavailable
from redis_store.settings import RedisSettings

log = logging.getLogger(__name__)

_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
_UNWATCH = b"*1\r\n$7\r\nUNWATCH\r\n"
_OK = b"+OK\r\n"
ATTEMPTS = 20
CHECKED_ROWS = 64  # keys per WATCH: Redis compares each watched key with the connection's others
PROBE_EVERY = 8  # batches between RESTORE attempts once most keys were found to exist


@dataclass(frozen=True)
class RowCommands:
    """Per row: the key as a RESP bulk string, the event time in ms, the HGET of its `_ts`, and the hash's
    values (one column per field); the HSETs when built ahead (`with_writes`). Rows marked `restorable` also
    come as a ready `RESTORE` command. With `key_ttl_s` (Feast's `key_ttl_seconds`), every written key gets
    that expiry, as Feast's writer sets it: an `EXPIRE` after each HSET, the TTL of each RESTORE."""

    key_bulks: pa.BinaryArray
    millis: np.ndarray
    reads: pa.BinaryArray
    fields: Sequence[bytes]
    values: Sequence[Encoded]
    restores: Optional[pa.BinaryArray] = None
    restorable: Optional[np.ndarray] = None
    hsets: Optional[pa.BinaryArray] = None
    key_ttl_s: int = 0
    replace_equal_before_ms: int = -(2**63)

    def __len__(self) -> int:
        return len(self.millis)

    @property
    def commands_per_write(self) -> int:
        return 2 if self.key_ttl_s else 1

    def writes(self) -> pa.BinaryArray:
        """The HSET of every row, each followed by its EXPIRE when keys have a ttl."""
        if self.hsets is not None:
            return self.hsets
        hsets = columns.hset_commands(self.key_bulks, self.fields, self.binary_values())
        if not self.key_ttl_s:
            return hsets
        return pc.binary_join_element_wise(hsets, columns.expire_commands(self.key_bulks, self.key_ttl_s),
                                           pa.scalar(b"", pa.binary()))

    def newest_replaceable(self) -> np.ndarray:
        """Per row, the newest stored `_ts` it may overwrite: one millisecond before its own, or its own when the
        row is older than `replace_equal_before_ms` (no stream writes there, so an equal `_ts` is an earlier
        materialization of the same boundary, and a backfill may have recomputed its values since)."""
        return np.where(self.millis < self.replace_equal_before_ms, self.millis, self.millis - 1)

    def binary_values(self) -> list[pa.BinaryArray]:
        """The values as Arrow columns (one per field)."""
        return [v.binary() if isinstance(v, columns.BoundedValues) else v for v in self.values]

    def keys(self) -> list[bytes]:
        """The rows' keys as bytes (for a cluster's slots)."""
        return [bulk[bulk.index(b"\r\n") + 2:-2] for bulk in self.key_bulks.to_pylist()]

    def with_writes(self) -> "RowCommands":
        """The same rows with their HSETs built in one go (cheaper than chunk by chunk)."""
        return dataclasses.replace(self, hsets=self.writes())

    def slice(self, lo: int, size: int) -> "RowCommands":
        cut = slice(lo, lo + size)
        return RowCommands(self.key_bulks.slice(lo, size), self.millis[cut], self.reads.slice(lo, size), self.fields,
                           [_rows(v, cut) for v in self.values],
                           None if self.restores is None else self.restores.slice(lo, size),
                           None if self.restorable is None else self.restorable[cut],
                           None if self.hsets is None else self.hsets.slice(lo, size), self.key_ttl_s,
                           self.replace_equal_before_ms)

    def take(self, indices: np.ndarray) -> "RowCommands":
        """These rows only, for the checked path (no RESTOREs)."""
        chosen = pa.array(indices)
        return RowCommands(self.key_bulks.take(chosen), self.millis[indices], self.reads.take(chosen), self.fields,
                           [_rows(v, indices) for v in self.values],
                           hsets=None if self.hsets is None else self.hsets.take(chosen), key_ttl_s=self.key_ttl_s,
                           replace_equal_before_ms=self.replace_equal_before_ms)


def _rows(values: Encoded, rows) -> Encoded:
    if isinstance(values, columns.BoundedValues):
        return columns.BoundedValues(values.matrix[rows], values.lengths[rows])
    if isinstance(rows, slice):
        return values.slice(rows.start, rows.stop - rows.start)
    return values.take(pa.array(rows))


class RedisWriteError(FeaturectlError, RuntimeError):
    """Redis refused a write, or kept changing the keys of a chunk; the message says which and what to do."""


class ChunkWriter:
    """Writes chunks of RowCommands from background threads; `close` returns the rows written. Subclasses say how
    a thread writes (`_work`) and which server's listpack limits the RESTOREs follow; counting, the queue and the
    choice to send RESTOREs are shared."""

    checked_rows = CHECKED_ROWS  # rows per chunk when a batch comes without RESTOREs

    def __init__(self, settings: RedisSettings, connections: int = 3, depth: int = 64):
        self.pending: "queue.Queue[Optional[RowCommands]]" = queue.Queue(maxsize=depth)
        self.written = self.skipped_older = self.retries = self.restored = 0
        self.error: Optional[BaseException] = None
        self.restore_refused: Optional[str] = None
        self._found_share = 0.0  # recent share of RESTOREs whose key already existed
        self._asked = 0
        self.settings = settings.for_bulk_writes()
        self.listpack_limits = self._listpack_limits()
        self._lock = threading.Lock()
        self._ended = threading.local()
        self._threads = [threading.Thread(target=self._run, name=f"redis-writer-{i}", daemon=True)
                         for i in range(connections)]
        for thread in self._threads:
            thread.start()

    def _listpack_limits(self) -> Optional[tuple[int, int]]:
        """The server's limits on the hashes RESTORE may create (`redis_store.dump.listpack_limits`)."""
        raise NotImplementedError

    def _work(self) -> None:
        """A writer thread: take rows from the queue (`_queued`) until it gives None, and write them."""
        raise NotImplementedError

    def wants_restores(self) -> bool:
        """Whether the next batch should come with RESTOREs: yes while most keys turn out new (a first
        materialization), and now and then to probe when they mostly exist (an incremental one)."""
        self._asked += 1
        return self.restore_refused is None and (self._found_share < 0.5 or self._asked % PROBE_EVERY == 0)

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
        self._ended.flag = False
        try:
            self._work()
        except BaseException as exc:  # surfaced to the caller by send() or close()
            self.error = exc
        finally:
            while not self._ended.flag:  # wait for this thread's end marker, so that close() never blocks
                self._queued()

    def _queued(self) -> Optional[RowCommands]:
        rows = self.pending.get()
        self._ended.flag = rows is None
        return rows

    def _count(self, written: int, skipped: int, retries: int) -> None:
        with self._lock:
            self.written += written
            self.skipped_older += skipped
            self.retries += retries

    def _tally_restores(self, replies: Optional[list], count: int) -> np.ndarray:
        """Which of `count` RESTOREs created their key (`replies` None: all of them). A RESTORE refused for another
        reason than an existing key (an ACL, a server that cannot load the payload) turns RESTOREs off for the
        rest of the run; those rows are written the checked way."""
        if replies is None:
            created, refused = np.ones(count, dtype=bool), []
        else:
            created = np.array([reply == b"OK" for reply in replies], dtype=bool)
            refused = [r for r in replies if isinstance(r, hiredis.ReplyError) and not str(r).startswith("BUSYKEY")]
        with self._lock:
            self.restored += int(created.sum())
            self._found_share = 0.5 * self._found_share + 0.5 * (1 - created.mean())
            if refused and self.restore_refused is None:
                self.restore_refused = str(refused[0])
                log.warning("Redis refused RESTORE (%s): writing every row with HSET from now on", refused[0])
        self._count(int(created.sum()), 0, 0)
        return created


class CheckedChunkWriter(ChunkWriter):
    """Materialization into one Redis node: RESTOREs, then WATCH/MULTI/EXEC transactions of CHECKED_ROWS keys.

    Several connections work at once so that Redis never waits on one chunk's round trips; rows of one entity in
    chunks handled by different connections stay correct because RESTORE and each checked chunk are atomic."""

    def __init__(self, settings: RedisSettings, connections: int = 3, depth: int = 64):
        self.address = settings.single_node("materialization with transactions over chunks of keys "
                                            "(batch.cluster_writer writes to a cluster)")
        super().__init__(settings, connections, depth)

    def _listpack_limits(self) -> Optional[tuple[int, int]]:
        node = SyncNode(self.settings, self.address)
        try:
            return dump.listpack_limits(node)
        finally:
            node.close()

    def _work(self) -> None:
        conn = None
        try:
            conn = Connection(self.settings, self.address)
            self._pipeline(conn)
        except OSError as exc:
            raise unavailable(f"{self.address[0]}:{self.address[1]}", exc, self.settings.timeout_s) from exc
        finally:
            if conn is not None:
                conn.close()

    def _pipeline(self, channel: Connection) -> None:
        """One round trip per chunk: the previous chunk's MULTI/HSET/EXEC, then this chunk's WATCH and HGETs
        (EXEC drops the old watches, so the new ones start clean). An aborted EXEC is retried the careful way."""
        checked: deque = deque()

        def next_rows() -> Optional[RowCommands]:
            """The next checked chunk: queued rows, less those a RESTORE created, in chunks of CHECKED_ROWS."""
            while not checked:
                rows = self._queued()
                if rows is None:
                    return None
                if rows.restores is not None and self.restore_refused is None:
                    rows = self._restore(channel, rows)
                    if rows is None:
                        continue
                if len(rows) > CHECKED_ROWS and rows.hsets is None:
                    rows = rows.with_writes()
                checked.extend(rows.slice(lo, CHECKED_ROWS) for lo in range(0, len(rows), CHECKED_ROWS))
            return checked.popleft()

        rows = next_rows()
        stored = _round_trip(channel, _check(rows), 1 + len(rows))[1:] if rows is not None else []
        while rows is not None and not self.error:
            following = next_rows()
            keep = _newer(stored, rows.newest_replaceable())
            commit, expected = _commit(rows, keep)
            check = _check(following) if following is not None else []
            replies = _round_trip(channel, commit + check, expected + (1 + len(following) if check else 0))
            if len(keep) and replies[expected - 1] is None:
                _round_trip(channel, [_UNWATCH], 1)
                written, skipped, retries = self._write(channel, rows)
                self._count(written, skipped, retries + 1)
                stored = _round_trip(channel, check, 1 + len(following))[1:] if check else []
            else:
                _raise_failed(replies[expected - 1] if len(keep) else [])
                self._count(len(keep), len(rows) - len(keep), 0)
                stored = replies[expected + 1:]
            rows = following

    def _restore(self, channel: Connection, rows: RowCommands) -> Optional[RowCommands]:
        """RESTORE the restorable rows; what remains (keys that existed, rows that cannot be restored) is returned
        for the checked path, None when nothing does."""
        chosen = np.flatnonzero(rows.restorable)
        if len(chosen) == 0:
            return rows
        commands = rows.restores if len(chosen) == len(rows) else rows.restores.take(pa.array(chosen))
        replies = _round_trip(channel, [columns.command_bytes(commands, 0, len(commands))], len(chosen),
                              refusals=True, all_ok=True)
        created = self._tally_restores(replies, len(chosen))
        remaining = np.ones(len(rows), dtype=bool)
        remaining[chosen[created]] = False
        return rows.take(np.flatnonzero(remaining)) if remaining.any() else None

    def _write(self, channel: Connection, rows: RowCommands) -> tuple[int, int, int]:
        """One chunk alone, checked and written until no concurrent write interferes: (rows written, rows
        skipped as older than Redis's, attempts refused by a concurrent write)."""
        for attempt in range(ATTEMPTS):
            keep = _newer(_round_trip(channel, _check(rows), 1 + len(rows))[1:], rows.newest_replaceable())
            commit, expected = _commit(rows, keep)
            replies = _round_trip(channel, commit, expected)
            if len(keep) == 0 or replies[-1] is not None:
                _raise_failed(replies[-1] if len(keep) else [])
                return len(keep), len(rows) - len(keep), attempt
        raise RedisWriteError(f"{ATTEMPTS} attempts to write a chunk of {len(rows)} keys were refused because "
                              f"other clients kept writing the same keys; retry when that writer is idle")


def _check(rows: RowCommands) -> list:
    """WATCH the chunk's keys and HGET their `_ts`: 1 + len(rows) replies."""
    n = len(rows)
    return [columns.variadic_head(b"WATCH", n), columns.command_bytes(rows.key_bulks, 0, n),
            columns.command_bytes(rows.reads, 0, n)]


def _commit(rows: RowCommands, keep: np.ndarray) -> tuple[list, int]:
    """The writes of the rows kept, in one transaction (or just UNWATCH when none is): payload, reply count."""
    if len(keep) == 0:
        return [_UNWATCH], 1
    body = (rows if len(keep) == len(rows) else rows.take(keep)).writes()
    return [_MULTI, columns.command_bytes(body, 0, len(body)), _EXEC], len(body) * rows.commands_per_write + 2


def _raise_failed(exec_replies: list) -> None:
    failed = [r for r in exec_replies if isinstance(r, hiredis.ReplyError)]
    if failed:
        raise RedisWriteError(f"Redis refused {len(failed)} writes of a chunk: {failed[0]}")


def _newer(stored: list, replaceable: np.ndarray) -> np.ndarray:
    """Rows whose stored `_ts` is missing or at most the newest each may overwrite (`newest_replaceable`)."""
    present = [i for i, value in enumerate(stored) if value is not None]
    if not present:
        return np.arange(len(stored))
    keep = np.ones(len(stored), dtype=bool)
    existing = np.array([decode_timestamp_ms(stored[i]) for i in present], dtype=np.int64)
    keep[present] = existing <= replaceable[present]
    return np.flatnonzero(keep)


def _round_trip(conn: Connection, parts: list, count: int, refusals: bool = False,
                all_ok: bool = False) -> Optional[list]:
    """Send, then read exactly `count` replies; a Redis error reply becomes a RedisWriteError unless `refusals`
    asks for error replies to be returned among the others. With `all_ok`, an answer that is nothing but `+OK`s
    is known by its bytes, without parsing each reply: None then."""
    conn.write(b"".join(parts))  # one segment: Redis wakes once per round trip, not once per part
    replies = conn.read_expected(_OK * count, count) if all_ok else conn.read(count)
    if replies is not None and not refusals:
        failed = next((r for r in replies if isinstance(r, hiredis.ReplyError)), None)
        if failed is not None:
            raise RedisWriteError(f"Redis refused a write: {failed}")
    return replies
