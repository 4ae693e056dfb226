"""The freshness record's history: samples of every view's newest event time, in a capped Redis stream per project,
so that `featurectl report` can plot each view's age over time.

Key `{featurectl:{project}:newest_event_ms}:history`: its hash tag is the whole name of the record
(`redis_store.freshness`), so on a Redis Cluster both keys share one slot and the record's script appends the
sample in the same call. An entry's id is Redis's clock when the record was raised (milliseconds, one clock for
every writer); its fields are the record as it then stood, view -> newest event time in ms. At most one entry per
`GAP_MS` (writes in between are left out: the plotted age may overstate the real one by at most that), and the
stream keeps about the last `CAP` entries (XADD's MAXLEN ~, trimmed whole macro nodes at a time): at least
`CAP * GAP_MS` of history however often writers write, one entry per write when they write more seldom.
"""

from __future__ import annotations

from dataclasses import dataclass

import hiredis

from redis_store.cluster import SyncCluster
from redis_store.node import SyncNode
from redis_store.settings import RedisSettings

GAP_MS = 5_000
CAP = 20_000

# Run by the record's script after it raised the record (KEYS[1]); KEYS[2]: the history.
APPEND_SAMPLE = f"""
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
if #last == 0 or now_ms - tonumber(string.match(last[1][1], '^(%d+)')) >= {GAP_MS} then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', {CAP}, '*', unpack(redis.call('HGETALL', KEYS[1])))
end
"""


@dataclass(frozen=True)
class FreshnessSample:
    """The record at `at_ms` (Redis's clock): view -> newest event time in ms."""

    at_ms: int
    newest_ms: dict[str, int]


def history_key(project: str) -> bytes:
    return f"{{featurectl:{project}:newest_event_ms}}:history".encode()


def read_command(project: str) -> bytes:
    return hiredis.pack_command(("XRANGE", history_key(project), "-", "+"))


def parse_history(reply: list) -> list[FreshnessSample]:
    """An XRANGE reply as samples, oldest first."""
    samples = []
    for entry_id, fields in reply:
        newest = {fields[i].decode(): int(fields[i + 1]) for i in range(0, len(fields), 2)}
        samples.append(FreshnessSample(int(entry_id.split(b"-")[0]), newest))
    return samples


def read_history(settings: RedisSettings, project: str) -> list[FreshnessSample]:
    """The project's samples, oldest first (none recorded: empty); raises RedisUnavailableError after the settings'
    timeout when Redis does not answer."""
    reader = SyncCluster(settings) if settings.cluster else SyncNode(settings, settings.nodes[0])
    try:
        return parse_history(reader.read([history_key(project)], [read_command(project)])[0])
    finally:
        reader.close()
