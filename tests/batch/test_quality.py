"""Data-quality checks and profiles of a backfill's rows against a plain-Python oracle of the README's semantics,
on a view unlike the example's (two join keys, float, string, boolean and integer features, NULL and NaN), its
offline table written by the backfill's own writer; and what the records say afterwards."""

from __future__ import annotations

import datetime as dt
import math
import random

import pyarrow as pa
import pytest

from batch.offline_table import RangeWriter
from batch.quality import SAMPLE_ROWS, assess, check_backfill
from common.feature_profile import QUANTILES, TOP_CATEGORIES
from common.quality_log import QualityLog
from dsl import (AllowedValues, Attribute, Aggregation, Bool, Entity, EventSource, FeatureView, Float64, InRange,
                 Int64, MaxChange, NotNullRate, String, Timestamp)
from dsl.compile_feast import EVENT_TIMESTAMP, offline_table_path

HOUR_MS = 3_600_000
T0 = dt.datetime(2026, 3, 1, 18, tzinfo=dt.timezone.utc)  # the range crosses midnight
START_MS = int(T0.timestamp() * 1000)
END_MS = START_MS + 12 * HOUR_MS
TTL_MS = 5 * HOUR_MS
SHOP = Entity("shop", join_keys={"region": String, "shop_id": Int64})
SALES = EventSource("sales", {"region": String, "shop_id": Int64, "amount": Float64, "channel": String,
                              "paid": Bool, "t": Timestamp}, timestamp_field="t", kafka_topic="sales", path="sales")
CHANNELS = ["web", "store", "phone"]
VIEW = FeatureView(
    "shop_sales", SHOP, SALES,
    [Aggregation("sum", "amount", windows=["1h"], name="revenue"), Aggregation("count", windows=["1h"], name="sales"),
     Attribute("channel"), Attribute("paid")],
    tile="1h", ttl="5h",
    expectations=[InRange("revenue_1h", min=0, max=900), NotNullRate("channel", at_least=0.99),
                  AllowedValues("channel", CHANNELS), AllowedValues("sales_1h", list(range(8))),
                  MaxChange("revenue_1h", relative=0.2), NotNullRate("paid", at_least=0.5)])


def utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def make_rows(seed: int, revenue_scale: float = 1.0) -> list[dict]:
    """Rows at hour boundaries, some entities changing often, a few outside the range (not to be checked)."""
    rng = random.Random(seed)
    rows = []
    for region in ("eu", "us", "apac"):
        for shop_id in range(1, 30):
            hours = sorted(rng.sample(range(-2, 14), rng.randint(1, 9)))
            for hour in hours:
                revenue = rng.choice([None, math.nan, -5.0, 950.0] + [rng.uniform(0, 800)] * 20)
                rows.append({"region": region, "shop_id": shop_id, EVENT_TIMESTAMP: utc(START_MS + hour * HOUR_MS),
                             "revenue_1h": None if revenue is None else revenue * revenue_scale,
                             "sales_1h": rng.choice([0, 1, 2, 3, 9] + [None] * 2),
                             "channel": rng.choice(CHANNELS * 10 + ["fax", None] + [f"c{i}" for i in range(30)]),
                             "paid": rng.choice([True, False, None])})
    return rows


SCHEMA = pa.schema([("region", pa.string()), ("shop_id", pa.int64()), (EVENT_TIMESTAMP, pa.timestamp("ms", "UTC")),
                    ("revenue_1h", pa.float64()), ("sales_1h", pa.int64()), ("channel", pa.string()),
                    ("paid", pa.bool_())])


def write(data_dir, rows: list[dict]) -> None:
    path = offline_table_path(data_dir, VIEW)
    with RangeWriter(path, SCHEMA, START_MS - 2 * HOUR_MS, END_MS + 2 * HOUR_MS) as writer:
        writer.write(pa.Table.from_pylist(rows, SCHEMA))
        writer.commit()


def in_range(rows: list[dict]) -> list[dict]:
    ordered = sorted(rows, key=lambda r: (r["region"], r["shop_id"], r[EVENT_TIMESTAMP]))
    return [r for r in ordered if START_MS <= r[EVENT_TIMESTAMP].timestamp() * 1000 < END_MS]


