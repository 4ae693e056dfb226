"""The Java SQL functions (udf/) in Flink batch mode: sketches byte-identical to dsl.sketch, LAST_BY order-free,
events parsed strictly (a value of any other JSON type than its column's is an error, never a cast)."""

from __future__ import annotations

import base64
import json
import subprocess
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

import mmh3
import numpy as np
import pytest

from dsl import sketch
from dsl.sql_functions import function_ddl

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BASE = datetime(2024, 5, 1, 12, 0, 0)
# group -> (rows, distinct values): sparse, bigger sparse and dense sketches.
GROUPS = {"few": (40, 20), "some": (3000, 2000), "many": (15000, 12000)}


@pytest.fixture(scope="module")
def env():
    """One batch TableEnvironment for the file (a PyFlink start costs seconds), with the jar built fresh."""
    subprocess.run(["bash", str(ROOT / "scripts" / "build_udf.sh")], check=True)
    from common.flink import create_table_env

    table_env = create_table_env(streaming=False)
    for ddl in function_ddl():
        table_env.execute_sql(ddl)
    return table_env


@pytest.fixture(scope="module")
def events(env) -> list[tuple]:
    """Registers view `events(k, v, ts)`: five minutes of events per group, timestamp ties and a NULL value."""
    from pyflink.table import DataTypes

    rows = [(k, f"{k}-{i % distinct}", BASE + timedelta(seconds=(i * 7) % 300))
            for k, (count, distinct) in GROUPS.items() for i in range(count)]
    rows.append(("few", None, BASE + timedelta(minutes=9)))
    schema = DataTypes.ROW([DataTypes.FIELD("k", DataTypes.STRING()), DataTypes.FIELD("v", DataTypes.STRING()),
                            DataTypes.FIELD("ts", DataTypes.TIMESTAMP(3))])
    env.create_temporary_view("events", env.from_elements(rows, schema))
    return rows


def query(env, sql: str) -> list[tuple]:
    with env.execute_sql(sql).collect() as results:
        return [tuple(row) for row in results]


def python_sketch(values) -> bytes:
    hll = sketch.HyperLogLog()
    hll.add_many(values)
    return hll.to_bytes()


def test_murmur3_matches_mmh3_for_every_tail_length(env):
    from pyflink.java_gateway import get_gateway

    murmur3 = get_gateway().jvm.dev.featurectl.udf.Murmur3
    rng = np.random.default_rng(3)
    samples = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(41)]
    samples += ["é日本語🙂".encode(), b"hello"]
    for data in samples:
        assert murmur3.hash64(data) & (2**64 - 1) == mmh3.hash64(data, seed=0, signed=False)[0], data


def test_hll_sketch_bytes_equal_python(env, events):
    got = dict(query(env, "SELECT k, HLL_SKETCH(v) FROM events GROUP BY k"))
    by_group = defaultdict(list)
    for k, v, _ in events:
        by_group[k].append(v)
    assert {k: bytes(s) for k, s in got.items()} == {k: python_sketch(vs) for k, vs in by_group.items()}
    assert got["many"][2] == 1 and got["some"][2] == 0  # dense and sparse both covered


def test_hll_merge_of_groups_equals_sketch_of_all(env, events):
    [(merged,)] = query(env, "SELECT HLL_MERGE(s) FROM (SELECT k, HLL_SKETCH(v) AS s FROM events GROUP BY k)")
    assert bytes(merged) == python_sketch(v for _, v, _ in events)
    [(nothing,)] = query(env, "SELECT HLL_MERGE(s) FROM (VALUES (CAST(NULL AS BYTES))) AS t(s)")
    assert bytes(nothing) == sketch.HyperLogLog().to_bytes()


def test_hll_estimate_equals_python(env, events):
    got = query(env, "SELECT HLL_SKETCH(v), HLL_ESTIMATE(HLL_SKETCH(v)) FROM events GROUP BY k")
    for sketch_bytes, estimate in got:
        assert estimate == sketch.estimate(bytes(sketch_bytes))
    assert query(env, "SELECT HLL_ESTIMATE(CAST(NULL AS BYTES)), HLL_ESTIMATE(X'')") == [(0, 0)]


