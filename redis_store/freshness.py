"""The freshness record: per view, the newest event time any writer has put in Redis, in one small hash per project
beside Feast's keys.

Key `featurectl:{project}:newest_event_ms`, field = view name, value = epoch milliseconds (decimal). Our writers
record after they write (materialization once per view and run, the stream once per flush, a push to an attribute
view in the round trip of its rows; Feast's own writers do not), readers (the feature server in the background,
`featurectl status`) read the whole hash in one HGETALL. The record only moves forward: a Lua script keeps the
greater of the stored and the given time, so writers in several processes (the stream's window writers, a
materialization beside them) need no coordination, and a command sent twice (a retry after a lost reply) changes
nothing. When it raised a view's time, the script also appends the record, as it now stands, to the project's
history (`redis_store.freshness_history`, at most one sample per few seconds), which `featurectl report` plots.

Why Redis and not the registry database: every writer already holds a Redis connection on its write path and
none of them holds one to the registry (a SQLite file or PostgreSQL, whose write locks `apply` and the backfill
log take); the record lives and dies with the values it describes (a Redis restarted empty has neither, and the
age says "-" instead of vouching for values that are gone); and the feature server reads it on the connection it
already has. The key cannot be mistaken for one of Feast's: those begin with the entity key's binary length
prefix and end with the project's name, which this one does not (a scan of `*{project}` finds entities only).
"""

from __future__ import annotations

from typing import Mapping, Optional

import hiredis

from redis_store.cluster import SyncCluster
from redis_store.freshness_history import APPEND_SAMPLE, history_key
from redis_store.node import SyncNode, check_replies
from redis_store.settings import RedisSettings
from redis_store.writes import slots_of, writes_for

RETRY_S = 30.0

# KEYS[1]: the project's record, KEYS[2] its history (one slot). ARGV: view, event time in ms, alternating. Keeps
# the greater time per view; when one moved, samples the record into the history.
KEEP_NEWEST = """
local raised = false
for i = 1, #ARGV, 2 do
  local held = tonumber(redis.call('HGET', KEYS[1], ARGV[i]))
  if held == nil or held < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    raised = true
  end
end
if raised then""" + APPEND_SAMPLE + """end
return 0
"""


def record_key(project: str) -> bytes:
    return f"featurectl:{project}:newest_event_ms".encode()


def record_command(project: str, newest_ms: Mapping[str, int]) -> bytes:
    """The command that raises each view's recorded newest event time to `newest_ms[view]` where that is newer.
    EVAL with the script's text: any connection can send it, and Redis caches the compiled script."""
    args = [part for view, ms in sorted(newest_ms.items()) for part in (view, int(ms))]
    return hiredis.pack_command(("EVAL", KEEP_NEWEST, 2, record_key(project), history_key(project), *args))


def read_command(project: str) -> bytes:
    return hiredis.pack_command(("HGETALL", record_key(project)))


def forget_command(project: str, views: Optional[list[str]] = None) -> bytes:
    """Forget some views' records (their online values were cleared), or the whole project's (None) with its
    history."""
    if views is None:
        return hiredis.pack_command(("DEL", record_key(project), history_key(project)))
    return hiredis.pack_command(("HDEL", record_key(project), *views))


def parse_record(reply: list) -> dict[str, int]:
    """An HGETALL reply as view -> newest event time in ms."""
    return {reply[i].decode(): int(reply[i + 1]) for i in range(0, len(reply), 2)}


def _write(settings: RedisSettings, project: str, command: bytes, purpose: str) -> None:
    """One command on the record, sent again while Redis restarts or fails over, as the writers' own writes are."""
    writes = writes_for(settings, purpose, RETRY_S)
    try:
        key = record_key(project)
        check_replies(writes.execute(slots_of([key]) if writes.cluster else None, [command]), writes.where)
    finally:
        writes.close()


def record_newest(settings: RedisSettings, project: str, newest_ms: Mapping[str, int]) -> None:
    """Record the newest event times just written (a writer without a connection of its own at hand)."""
    if newest_ms:
        _write(settings, project, record_command(project, newest_ms), "recording the newest event times")


def read_newest(settings: RedisSettings, project: str) -> dict[str, int]:
    """Every view's recorded newest event time in ms (a view never recorded is absent); raises
    RedisUnavailableError after the settings' timeout when Redis does not answer."""
    reader = SyncCluster(settings) if settings.cluster else SyncNode(settings, settings.nodes[0])
    try:
        return parse_record(reader.read([record_key(project)], [read_command(project)])[0])
    finally:
        reader.close()


def forget_newest(settings: RedisSettings, project: str, views: Optional[list[str]] = None) -> None:
    """Drop the records of `views` (None: the project's whole record)."""
    if views != []:
        _write(settings, project, forget_command(project, views), "forgetting the newest event times")