def has_value(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def expected_samples(rows: list[dict], feature: str, failing) -> list[tuple]:
    return [(r["region"], r["shop_id"], r[EVENT_TIMESTAMP].isoformat().replace("+00:00", "Z"), r[feature])
            for r in rows if failing(r)][:SAMPLE_ROWS]


def got_samples(check) -> list[tuple]:
    return [(s["region"], s["shop_id"], s[EVENT_TIMESTAMP], s[check.feature]) for s in check.samples]


def oracle_weights(rows: list[dict]) -> list[float]:
    """Each row holds until the entity's next row or the range's end, at most the ttl."""
    out = []
    for i, row in enumerate(rows):
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        same = nxt is not None and (nxt["region"], nxt["shop_id"]) == (row["region"], row["shop_id"])
        until = nxt[EVENT_TIMESTAMP].timestamp() * 1000 if same else END_MS
        out.append(min(until - row[EVENT_TIMESTAMP].timestamp() * 1000, TTL_MS))
    return out


def oracle_cuts(pairs: list[tuple[float, float]]) -> list[float]:
    """The smallest value whose cumulative weight reaches each decile (the inverted CDF), each cut once."""
    pairs = sorted(pairs)
    total = sum(w for _, w in pairs)
    cuts = []
    for q in QUANTILES:
        running = 0.0
        for value, weight in pairs:
            running += weight
            if running >= q * total - 1e-9 * total:
                cuts.append(value)
                break
    return sorted(set(cuts))


@pytest.fixture
def checked(tmp_path):
    data_dir, url = tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}"
    rows = make_rows(seed=3)
    write(data_dir, rows)
    record = check_backfill([VIEW], utc(START_MS), utc(END_MS), data_dir, url, "shops")["shop_sales"]
    return rows, record, data_dir, url


def test_each_check_is_the_oracle_over_the_rows_of_the_range(checked):
    rows, record, _, _ = checked
    rows = in_range(rows)
    checks = {c.expectation: c for c in record.checks}
    assert record.rows == len(rows)

    outside = lambda r: has_value(r["revenue_1h"]) and not 0 <= r["revenue_1h"] <= 900  # noqa: E731
    check = checks["InRange(revenue_1h, min=0, max=900)"]
    assert (check.failing, check.passed) == (sum(map(outside, rows)), False)
    assert check.failing > 0 and got_samples(check) == expected_samples(rows, "revenue_1h", outside)

    present = sum(has_value(r["channel"]) for r in rows)
    check = checks["NotNullRate(channel, at_least=0.99)"]
    assert check.value == pytest.approx(present / len(rows))
    assert check.passed is (present / len(rows) >= 0.99) is False
    assert got_samples(check) == expected_samples(rows, "channel", lambda r: r["channel"] is None)
    check = checks["NotNullRate(paid, at_least=0.5)"]
    assert check.passed and check.value == pytest.approx(sum(has_value(r["paid"]) for r in rows) / len(rows))
    assert check.samples == ()

    foreign = lambda r: r["channel"] is not None and r["channel"] not in CHANNELS  # noqa: E731
    check = checks["AllowedValues(channel, values=['web', 'store', 'phone'])"]
    assert (check.failing, check.passed) == (sum(map(foreign, rows)), False)
    assert got_samples(check) == expected_samples(rows, "channel", foreign)
    too_many = lambda r: r["sales_1h"] is not None and r["sales_1h"] not in range(8)  # noqa: E731
    check = next(c for c in record.checks if c.feature == "sales_1h")
    assert check.failing == sum(map(too_many, rows)) > 0
    assert got_samples(check) == expected_samples(rows, "sales_1h", too_many)

    check = checks["MaxChange(revenue_1h, relative=0.2)"]
    assert check.passed and check.value is None  # a first backfill: nothing to compare with
    assert not record.passed and {c.feature for c in record.failed} == {"revenue_1h", "channel", "sales_1h"}


def test_the_null_rate_of_every_feature_is_recorded(checked):
    rows, record, _, url = checked
    rows = in_range(rows)
    features = ("revenue_1h", "sales_1h", "channel", "paid")
    want = {f: sum(not has_value(r[f]) for r in rows) / len(rows) for f in features}
    assert record.null_rates == pytest.approx(want) and 0 < want["channel"] < 1
    quality_log = QualityLog(url)
    try:
        assert quality_log.records("shops", "shop_sales")[-1].null_rates == pytest.approx(want)
    finally:
        quality_log.close()


def test_profiles_weigh_each_row_by_the_time_it_holds(checked):
    rows, record, _, _ = checked
    rows = in_range(rows)
    weights = oracle_weights(rows)
    numbers = [(r["revenue_1h"], w) for r, w in zip(rows, weights) if has_value(r["revenue_1h"])]
    profile = record.profiles["revenue_1h"]
    cuts = oracle_cuts(numbers)
    assert list(profile.cuts) == pytest.approx(cuts)
    total = sum(w for _, w in numbers)
    bounds = [-math.inf, *cuts, math.inf]
    shares = [sum(w for v, w in numbers if lo < v <= hi) / total for lo, hi in zip(bounds, bounds[1:])]
    assert list(profile.shares) == pytest.approx(shares)

    labels = [(r["channel"], w) for r, w in zip(rows, weights) if r["channel"] is not None]
    by_value: dict[str, float] = {}
    for value, weight in labels:
        by_value[value] = by_value.get(value, 0.0) + weight
    top = sorted(by_value, key=lambda v: (-by_value[v], v))[:TOP_CATEGORIES]
    profile = record.profiles["channel"]
    assert list(profile.categories) == top
    total = sum(by_value.values())
    rest = sum(w for v, w in by_value.items() if v not in top)
    assert list(profile.shares) == pytest.approx([by_value[v] / total for v in top] + [rest / total])
    assert set(record.profiles["paid"].categories) == {True, False}