def test_hll_estimate_rejects_foreign_bytes(env):
    with pytest.raises(Exception, match="not a featurectl HLL sketch"):
        query(env, "SELECT HLL_ESTIMATE(X'020e000000')")


LAST_COLUMNS = (("k", "STRING"), ("s", "STRING"), ("n", "BIGINT"), ("x", "DOUBLE"), ("ms", "BIGINT"))
LAST_ROWS = [  # the latest non-NULL time, 2000 ms, is a tie for every column
    ("a", "apple", 5, 1.5, 1000),
    ("a", "pear", 7, 2.5, 2000),
    ("a", "fig", 3, 9.5, 2000),
    ("a", None, None, None, 3000),
    ("b", "kiwi", -1, -0.5, 1000),
    ("c", "\uffff", 1, 1.0, 1000),  # code point order, as in Python: U+1F600 > U+FFFF (UTF-16 says the opposite)
    ("c", "\U0001F600", 0, 0.0, 1000),
]
LAST_SQL = """
SELECT k, LAST_BY(s, ts), LAST_BY(n, ts), LAST_BY(x, ts), LAST_BY(s, ltz), LAST_BY(CAST(n AS INT), ts),
       LAST_BY(CAST(x AS FLOAT), ltz), LAST_BY(n > 4, ts)
FROM (SELECT k, s, n, x, TO_TIMESTAMP_LTZ(ms, 3) AS ltz, CAST(TO_TIMESTAMP_LTZ(ms, 3) AS TIMESTAMP(3)) AS ts
      FROM (VALUES {rows}) AS t(k, s, n, x, ms))
GROUP BY k
"""


def values_sql(rows) -> str:
    """Typed literals, so that a NULL in the first row does not leave a column untyped."""
    def literal(value, sql_type: str) -> str:
        text = "NULL" if value is None else f"'{value}'" if isinstance(value, str) else repr(value)
        return f"CAST({text} AS {sql_type})"

    return ", ".join(
        "(" + ", ".join(literal(v, sql_type) for v, (_, sql_type) in zip(row, LAST_COLUMNS)) + ")" for row in rows)


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_last_by_keeps_the_greatest_value_at_the_latest_time(env, order):
    rows = LAST_ROWS if order == "forward" else LAST_ROWS[::-1]
    got = sorted(query(env, LAST_SQL.format(rows=values_sql(rows))))
    assert got == [("a", "pear", 7, 9.5, "pear", 7, 9.5, True), ("b", "kiwi", -1, -0.5, "kiwi", -1, -0.5, False),
                   ("c", "\U0001F600", 1, 1.0, "\U0001F600", 1, 1.0, False)]


def test_last_by_rejects_unsupported_types(env):
    with pytest.raises(Exception, match="CAST other types first"):
        query(env, "SELECT LAST_BY(CAST(1 AS DECIMAL(10, 2)), CURRENT_TIMESTAMP)")
    with pytest.raises(Exception, match="CAST other types first"):
        query(env, "SELECT LAST_BY(ARRAY[CAST(1 AS DOUBLE)], CURRENT_TIMESTAMP)")


VECTOR_ROWS = [  # (k, vector, ms): ties at the latest time are broken by the greater vector, element by element
    ("a", [1.0, 2.0, 3.0], 1000), ("a", [1.0, 2.5, -1.0], 2000), ("a", [1.0, 2.0, 9.0], 2000), ("a", None, 3000),
    ("b", [0.5, 0.5], 1000), ("b", [0.5, 0.5, 0.0], 1000), ("c", [-1.0, 0.0], 1000),
]


@pytest.mark.parametrize("order", ["forward", "reversed"])
def test_last_by_takes_vectors_as_python_orders_lists(env, order):
    """A vector feature's tile value (ARRAY<FLOAT>): the latest one, ties to the greater as Python compares lists."""
    rows = VECTOR_ROWS if order == "forward" else VECTOR_ROWS[::-1]

    def vector(value) -> str:
        return "CAST(NULL AS ARRAY<FLOAT>)" if value is None else \
            "ARRAY[" + ", ".join(f"CAST({x!r} AS FLOAT)" for x in value) + "]"

    values = ", ".join(f"('{k}', {vector(v)}, CAST({ms} AS BIGINT))" for k, v, ms in rows)
    got = sorted(query(env, f"SELECT k, LAST_BY(v, TO_TIMESTAMP_LTZ(ms, 3)) FROM (VALUES {values}) AS t(k, v, ms) "
                            "GROUP BY k"))
    want = {}
    for k, v, ms in rows:
        if v is not None:
            want[k] = max(want.get(k, (ms, v)), (ms, v))
    assert [(k, list(v)) for k, v in got] == sorted((k, v) for k, (_, v) in want.items())


