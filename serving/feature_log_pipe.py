"""The messages between a server worker and its feature log writer process (`serving.feature_log_writer`): each a
pickled tuple behind its length (4 bytes, little-endian), so that many go in one write and a read may end
anywhere."""

from __future__ import annotations

import pickle
import struct
from typing import Any

_LENGTH = struct.Struct("<I")


def frame(message: tuple) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class FrameReader:
    """Messages out of a byte stream read in pieces of any size."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        """The messages that `data` completes, in order; a partial one waits for the next piece."""
        self._data += data
        messages = []
        start, end = 0, len(self._data)
        while end - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._data, start)
            if end - start - _LENGTH.size < length:
                break
            start += _LENGTH.size
            messages.append(pickle.loads(self._data[start:start + length]))
            start += length
        del self._data[:start]
        return messages
