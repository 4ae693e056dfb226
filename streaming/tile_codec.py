"""Tile updates as the job writes them to Kafka (upsert-kafka, JSON values, sketches in base64) -> Python."""

from __future__ import annotations

from binascii import a2b_base64
from typing import Optional

import orjson

from dsl.compile_flink import TILE_START
from streaming.windows import ViewLayout


class TileDecoder:
    """Decodes one view's tile messages into (entity key, tile start, tile column values)."""

    def __init__(self, layout: ViewLayout):
        self.keys = layout.key_columns
        self.names = layout.column_names
        self.binary = layout.hll_columns

    def decode(self, payload: Optional[bytes]) -> Optional[tuple[tuple, int, tuple]]:
        """None for a tombstone or a row without a full key (no event reaches the tiles without one)."""
        if payload is None:
            return None
        row = orjson.loads(payload)  # a few times faster than `json` on these rows: decoding is per tile update
        key = tuple(row.get(k) for k in self.keys)
        if None in key:
            return None
        values = [row.get(name) for name in self.names]
        for j in self.binary:
            if values[j] is not None:
                values[j] = a2b_base64(values[j])
        return key, row[TILE_START], tuple(values)