def tumble_oracle(events) -> dict:
    """(k, window start) -> (sketch bytes, last value, estimate), computed in Python."""
    values, last = defaultdict(list), {}
    for k, v, ts in events:
        key = (k, ts.replace(second=0))
        values[key].append(v)
        if v is not None:
            last[key] = max(last.get(key, (ts, v)), (ts, v))
    return {key: (python_sketch(vs), last.get(key, (None, None))[1], sketch.estimate(python_sketch(vs)))
            for key, vs in values.items()}


TUMBLE_SQL = """
SELECT k, window_start, HLL_SKETCH(v), LAST_BY(v, ts), HLL_ESTIMATE(HLL_SKETCH(v))
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '1' MINUTE))
GROUP BY k, window_start, window_end
"""


def test_tumble_window_tiles_in_batch_mode(env, events):
    got = {(k, start): (bytes(s), last, estimate) for k, start, s, last, estimate in query(env, TUMBLE_SQL)}
    assert got == tumble_oracle(events)


def test_two_phase_aggregation_merges_accumulators(env, events):
    """Forced local/global aggregation calls each function's `merge`; results must not change."""
    conf = env.get_config()
    conf.set("table.optimizer.agg-phase-strategy", "TWO_PHASE")
    try:
        assert "LocalSortAggregate" in env.explain_sql(TUMBLE_SQL)
        got = {(k, start): (bytes(s), last, estimate) for k, start, s, last, estimate in query(env, TUMBLE_SQL)}
        merged = query(env, "SELECT HLL_MERGE(s) FROM (SELECT HLL_SKETCH(v) AS s FROM events GROUP BY k)")
    finally:
        conf.set("table.optimizer.agg-phase-strategy", "AUTO")
    assert got == tumble_oracle(events)
    assert bytes(merged[0][0]) == python_sketch(v for _, v, _ in events)


EVENT_SPEC = json.dumps({"columns": [["s", "STRING"], ["i", "INT"], ["l", "BIGINT"], ["f", "FLOAT"],
                                     ["d", "DOUBLE"], ["b", "BOOLEAN"], ["ts", "BIGINT"]],
                         "required": ["s", "ts"]})
