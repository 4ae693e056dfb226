"""Milvus's access log read per search: lines as Milvus 2.3.5 wrote them, paired with client timings (a real
server's log is read in tests/serving/test_search_server.py)."""

from __future__ import annotations

import logging

import pytest

from bench._milvus_access_log import log_size, search_times_ms, split_figures

LINES = """\
[2026/12/02 14:24:09.718 +00:00] [ACCESS] <Unknown: tcp-127.0.0.1:39132> DescribeCollection [status: OK] [code: 0] \
[sdk: Python-2.5.18] [msg: ] [traceID: a50d8791df89cfff45b90ddf85888e86] [timeCost: 1.378758ms]
[2026/12/02 14:14:28.538 +00:00] [ACCESS] <Unknown: tcp-127.0.0.1:35496> Search [status: OK] [code: 0] \
[sdk: Unknown] [msg: ] [traceID: 5bc5c92007c4ac428cd9cdc01863fcd0] [timeCost: 974.995µs] [database: default] \
[collection: probe] [partitions: []] [expr: ]
[2026/12/02 14:24:55.581 +00:00] [ACCESS] <Unknown: tcp-127.0.0.1:53154> Search [status: OK] [code: 0] \
[sdk: Python-2.5.18] [msg: ] [traceID: f21f36cee12a89c248219d873c4e616e] [timeCost: 2.094095ms] \
[database: default] [collection: probe] [partitions: []] [expr: ]
"""


def test_the_search_lines_give_their_times_in_ms_after_an_offset(tmp_path):
    log = tmp_path / "access.log"
    assert log_size(log) == 0
    log.write_text(LINES)
    assert search_times_ms(log) == pytest.approx([0.974995, 2.094095])
    second_search = LINES.index("[2026/12/02 14:24:55")
    assert search_times_ms(log, len(LINES[:second_search].encode())) == pytest.approx([2.094095])
    assert search_times_ms(log, log_size(log)) == []


def test_split_pairs_each_search_with_the_server_time():
    client = [2.0] * 98 + [10.0, 20.0]
    server = [1.5] * 98 + [9.0, 3.0]
    figures = split_figures(client, server)
    assert figures["server_log_p50_ms"] == 1.5 and figures["outside_server_p50_ms"] == 0.5
    assert 3.0 < figures["server_log_p99_ms"] < 9.0 and 1.0 < figures["outside_server_p99_ms"] < 17.0


def test_counts_that_differ_give_no_split_and_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert split_figures([1.0, 2.0], [1.0]) == {}
    assert "1 searches for 2 timed ones" in caplog.text
