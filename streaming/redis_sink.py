"""Window values -> Redis in Feast's layout (`serving.redis_layout`), pipelined and event-time guarded.

Each command is one EVALSHA of a guarded HSET script over a block of entities: a key is written only
when its stored `_ts:{view}` is not newer than ours, so a replay after a restart, or a slower writer, never moves
a value back in time. `_ts` is the view's clock (the greatest event time seen), the instant the values are as of.
A refused key is reported with the `_ts` it holds, so the writer can write it again once its clock gets there
(a materialized row at a later boundary, say).
"""

from __future__ import annotations

import logging
import time
from itertools import chain
from typing import Any, Sequence

import hiredis
import numpy as np
from redis.exceptions import ConnectionError, NoScriptError, TimeoutError

from common.errors import FeaturectlError
from dsl.types import ValueType
from serving import redis_layout as layout
from streaming.windows import ViewLayout

log = logging.getLogger(__name__)

BLOCK = 128  # entities per EVALSHA
RETRY_S = 60.0


# KEYS: entity keys. ARGV: n (field/value pairs per key incl. `_ts`), the key ttl in seconds (0: none), then per
# key: event time in ms, the `_ts` field, the serialized Timestamp, and the n - 1 feature fields and values,
# alternating. A key is written only when its stored `_ts` is older (or missing); the arguments go to HSET as they
# are, with no table building. A written key gets the ttl as its expiry, as Feast's writer does. Returns the
# refused keys as (position from 0, stored ms) pairs, flattened.
GUARDED_HSET = """
local function pb_ms(s)
  local seconds, nanos, i = 0, 0, 1
  while i <= #s do
    local tag = string.byte(s, i)
    i = i + 1
    local v, scale, b = 0, 1, 128
    while b >= 128 do
      b = string.byte(s, i)
      i = i + 1
      v = v + (b % 128) * scale
      scale = scale * 128
    end
    if tag == 8 then seconds = v elseif tag == 16 then nanos = v end
  end
  return seconds * 1000 + math.floor(nanos / 1000000)
end
local width = 2 * tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local refused, pos = {}, 3
for k = 1, #KEYS do
  local stored = redis.call('HGET', KEYS[k], ARGV[pos + 1])
  local stored_ms = stored and pb_ms(stored)
  if (not stored) or stored_ms <= tonumber(ARGV[pos]) then
    redis.call('HSET', KEYS[k], unpack(ARGV, pos + 1, pos + width))
    if ttl > 0 then redis.call('EXPIRE', KEYS[k], ttl) end
  else
    refused[#refused + 1] = k - 1
    refused[#refused + 1] = stored_ms
  end
  pos = pos + 1 + width
end
return refused
"""


class RedisUnavailable(FeaturectlError, RuntimeError):
    """Redis stayed unreachable; the message says for how long and what to do."""

_FLOATS = (ValueType.FLOAT32, ValueType.FLOAT64)


def _encode(values: list, kind: ValueType) -> list[bytes]:
    """One feature of many entities as Value bytes; numbers go through numpy (NULLs masked)."""
    if not (kind.is_numeric or kind is ValueType.TIMESTAMP):
        return layout.encode_column(values, kind)
    mask = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    numbers = np.array([0 if v is None else v for v in values], dtype=np.float64 if kind in _FLOATS else np.int64)
    return layout.encode_column(numbers, kind, mask if mask.any() else None)


class RedisSink:
    """Writes rows of one project; one pipelined round trip per `write`. Keys expire `key_ttl_s` after their last
    write when it is set (Feast's `online_store.key_ttl_seconds`)."""

    def __init__(self, client, project: str, key_ttl_s: int = 0):
        self.client = client
        self.project = project
        self.key_ttl_s = key_ttl_s
        self.sha = client.script_load(GUARDED_HSET)
        self._views: dict[str, tuple] = {}

    def _view(self, view_layout: ViewLayout) -> tuple:
        name = view_layout.name
        if name not in self._views:
            encoder = layout.KeyEncoder(self.project, view_layout.join_keys)
            positions = [view_layout.key_columns.index(k) for k in encoder.order]
            fields = [layout.field_name(name, s.name) for s in view_layout.specs]
            kinds = [s.kind for s in view_layout.specs]
            self._views[name] = (encoder, positions, layout.ts_field(name), fields, kinds)
        return self._views[name]

    def commands(self, view_layout: ViewLayout, rows: Sequence[tuple[tuple, list[Any]]], ts_ms: int) -> list[bytes]:
        """Packed EVALSHA commands writing `rows` (entity key, values in the layout's feature order)."""
        encoder, positions, ts_field, fields, kinds = self._view(view_layout)
        ts_bytes = layout.encode_timestamp(ts_ms)
        columns = zip(*(values for _, values in rows))
        encoded = list(zip(*(_encode(list(c), k) for c, k in zip(columns, kinds))))
        pairs = len(fields) + 1
        out = []
        for lo in range(0, len(rows), BLOCK):
            keys = [encoder.key([key[p] for p in positions]) for key, _ in rows[lo:lo + BLOCK]]
            args = chain.from_iterable((ts_ms, ts_field, ts_bytes, *chain.from_iterable(zip(fields, values)))
                                       for values in encoded[lo:lo + BLOCK])
            out.append(hiredis.pack_command(("EVALSHA", self.sha, len(keys), *keys, pairs, self.key_ttl_s, *args)))
        return out

    def send(self, commands: list[bytes]) -> list[tuple[int, int]]:
        """One round trip for all commands; returns the rows refused as older than Redis's: (position among the
        rows given to `commands`, the `_ts` in ms that Redis holds).

        Writes are idempotent, so a failed round trip is sent again, for up to `RETRY_S` while Redis is away."""
        if not commands:
            return []
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                return self._send(commands)
            except NoScriptError:  # Redis restarted without our script: load it (same sha) and write again
                self.client.script_load(GUARDED_HSET)
            except (ConnectionError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise RedisUnavailable(f"Redis did not answer for {RETRY_S:.0f}s ({exc}); run `featurectl "
                                           "services up`, then start the stream again") from exc
                log.warning("writing to Redis failed (%s); retrying", exc)
                time.sleep(1.0)

    def _send(self, commands: list[bytes]) -> list[tuple[int, int]]:
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command(commands)
            refused = []
            for block in range(len(commands)):
                reply = conn.read_response()
                refused += [(block * BLOCK + reply[i], reply[i + 1]) for i in range(0, len(reply), 2)]
            return refused
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
