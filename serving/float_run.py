"""The float features of one type in a one-row plan, unpacked by one `struct` call: floats rarely repeat, so they
are the values a remembered decode (by stored bytes) cannot answer, and one call for all of them costs about what
one value's `decode_value` does. Shared by the one-row HTTP answer (`serving.row_answer`) and the one-row SDK read
(`serving.row_values`)."""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import Optional, Sequence

from dsl.types import ValueType
from redis_store.layout import FLOAT_CODES, TAGS


class FloatRun:
    """Where the run's features lie in a row's list of stored values (`at`), and their values unpacked together
    when each is a plain value of the run's type (its tag, its width)."""

    __slots__ = ("at", "pick", "unpack", "size", "tags")

    def __init__(self, at: list[int], kind: ValueType):
        code = FLOAT_CODES[kind]
        self.at = at
        self.pick = itemgetter(*at) if len(at) > 1 else (lambda raws: (raws[at[0]],))
        self.unpack = struct.Struct("<" + ("x" + code) * len(at)).unpack
        self.size = (1 + struct.calcsize(code)) * len(at)
        self.tags = bytes((TAGS[kind],)) * len(at)

    def values(self, raws: Sequence[Optional[bytes]]) -> Optional[tuple[float, ...]]:
        """The run's values (NaN and infinities included), or None when one is not a plain value (a null, a missing
        field or view): those are decoded one by one."""
        try:
            blob = b"".join(self.pick(raws))
        except TypeError:  # a view with no row (None)
            return None
        if len(blob) != self.size or blob[::self.size // len(self.at)] != self.tags:
            return None
        return self.unpack(blob)


def float_runs(names: Sequence[str], kinds: dict) -> list[FloatRun]:
    """The float features among `names` (their `kinds`) grouped by type, as `FloatRun`s over their positions."""
    runs: dict[ValueType, list[int]] = {}
    for at, name in enumerate(names):
        kind = kinds[name]
        if kind in FLOAT_CODES:
            runs.setdefault(kind, []).append(at)
    return [FloatRun(at, kind) for kind, at in runs.items()]
