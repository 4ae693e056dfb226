"""Event timestamps and ttl checks of `serving.result` / `serving.request`: the vectorised paths print and decide
exactly what the row-by-row ones (checked against Feast in test_serving_compat) do."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from serving.request import _view_rows
from serving.result import ViewRows, parse_timestamps, rfc3339, rfc3339_many


def _ts(seconds: int, nanos: int = 0) -> bytes:
    return Timestamp(seconds=seconds, nanos=nanos).SerializeToString()


def test_many_timestamps_print_like_one_at_a_time_at_every_precision():
    raws = [_ts(s, n) for s in (0, 1_795_948_917, -5, 12_000_000_000)
            for n in (0, 123_000_000, 123_456_000, 123_456_789, 5)] + [None, b""]
    assert rfc3339_many(*parse_timestamps(raws)) == [rfc3339(raw) for raw in raws]
    same_precision = [_ts(1_795_948_917 + i, 250_000_000) for i in range(20)]
    assert rfc3339_many(*parse_timestamps(same_precision)) == [rfc3339(raw) for raw in same_precision]
    assert rfc3339_many([], []) == []


def test_view_rows_format_short_and_long_requests_alike():
    raws = [_ts(1_795_948_917 + i, i * 1_000) for i in range(12)] + [None]
    assert ViewRows(raws, [12], []).timestamps() == [rfc3339(raw) for raw in raws]
    assert ViewRows(raws[:3], [], []).timestamps() == [rfc3339(raw) for raw in raws[:3]]


def test_stale_rows_are_decided_to_the_millisecond():
    now_ms, ttl_ms = 1_795_948_917_500.0, 60_000
    oldest_s = int(now_ms - ttl_ms) // 1000  # 1_795_948_857, 500 ms into that second
    raws = (_ts(oldest_s, 499_000_000), _ts(oldest_s, 500_000_000), _ts(oldest_s - 10), None, _ts(oldest_s + 1))
    rows = _view_rows(raws, ttl_ms, now_ms)
    assert rows.missing == [3]
    assert rows.stale == [0, 2]
    assert _view_rows(raws, None, now_ms).stale == []