def test_max_change_compares_the_mean_with_the_previous_backfill(checked):
    rows, first, data_dir, url = checked
    mean = lambda rs: sum(v for v in (r["revenue_1h"] for r in in_range(rs)) if has_value(v)) / sum(  # noqa: E731
        has_value(r["revenue_1h"]) for r in in_range(rs))
    assert first.means["revenue_1h"] == pytest.approx(mean(rows))
    for scale, passes in ((1.1, True), (1.5, False)):
        scaled = make_rows(seed=3, revenue_scale=scale)
        write(data_dir, scaled)
        again = check_backfill([VIEW], utc(START_MS), utc(END_MS), data_dir, url, "shops")["shop_sales"]
        check = next(c for c in again.checks if c.expectation.startswith("MaxChange"))
        want = abs(mean(scaled) - mean(rows)) / abs(mean(rows))
        assert check.value == pytest.approx(want) and check.passed is passes
        rows = scaled  # each backfill of the range compares with the one before it


def test_a_range_with_no_rows_passes_and_records_replace_what_they_contain(tmp_path, checked):
    _, _, data_dir, url = checked
    later = utc(END_MS + 48 * HOUR_MS)
    empty = check_backfill([VIEW], later, later + dt.timedelta(hours=1), data_dir, url, "shops")["shop_sales"]
    assert empty.rows == 0 and empty.passed and empty.profiles == {}
    nowhere = check_backfill([VIEW], later, later + dt.timedelta(hours=1), tmp_path / "none", url, "other")
    assert nowhere["shop_sales"].rows == 0
    quality_log = QualityLog(url)
    try:
        assert [r.passed for r in quality_log.holding("shops", "shop_sales", utc(START_MS), later)] == [False, True]
        check_backfill([VIEW], utc(START_MS - HOUR_MS), later + dt.timedelta(hours=2), data_dir, url, "shops")
        records = quality_log.records("shops", "shop_sales")
        assert [(r.start, r.end) for r in records] == [(utc(START_MS - HOUR_MS), later + dt.timedelta(hours=2))]
        assert set(quality_log.latest_profiles("shops")["shop_sales"]) == {"revenue_1h", "sales_1h", "channel", "paid"}
        assert quality_log.delete_project("shops") == 1 and quality_log.latest_profiles("shops") == {}
    finally:
        quality_log.close()


def test_integers_beyond_float64s_exact_range_are_profiled():
    """An int64 above 2**53 has no exact float64: its mean and profile round instead of failing the backfill."""
    big = 2**53 + 1
    rows = [{"region": "eu", "shop_id": 1, EVENT_TIMESTAMP: utc(START_MS + h * HOUR_MS), "revenue_1h": 1.0,
             "sales_1h": sales, "channel": "web", "paid": True} for h, sales in enumerate([big, big, None])]
    record = assess(VIEW, pa.Table.from_pylist(rows, SCHEMA), utc(START_MS), utc(END_MS), "shops", None)
    assert record.means["sales_1h"] == float(big)
    assert record.profiles["sales_1h"].cuts[-1] == float(big)
    assert record.null_rates["sales_1h"] == pytest.approx(1 / 3)


def test_in_range_compares_integers_exactly():
    """2**53 + 1 has no float64 of its own (it rounds to 2**53): an Int64 range check compares the integers."""
    import dataclasses

    big = 2**53 + 1
    view = dataclasses.replace(VIEW, expectations=[InRange("sales_1h", max=2**53), InRange("sales_1h", min=-0.5)])
    rows = [{"region": "eu", "shop_id": 1, EVENT_TIMESTAMP: utc(START_MS + h * HOUR_MS), "revenue_1h": 1.0,
             "sales_1h": sales, "channel": "web", "paid": True} for h, sales in enumerate([big, 2**53, 0, None])]
    record = assess(view, pa.Table.from_pylist(rows, SCHEMA), utc(START_MS), utc(END_MS), "shops", None)
    high, low = record.checks
    assert not high.passed and high.failing == 1 and high.samples[0]["sales_1h"] == big
    assert high.observed.endswith(f"observed min 0, max {big}")
    assert low.passed and low.failing == 0
