"""The Parquet history checked against its sources before any Flink job: each problem an error naming the file and
the column, data the job would drop a warning with counts. A ride-hailing repo (integer and string keys, a float,
an int32 and a boolean column, pickup times in ms) rather than the example's assets."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batch import input_schema
from batch.history import ParquetHistory
from batch.input_schema import InputSchemaError, SourceNeeds, check_history
from cli_helpers import copy_example_repo, featurectl
from dsl import (Aggregation, Attribute, Bool, Entity, EventSource, FeatureView, Float64, Int32, Int64, String,
                 Timestamp, col)

PICKUP_MS = 1_790_000_000_000  # 2026-09-21T13:33:20Z
SCHEMA = {"driver_id": Int64, "zone": String, "fare": Float64, "riders": Int32, "pooled": Bool, "note": String,
          "pickup_ms": Timestamp}
driver = Entity("driver", join_keys={"driver_id": Int64})
zone = Entity("zone", join_keys={"zone": String})
trips = EventSource("trips", schema=SCHEMA, timestamp_field="pickup_ms", path="rides/trips")
earnings = FeatureView("driver_earnings", entity=driver, source=trips, tile="10m", ttl="1d", features=[
    Aggregation("sum", "fare", windows=["1h", "6h"], name="fares"),
    Aggregation("count", windows=["1h"], filter=col("pooled") == True, name="pooled_trips"),  # noqa: E712
    Attribute("zone", name="last_zone"),
])
demand = FeatureView("zone_demand", entity=zone, source=trips, tile="10m", ttl="1d",
                     features=[Aggregation("sum", "riders", windows=["1h"], name="riders")])
VIEWS = [earnings, demand]
FEATURES_PY = '''
from dsl import Aggregation, Entity, EventSource, FeatureView, Float64, Int64, String, Timestamp
driver = Entity("driver", join_keys={"driver_id": Int64})
trips = EventSource("trips", schema={"driver_id": Int64, "zone": String, "fare": Float64, "pickup_ms": Timestamp},
                    timestamp_field="pickup_ms", path="rides/trips")
earnings = FeatureView("driver_earnings", entity=driver, source=trips, tile="10m", ttl="1d",
                       features=[Aggregation("sum", "fare", windows=["1h"], name="fares")])
'''


def trips_table(n: int, seed: int = 0, start_ms: int = PICKUP_MS) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "driver_id": pa.array(rng.integers(1, 40, n), pa.int64()),
        "zone": pa.array(rng.choice(["north", "south", "harbour"], n)),
        "fare": pa.array(rng.gamma(2.0, 9.0, n).round(2)),
        "riders": pa.array(rng.integers(1, 5, n), pa.int32()),
        "pooled": pa.array(rng.random(n) < 0.3),
        "note": pa.array(["" for _ in range(n)]),
        "pickup_ms": pa.array(start_ms + np.sort(rng.integers(0, 6 * 3_600_000, n)), pa.int64()),
    })


def folder(data_dir: Path) -> Path:
    out = data_dir / "rides" / "trips"
    out.mkdir(parents=True, exist_ok=True)
    return out


def write(data_dir: Path, name: str, table: pa.Table, **options) -> Path:
    path = folder(data_dir) / name
    pq.write_table(table, path, **options)
    return path


def check(data_dir: Path, **options):
    return check_history(SourceNeeds.of_views(VIEWS), data_dir, **options)


def problem(data_dir: Path) -> str:
    with pytest.raises(InputSchemaError) as caught:
        check(data_dir)
    return str(caught.value)


def test_a_clean_history_passes_and_skips_hidden_files(tmp_path):
    write(tmp_path, "day-1.parquet", trips_table(500, 1))
    write(tmp_path, "day-2.parquet", trips_table(300, 2), row_group_size=64)
    (folder(tmp_path) / "_SUCCESS").write_text("")
    (folder(tmp_path) / ".day-1.parquet.crc").write_bytes(b"\x00crc")
    checked = check(tmp_path)
    assert checked.rows == {"trips": 800} and checked.warnings == ()


def test_the_columns_are_those_the_views_read(tmp_path):
    write(tmp_path, "day-1.parquet", trips_table(50).drop_columns(["note"]))  # declared, read by no view
    assert check(tmp_path).rows == {"trips": 50}
    needs = SourceNeeds.of_views(VIEWS)[0]
    assert needs.readers == {"driver_id": ("driver_earnings",), "pickup_ms": ("driver_earnings", "zone_demand"),
                             "fare": ("driver_earnings",), "pooled": ("driver_earnings",),
                             "zone": ("driver_earnings", "zone_demand"), "riders": ("zone_demand",)}
    assert needs.keys == ("driver_id", "zone")


def test_a_missing_column_names_the_file_the_column_and_its_views(tmp_path):
    write(tmp_path, "day-1.parquet", trips_table(50, 1))
    bad = write(tmp_path, "day-2.parquet", trips_table(50, 2).drop_columns(["fare"]))
    message = problem(tmp_path)
    assert message.startswith(f"{bad}: no column `fare` (float64)"), message
    assert "view `driver_earnings` reads" in message and "read it as NULL" in message


@pytest.mark.parametrize("column, values, found, fix", [
    ("fare", pa.array(["12.5"] * 20), "string", "write it as double"),
    ("riders", pa.array(range(20), pa.int64()), "int64", "write it as int32"),
    ("driver_id", pa.array(["d1"] * 20), "string", "write it as int64"),
    ("pickup_ms", pa.array([PICKUP_MS * 1000] * 20, pa.timestamp("us", "UTC")), 'timestamp[us, tz=UTC]',
     '.cast(pa.timestamp("ms")).cast(pa.int64())'),
])
def test_a_wrong_type_says_what_the_source_declares(tmp_path, column, values, found, fix):
    table = trips_table(20)
    write(tmp_path, "day-1.parquet", table.set_column(table.schema.get_field_index(column), column, values))
    message = problem(tmp_path)
    assert f"`{column}` is {found}" in message and fix in message, message
    if column == "pickup_ms":
        assert "declares epoch milliseconds (int64" in message


def test_strings_may_be_large_or_dictionary_encoded(tmp_path):
    table = trips_table(30)
    table = table.set_column(1, "zone", table.column("zone").cast(pa.large_string()))
    write(tmp_path, "day-1.parquet", table.set_column(1, "zone", pa.chunked_array(
        [table.column("zone").combine_chunks().dictionary_encode()])))
    assert check(tmp_path).rows == {"trips": 30}


def test_corrupt_and_zero_byte_files_are_errors(tmp_path):
    write(tmp_path, "day-1.parquet", trips_table(40))
    good = (folder(tmp_path) / "day-1.parquet").read_bytes()
    (folder(tmp_path) / "day-2.parquet").write_bytes(good[: len(good) // 2])  # truncated: no footer
    (folder(tmp_path) / "notes.txt").write_text("not parquet")
    (folder(tmp_path) / "day-3.parquet").write_bytes(b"")
    message = problem(tmp_path)
    assert message.startswith("the Parquet history does not match its sources (2 problems)"), message
    lines = message.splitlines()[1:]
    assert lines[0].strip().startswith(f"{folder(tmp_path) / 'day-2.parquet'} (and 1 more file): not a readable "
                                       "Parquet file (Parquet magic bytes not found"), message
    assert lines[1].strip().startswith(f"{folder(tmp_path) / 'day-3.parquet'}: empty (0 bytes), not a Parquet file")


def test_every_problem_at_once_and_capped(tmp_path, monkeypatch):
    table = trips_table(20)
    write(tmp_path, "a.parquet", table.drop_columns(["fare"]))
    write(tmp_path, "b.parquet", table.drop_columns(["zone", "riders"]))
    write(tmp_path, "c.parquet", table.set_column(4, "pooled", pa.array([1] * 20, pa.int8())))
    assert problem(tmp_path).count("\n  ") == 4
    monkeypatch.setattr(input_schema, "MAX_LISTED", 2)
    message = problem(tmp_path)
    assert "(4 problems)" in message and message.count("\n  ") == 3 and message.endswith("... and 2 more")


def test_empty_files_warn_and_a_source_without_rows_is_an_error(tmp_path, caplog):
    with pytest.raises(InputSchemaError, match=r"source `trips` has no history at .*rides/trips: write Parquet"):
        check(tmp_path)
    assert check(tmp_path, require_rows=False).rows == {"trips": 0}
    empty = write(tmp_path, "day-0.parquet", trips_table(0))
    with pytest.raises(InputSchemaError, match=r"source `trips` has no events: the 1 Parquet file at .* no rows"):
        check(tmp_path)
    write(tmp_path, "day-1.parquet", trips_table(25))
    assert check(tmp_path).warnings == (f"source `trips`: 1 of its 2 Parquet files hold no rows (e.g. {empty}); "
                                        "they add nothing",)


@pytest.mark.parametrize("statistics", [True, False])
def test_times_in_seconds_and_null_keys_are_counted(tmp_path, statistics):
    table = trips_table(1_000, 3)
    seconds = table.set_column(6, "pickup_ms", pa.array(np.full(1_000, PICKUP_MS // 1000)))
    first = write(tmp_path, "day-1.parquet", pa.concat_tables([table.slice(0, 600), seconds.slice(0, 400)]),
                  write_statistics=statistics, row_group_size=250)  # one row group holds both units
    keys = table.column("driver_id").to_pylist()
    keys[::100] = [None] * 10
    zones = table.column("zone").to_pylist()
    zones[5::250] = [None] * 4  # `zone_demand` is keyed by it; `driver_earnings` only reads it (and counts them)
    times = table.column("pickup_ms").to_pylist()
    times[:3] = [None] * 3
    nulls = table.set_column(0, "driver_id", pa.array(keys, pa.int64())).set_column(6, "pickup_ms",
                                                                                    pa.array(times, pa.int64()))
    nulls = nulls.set_column(1, "zone", pa.array(zones, pa.string()))
    second = write(tmp_path, "day-2.parquet", nulls, write_statistics=statistics)
    assert check(tmp_path).warnings == (
        f"source `trips`: 3 of 2,000 events have no event time (`pickup_ms` is NULL, e.g. in {second}): every view "
        "skips them",
        f"source `trips`: 400 of 2,000 events have event times before 1973-03-03 (`pickup_ms` below 1e11 ms, e.g. in "
        f"{first}): timestamps look like seconds: multiply by 1000",
        f"source `trips`: 10 of 2,000 events have a NULL join key `driver_id` (e.g. in {second}): the views keyed "
        "by it (`driver_earnings`) skip them",
        f"source `trips`: 4 of 2,000 events have a NULL join key `zone` (e.g. in {second}): the views keyed by it "
        "(`zone_demand`) skip them",
    )


@pytest.mark.parametrize("statistics", [True, False])
def test_the_latest_event_time_is_found_with_or_without_statistics(tmp_path, statistics):
    tables = [trips_table(700, 1), trips_table(300, 2)]
    for i, table in enumerate(tables):
        write(tmp_path, f"day-{i}.parquet", table, write_statistics=statistics, row_group_size=128)
    times = pa.concat_tables(tables).column("pickup_ms")
    assert check(tmp_path).latest_ms == {"trips": pc.max(times).as_py()}


def test_times_in_microseconds_are_counted(tmp_path):
    table = trips_table(100)
    write(tmp_path, "day-1.parquet", table.set_column(6, "pickup_ms", pa.array(np.full(100, PICKUP_MS * 1000))))
    (warning,) = check(tmp_path).warnings
    assert "100 of 100 events have event times after the year 5138" in warning and "divide by 1,000" in warning


def test_the_stream_history_checks_its_files_and_warns_once(tmp_path, caplog):
    history = ParquetHistory(tmp_path, f"sqlite:///{tmp_path / 'registry.db'}", "rides")
    assert history.cutovers([trips], now_ms=PICKUP_MS * 2) == {}
    write(tmp_path, "day-1.parquet", trips_table(10).set_column(6, "pickup_ms", pa.array([1_790_000_000] * 10)))
    with caplog.at_level(logging.WARNING, logger="batch.history"):
        assert history.cutovers([trips], now_ms=PICKUP_MS * 2) == {"trips": 1_790_000_001}
        history.cutovers([trips], now_ms=PICKUP_MS * 2)
    assert [r.getMessage() for r in caplog.records if "look like seconds" in r.getMessage()] == [
        f"source `trips`: 10 of 10 events have event times before 1973-03-03 (`pickup_ms` below 1e11 ms, e.g. in "
        f"{folder(tmp_path) / 'day-1.parquet'}): timestamps look like seconds: multiply by 1000"]
    (folder(tmp_path) / "day-2.parquet").write_text("{}")
    with pytest.raises(InputSchemaError, match="day-2.parquet: not a readable Parquet file"):
        history.cutovers([trips], now_ms=PICKUP_MS * 2)


def _rides_repo(tmp_path: Path) -> Path:
    repo = copy_example_repo(tmp_path, "rides", {"path": f"sqlite:///{tmp_path / 'registry.db'}"},
                             data_dir=tmp_path / "data")
    (repo / "features.py").write_text(FEATURES_PY)
    return repo


def test_backfill_with_a_missing_column_stops_before_flink(tmp_path):
    bad = write(tmp_path / "data", "day-1.parquet", trips_table(30).select(["driver_id", "zone", "pickup_ms"]))
    done = featurectl("--repo", str(_rides_repo(tmp_path)), "backfill", "--start", "2026-09-21",
                      "--end", "2026-09-22")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert error.startswith(f"Error: {bad}: no column `fare` (float64)"), error
    assert not (tmp_path / "data" / "offline").exists()  # validation comes before any job or output


@pytest.mark.integration
def test_backfill_of_times_in_seconds_warns_and_reads_nothing(tmp_path, caplog):
    from backfill_history import batch_env
    from batch.backfill import BackfillTarget, backfill

    table = trips_table(200)
    write(tmp_path / "data", "day-1.parquet", table.set_column(6, "pickup_ms", pa.array(
        np.asarray(table.column("pickup_ms")) // 1000)))
    target = BackfillTarget(tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}", "rides")
    start = dt.datetime.fromtimestamp(PICKUP_MS / 1000, dt.timezone.utc)
    with caplog.at_level(logging.WARNING, logger="batch.backfill"):
        summary = backfill([earnings], start, start + dt.timedelta(hours=6), target, env=batch_env())
    assert summary.events_read == 0 and summary.rows_written == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("200 of 200 events have event times before 1973-03-03" in w and "multiply by 1000" in w
               for w in warnings), warnings
    assert any("none of its events is in [2026-09-19" in w for w in warnings), warnings  # two 1d windows back
