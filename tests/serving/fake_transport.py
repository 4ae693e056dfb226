"""An asyncio transport that records what a protocol writes and how it steers reading, without sockets."""

from __future__ import annotations


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default=None):
        return default

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True
