"""The guarded write: a key's fields are set only when its stored `_ts:{view}` is not newer than the writer's, so a
replay after a restart, or a slower writer, never moves a value back in time. One Lua script (it reads the
protobuf Timestamp itself, with the layout's field tags), one EVALSHA per block of keys; a refused key is
reported with the `_ts` it holds, so the writer can write it again once its clock gets there. On a Redis Cluster
a block holds keys of one hash slot; materialization there sends one key per EVALSHA (`row_commands`, built
column by column like its HSETs).
"""

from __future__ import annotations

import hashlib
from itertools import chain
from typing import Sequence

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from redis_store import columns, layout

BLOCK = 128  # keys per EVALSHA

# KEYS: entity keys. ARGV: n (field/value pairs per key incl. `_ts`), the key ttl in seconds (0: none), then per
# key: event time in ms, the `_ts` field, the serialized Timestamp, and the n - 1 feature fields and values,
# alternating. A key is written only when its stored `_ts` is older (or missing); the arguments go to HSET as they
# are, with no table building. A written key gets the ttl as its expiry, as Feast's writer does. Returns the
# refused keys as (position from 0, stored ms) pairs, flattened.
GUARDED_HSET = f"local SECONDS, NANOS = {layout.TIMESTAMP_SECONDS}, {layout.TIMESTAMP_NANOS}\n" + """
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
    if tag == SECONDS then seconds = v elseif tag == NANOS then nanos = v end
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

SHA = hashlib.sha1(GUARDED_HSET.encode()).hexdigest()
LOAD = hiredis.pack_command(("SCRIPT", "LOAD", GUARDED_HSET))


def commands(keys: Sequence[bytes], ts_ms: int | Sequence[int], ts_field: bytes, fields: Sequence[bytes],
             values: Sequence[Sequence[bytes]], key_ttl_s: int = 0, *, inline: bool = False) -> list[bytes]:
    """Packed EVALSHA commands writing, for each key, its values (one serialized value per field) as of `ts_ms`
    (one for all keys, or one per key); keys get `key_ttl_s` as their expiry when it is set. `inline`: EVAL with
    the script's text, for a connection that never loaded it (the SDK's and the feature server's, which otherwise
    only read)."""
    if not isinstance(ts_ms, (list, tuple)):
        stamps = [(ts_ms, layout.encode_timestamp(ts_ms))] * len(keys)
    else:
        encoded = {ms: layout.encode_timestamp(ms) for ms in set(ts_ms)}
        stamps = [(ms, encoded[ms]) for ms in ts_ms]
    pairs = len(fields) + 1
    script = ("EVAL", GUARDED_HSET) if inline else ("EVALSHA", SHA)
    out = []
    for lo in range(0, len(keys), BLOCK):
        block = keys[lo:lo + BLOCK]
        args = chain.from_iterable((ms, ts_field, ts_bytes, *chain.from_iterable(zip(fields, row)))
                                   for (ms, ts_bytes), row in zip(stamps[lo:lo + BLOCK], values[lo:lo + BLOCK]))
        out.append(hiredis.pack_command((*script, len(block), *block, pairs, key_ttl_s, *args)))
    return out


def row_commands(key_bulks: pa.BinaryArray, at_most_ms: np.ndarray, fields: Sequence[bytes],
                 values: Sequence[pa.BinaryArray], key_ttl_s: int = 0) -> pa.BinaryArray:
    """One EVALSHA per row, on its key alone (keys as `columns.bulk(keys)`): the hash {fields[i]: values[i][row]}
    is written when the stored `_ts` (`fields[-1]`, its value `values[-1]`) is at most `at_most_ms[row]`."""
    pairs = len(fields)
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % (7 + 2 * pairs, SHA.encode())
    limits = columns.bulk(pc.cast(pa.array(at_most_ms, pa.int64()), pa.string()).cast(pa.binary()))
    parts: list = [pa.scalar(head, pa.binary()), key_bulks, columns.bulk_constant(b"%d" % pairs),
                   columns.bulk_constant(b"%d" % key_ttl_s), limits, columns.bulk_constant(fields[-1]),
                   columns.bulk(values[-1])]
    for field, column in zip(fields[:-1], values[:-1]):
        parts += [columns.bulk_constant(field), columns.bulk(column)]
    return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.binary()))


def refused(replies: Sequence[list], positions: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """(position of the key, the `_ts` Redis holds) of every key the writes refused; `positions[c]`: the positions
    of the keys of command c, in order."""
    out = []
    for where, reply in zip(positions, replies):
        out += [(where[reply[i]], reply[i + 1]) for i in range(0, len(reply), 2)]
    return out
