"""Per-key budgets per minute as token buckets: smooth refill, bursts up to one minute's budget.

`TokenBuckets` keeps them in the process; `SharedTokenBuckets` in a file that every worker process of one server
maps, so that `featurectl serve --workers N` spends each key's budget once, whichever worker a connection lands on.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import mmap
import os
import struct
import threading
import time
from typing import Any, Callable, Iterator, Optional


class TokenBuckets:
    """One bucket per (key, kind); `take` answers (allowed, seconds to wait before retrying)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[Any, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key_id: str, kind: str, cost: float, per_minute: float) -> tuple[bool, int]:
        """Spend `cost` from the key's `kind` budget of `per_minute` (the caller refuses costs above it)."""
        rate = per_minute / 60.0
        now = self.clock()
        with self._locked():
            slot = self._slot(key_id, kind)
            level, last = self._read(slot) or (float(per_minute), now)
            level = min(float(per_minute), level + (now - last) * rate)
            allowed = cost <= level
            self._write(slot, level - cost if allowed else level, now)
        return allowed, 0 if allowed else max(1, math.ceil((cost - level) / rate))

    def give_back(self, key_id: str, kind: str, cost: float, per_minute: float) -> None:
        """Return what `take` spent on work that was then refused or failed: the caller was not served."""
        with self._locked():
            slot = self._slot(key_id, kind)
            bucket = self._read(slot)
            if bucket is not None:
                self._write(slot, min(float(per_minute), bucket[0] + cost), bucket[1])

    # storage: a dict here, a mapped file in SharedTokenBuckets
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            yield

    def _slot(self, key_id: str, kind: str) -> Any:
        return key_id, kind

    def _read(self, slot: Any) -> Optional[tuple[float, float]]:
        return self._buckets.get(slot)

    def _write(self, slot: Any, level: float, last: float) -> None:
        self._buckets[slot] = (level, last)


class SharedTokenBuckets(TokenBuckets):
    """The buckets in a file mapped by every worker: a slot per (key, kind) found by hashing, an exclusive lock
    on the file around each update (two system calls). `time.monotonic` is the host's, the same in every process."""

    SLOTS = 16_384
    _ENTRY = struct.Struct("<16sdd")  # (key, kind) digest, level, last refill time
    _EMPTY = bytes(16)

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic):
        super().__init__(clock)
        size = self.SLOTS * self._ENTRY.size
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)  # zeros: every slot empty; workers racing here truncate to the same size
        self._map = mmap.mmap(self._fd, size)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:  # threads of one process share the file lock, so they take this one first
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _slot(self, key_id: str, kind: str) -> tuple[int, bytes]:
        digest = hashlib.blake2b(f"{key_id}\0{kind}".encode(), digest_size=16).digest()
        start = int.from_bytes(digest[:4], "little")
        for probe in range(self.SLOTS):
            offset = (start + probe) % self.SLOTS * self._ENTRY.size
            found = self._map[offset:offset + 16]
            if found == digest or found == self._EMPTY:
                return offset, digest
        raise RuntimeError(f"the shared budget table is full ({self.SLOTS} keys and kinds); restart the server")

    def _read(self, slot: tuple[int, bytes]) -> Optional[tuple[float, float]]:
        offset, digest = slot
        found, level, last = self._ENTRY.unpack_from(self._map, offset)
        return (level, last) if found == digest else None

    def _write(self, slot: tuple[int, bytes], level: float, last: float) -> None:
        offset, digest = slot
        self._ENTRY.pack_into(self._map, offset, digest, level, last)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)
