"""The window writer applies only the newest version of each tile in a batch, in log order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from streaming.writer import latest_versions


@dataclass
class Message:
    _topic: str
    _key: bytes
    _value: Optional[bytes]

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes:
        return self._key

    def value(self) -> Optional[bytes]:
        return self._value


def test_the_newest_version_of_each_tile_is_kept_where_it_came():
    batch = [Message("t", b"a", b"1"), Message("t", b"b", b"1"), Message("u", b"a", b"1"), Message("t", b"a", b"2"),
             Message("t", b"c", b"1"), Message("t", b"b", b"2")]
    kept = latest_versions(batch)
    assert [(m.topic(), m.key(), m.value()) for m in kept] == [
        ("u", b"a", b"1"), ("t", b"a", b"2"), ("t", b"c", b"1"), ("t", b"b", b"2")]


def test_a_tombstone_never_hides_the_version_before_it():
    kept = latest_versions([Message("t", b"a", b"1"), Message("t", b"a", None), Message("t", b"b", None)])
    assert [(m.key(), m.value()) for m in kept] == [(b"a", b"1")]
