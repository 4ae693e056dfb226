"""The freshness record's history: samples of every view's newest event time, in a capped Redis stream per project,
so that `featurectl report` can plot each view's age over time.

Key `{featurectl:{project}:newest_event_ms}:history`: its hash tag is the whole name of the record
(`redis_store.freshness`), so on a Redis Cluster both keys share one slot and the record's script appends the
sample in the same call. An entry's id is Redis's clock when the record was raised (milliseconds, one clock for
every writer); its fields are the record as it then stood, view -> newest event time in ms, and `ANCHOR`, the time
of the first raise the entry stands for. A raise within `GAP_MS` of the last entry's anchor replaces that entry
(same anchor, the new time and record), a later one appends: at most one entry per `GAP_MS` window, and a run that
raises several views one after the other (a materialize) leaves one entry holding all of them. A drop folded into a
later raise of its window is plotted at that raise: the plotted age may overstate the real one by at most
`GAP_MS`. The stream keeps about the last `CAP` entries (XADD's MAXLEN ~, trimmed whole macro nodes at a time): at
least `CAP * GAP_MS` of history however often writers write, one entry per write when they write more seldom.
"""

from __future__ import annotations

from dataclasses import dataclass

import hiredis

from redis_store.cluster import SyncCluster
from redis_store.node import SyncNode
from redis_store.settings import RedisSettings

GAP_MS = 5_000
CAP = 20_000
ANCHOR = "@anchor"  # not a view name: those are identifiers

# Run by the record's script after it raised the record (KEYS[1]); KEYS[2]: the history.
APPEND_SAMPLE = f"""
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
local anchor = now_ms
if #last > 0 then
  local held = tonumber(string.match(last[1][1], '^(%d+)'))
  local fields = last[1][2]
  for i = 1, #fields, 2 do
    if fields[i] == '{ANCHOR}' then held = tonumber(fields[i + 1]) end
  end
  if now_ms - held < {GAP_MS} then
    anchor = held
    redis.call('XDEL', KEYS[2], last[1][1])
  end
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', {CAP}, '*', '{ANCHOR}', anchor, unpack(redis.call('HGETALL', KEYS[1])))
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
        newest = {fields[i].decode(): int(fields[i + 1]) for i in range(0, len(fields), 2)
                  if fields[i].decode() != ANCHOR}
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