GOOD = {"s": "x", "ts": 1000}
# payload -> (columns s, i, l, f, d, b, ts as parsed, __error)
PARSED = [
    (json.dumps({"s": "é😀", "i": -5, "l": 2**63 - 1, "f": 1.5, "d": 2, "b": True, "ts": 1000, "extra": [{}]}),
     ("é😀", -5, 2**63 - 1, 1.5, 2.0, True, 1000, None)),
    (json.dumps({"s": "é😀", "b": False, "ts": -3}, ensure_ascii=False),
     ("é😀", None, None, None, None, False, -3, None)),
    (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), ("x", None, None, None, None, None, 1000, None)),  # UTF-8 BOM
    (json.dumps({**GOOD, "l": "x", "l2": 1}).replace('"l2"', '"l"'), ("x", None, 1, None, None, None, 1000, None)),
    (json.dumps({**GOOD, "l": 12.5}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": 12.0}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": 1e3}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": "42"}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": True}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": 2**63}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": [1]}), "wrong_type:l"),
    (json.dumps({**GOOD, "l": {"v": 1}}), "wrong_type:l"),
    (json.dumps({**GOOD, "i": 2**31}), "wrong_type:i"),
    (json.dumps({**GOOD, "s": 3}), "wrong_type:s"),
    (json.dumps({**GOOD, "s": False}), "wrong_type:s"),
    (json.dumps({**GOOD, "d": "1.5"}), "wrong_type:d"),
    (json.dumps({**GOOD, "d": True}), "wrong_type:d"),
    ('{"s": "x", "ts": 1000, "d": 1e400}', "wrong_type:d"),
    (json.dumps({**GOOD, "f": 1e39}), "wrong_type:f"),
    (json.dumps({**GOOD, "b": 1}), "wrong_type:b"),
    (json.dumps({**GOOD, "b": "true"}), "wrong_type:b"),
    (json.dumps({**GOOD, "ts": 1.7e12}), "wrong_type:ts"),
    (json.dumps({**GOOD, "ts": 1000.0}), "wrong_type:ts"),
    (json.dumps({**GOOD, "ts": "1000"}), "wrong_type:ts"),
    (json.dumps({**GOOD, "ts": True}), "wrong_type:ts"),
    (json.dumps({"ts": 1000}), "missing_field:s"),
    (json.dumps({**GOOD, "s": None}), "missing_field:s"),
    (json.dumps({"s": "x", "l": 1.5}), "missing_field:ts"),  # missing fields come first
    (json.dumps({**GOOD, "i": "1", "l": "2"}), "wrong_type:i"),  # then wrong types, in column order
    (b"", "malformed_json"), (b"[1, 2]", "malformed_json"), (b'"x"', "malformed_json"),
    (b'{"s": "x", "ts": ', "malformed_json"), (json.dumps(GOOD).encode() + b" {}", "malformed_json"),
    (b"\xff\xfe" + json.dumps(GOOD).encode(), "malformed_json"),
    (json.dumps(GOOD).encode("utf-16"), "malformed_json"), (b'{"s": "a\x00", "ts": 1}', "malformed_json"),
    (b'{"s": "\xc3\x28", "ts": 1000}', "malformed_json"),  # invalid UTF-8 in a value
    (b"{'s': 'x', 'ts': 1000}", "malformed_json"), (b'{"s": "x", "ts": NaN}', "malformed_json"),
    (None, "malformed_json"),
]


def test_parse_event_takes_values_only_of_exactly_their_type(env):
    from pyflink.table import DataTypes

    payloads = [(None if p is None else bytearray(p.encode() if isinstance(p, str) else p),) for p, _ in PARSED]
    env.create_temporary_view("payloads", env.from_elements(
        [(i, *p) for i, p in enumerate(payloads)],
        DataTypes.ROW([DataTypes.FIELD("n", DataTypes.INT()), DataTypes.FIELD("p", DataTypes.BYTES())])))
    spec = EVENT_SPEC.replace("'", "''")
    got = dict((row[0], row[1:]) for row in query(env, f"SELECT k.n, e.* FROM payloads AS k, LATERAL TABLE("
                                                       f"PARSE_EVENT(k.p, '{spec}')) AS e"))
    for n, (payload, want) in enumerate(PARSED):
        if isinstance(want, str):
            assert got[n][-1] == want, payload
        else:
            assert got[n] == want, payload


def test_parse_event_refuses_a_bad_spec(env):
    with pytest.raises(Exception, match="unknown column type `DECIMAL`"):
        query(env, "SELECT e.* FROM (VALUES (X'7B7D')) AS k(p), LATERAL TABLE(PARSE_EVENT(k.p, "
                   "'{\"columns\": [[\"a\", \"DECIMAL\"]], \"required\": []}')) AS e")


def test_dead_letter_payloads_keep_the_original_bytes(env):
    text = "é" * 9000  # 18,000 bytes: cut at 16,384 bytes, which falls between the two bytes of one é
    # The row number keeps the check independent of the order Flink's parallel VALUES source emits rows in.
    rows = query(env, f"SELECT n, PAYLOAD_TEXT(p, 16384), PAYLOAD_ENCODING(p, 16384) FROM (VALUES "
                      f"(0, X'{text.encode().hex()}'), (1, X'ff00c328'), (2, X'7b7d'), (3, CAST(NULL AS BYTES)))"
                      f" AS t(n, p)")
    rows = [row[1:] for row in sorted(rows)]
    assert rows[0] == ("é" * 8192, "utf-8")
    assert rows[1] == (base64.b64encode(b"\xff\x00\xc3\x28").decode(), "base64")
    assert rows[2] == ("{}", "utf-8") and rows[3] == (None, None)
