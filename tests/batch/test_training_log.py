"""`featurectl training-set --from-log`: labels joined to the latest vector logged for their entity at or before
their time, against an oracle written from the README's sentence, on an entity of two join keys."""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from cli_helpers import featurectl, register_repo

from batch.training import TrainingSetError
from batch.training_log import logged_training_table

DEFINITIONS = '''
from dsl import (Aggregation, Attribute, Entity, EventSource, FeatureLogging, FeatureService, FeatureView, Float64,
                 Int64, RequestFields, String, Timestamp, on_demand)

listing = Entity("listing", join_keys={"shop_id": String, "item_id": Int64})
sales = EventSource("sales", {"shop_id": String, "item_id": Int64, "price": Float64, "colour": String,
                              "ts": Timestamp}, timestamp_field="ts", path="sales")
listing_sales = FeatureView("listing_sales", listing, sales, tile="1h", features=[
    Aggregation("count", windows=["1h"], name="sold"), Aggregation("max", "price", windows=["24h"]),
    Attribute("colour")])
listing_scoring = FeatureService("listing_scoring", features=[listing_sales], logging=FeatureLogging(sample_rate=1))
unlogged = FeatureService("unlogged", features=[listing_sales])
bid = RequestFields("bid", {"bonus": Float64, "tag": String})


@on_demand(sources=[bid, listing_sales[["sold_1h"]]], schema={"boosted": Float64})
def boosted(inputs):
    return {"boosted": inputs["sold_1h"] + inputs["bonus"]}


bid_scoring = FeatureService("bid_scoring", features=[listing_sales[["colour"]], boosted],
                             logging=FeatureLogging(sample_rate=1))
boost_only = FeatureService("boost_only", features=[boosted], logging=FeatureLogging(sample_rate=1))
'''
FEATURES = ["listing_sales__sold_1h", "listing_sales__price_max_24h", "listing_sales__colour"]
START = dt.datetime(2026, 3, 1, 22, tzinfo=dt.timezone.utc)  # the logs span two __log_date folders


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """A registered repo and its service's logs: random vectors over four hours around midnight, with ties."""
    folder = tmp_path_factory.mktemp("traininglog")
    repo = folder / "repo"
    repo.mkdir()
    (repo / "features.py").write_text(DEFINITIONS)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump({
        "project": "traininglog", "provider": "local", "entity_key_serialization_version": 3,
        "registry": {"registry_type": "sql", "path": f"sqlite:///{folder / 'registry.db'}"},
        "online_store": {"type": "redis", "connection_string": "127.0.0.1:1"}, "offline_store": {"type": "file"},
        "platform": {"data_dir": str(folder / "data")}}))
    store = register_repo(repo)
    rng = random.Random(11)
    rows = []
    for n in range(400):
        at = START + dt.timedelta(seconds=rng.randrange(4 * 3600), microseconds=rng.randrange(3))
        rows.append({"shop_id": rng.choice(["s0", "s1", "s2"]), "item_id": rng.randrange(4), "__log_timestamp": at,
                     "__request_id": f"r{rng.randrange(1000):03d}", "listing_sales__sold_1h": n,
                     "listing_sales__price_max_24h": rng.choice([None, rng.random()]),
                     "listing_sales__colour": rng.choice(["red", "blue", None])})
    rows += [dict(rows[0], __request_id=rid, listing_sales__sold_1h=1000 + i) for i, rid in enumerate(["r998", "r0"])]
    _write_logs(folder / "data" / "feature_logs" / "listing_scoring", rows)
    return repo, store, rows


def _write_logs(path: Path, rows: list[dict]) -> None:
    """Hive-partitioned by __log_date as `featurectl serve` writes them; one older file lacks the colour."""
    for i, chunk in enumerate([rows[:150], rows[150:]]):
        for date in sorted({r["__log_timestamp"].date() for r in chunk}):
            part = [r for r in chunk if r["__log_timestamp"].date() == date]
            columns = {k: [r[k] for r in part] for k in part[0] if not (i == 0 and k == "listing_sales__colour")}
            for feature in FEATURES:
                if feature in columns:
                    columns[f"{feature}__status"] = [1] * len(part)
                    columns[f"{feature}__timestamp"] = [r["__log_timestamp"].replace(microsecond=0) for r in part]
            folder = path / f"__log_date={date.isoformat()}"
            folder.mkdir(parents=True, exist_ok=True)
            table = pa.table(columns)
            table = table.set_column(table.schema.get_field_index("__log_timestamp"), "__log_timestamp",
                                     table.column("__log_timestamp").cast(pa.timestamp("us", "UTC")))
            pq.write_table(table, folder / f"worker-{i}.parquet")


def _labels(rows: list[dict]) -> pa.Table:
    rng = random.Random(5)
    labels = []
    for _ in range(300):
        at = START + dt.timedelta(seconds=rng.randrange(-600, 5 * 3600), microseconds=rng.randrange(3))
        labels.append({"item_id": rng.randrange(5), "shop_id": rng.choice(["s0", "s1", "s2", None]),
                       "event_timestamp": at, "clicked": rng.random() < 0.3})
    first = rows[0]  # exactly at a logged time, and one microsecond before it
    labels.append({"item_id": first["item_id"], "shop_id": first["shop_id"], "event_timestamp":
                   first["__log_timestamp"], "clicked": True})
    labels.append({"item_id": first["item_id"], "shop_id": first["shop_id"], "event_timestamp":
                   first["__log_timestamp"] - dt.timedelta(microseconds=1), "clicked": False})
    return pa.Table.from_pylist(labels, schema=pa.schema([("item_id", pa.int64()), ("shop_id", pa.string()),
                                                          ("event_timestamp", pa.timestamp("us", "UTC")),
                                                          ("clicked", pa.bool_())]))


def _oracle(labels: pa.Table, rows: list[dict]) -> list[dict]:
    """The README's rule as written: the latest row logged for the same entity at or before the label's time; of
    rows logged at the same microsecond, the greatest request id; NULL when there is none."""
    out = []
    for label in labels.to_pylist():
        candidates = [r for r in rows if (r["shop_id"], r["item_id"]) == (label["shop_id"], label["item_id"])
                      and r["__log_timestamp"] <= label["event_timestamp"]]
        best = max(candidates, key=lambda r: (r["__log_timestamp"], r["__request_id"]), default=None)
        out.append({"__request_id": best and best["__request_id"],
                    **{f: best and best[f] for f in FEATURES}})
    return out


def test_labels_get_the_latest_vector_logged_at_or_before_them(logged):
    repo, store, rows = logged
    labels = _labels(rows)
    table = logged_training_table(labels, "listing_scoring", store)
    assert table.column_names[:4] == labels.column_names
    assert table.select(labels.column_names).equals(labels)
    got = table.select(["__request_id", *FEATURES]).to_pylist()
    as_stored = [dict(r, listing_sales__colour=None) if i < 150 else r for i, r in enumerate(rows)]  # older file
    assert got == _oracle(labels, as_stored)
    matched = sum(r["__request_id"] is not None for r in got)
    assert 50 < matched < labels.num_rows - 20  # labels before any log, unknown entities and null keys get NULLs
    assert got[-2]["__request_id"] == max(r["__request_id"] for r in rows
                                          if r["__log_timestamp"] == rows[0]["__log_timestamp"]
                                          and (r["shop_id"], r["item_id"]) == (rows[0]["shop_id"], rows[0]["item_id"]))


def test_the_cli_writes_the_same_table(logged, tmp_path):
    repo, store, rows = logged
    labels = _labels(rows)
    pq.write_table(labels, tmp_path / "labels.parquet")
    done = featurectl("--repo", str(repo), "training-set", "--from-log", "listing_scoring", "--labels",
                      str(tmp_path / "labels.parquet"), "--output", str(tmp_path / "out.parquet"))
    assert done.returncode == 0, done.stderr
    assert f"wrote {labels.num_rows} label rows" in done.stdout
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == \
        logged_training_table(labels, "listing_scoring", store).to_pylist()  # Parquet keeps seconds as ms


def test_a_csv_of_labels_reads_the_join_keys_as_their_logged_types(logged, tmp_path):
    """A String join key whose values all look like numbers stays text ("007" keeps its zeros; CSV inference made
    it the int64 7), and the labels join (here to no logged vector)."""
    from batch.training_log import label_key_types
    from featurectl.batch_commands import read_entities

    _, store, _ = logged
    assert {k: v.value for k, v in label_key_types("listing_scoring", store).items()} == {"item_id": "int64",
                                                                                          "shop_id": "string"}
    path = tmp_path / "labels.csv"
    path.write_text("shop_id,item_id,event_timestamp\n123,1,2026-03-01T00:00:00Z\n007,2,2026-03-01T00:00:00Z\n")
    labels = read_entities(path, "--labels", types=label_key_types("listing_scoring", store))
    assert labels.column("shop_id").to_pylist() == ["123", "007"]
    assert logged_training_table(labels, "listing_scoring", store).column("__request_id").to_pylist() == [None, None]


@pytest.mark.parametrize("service, labels, fragment", [
    ("unlogged", None, "feature service `unlogged` has no file logging: add logging=FeatureLogging"),
    ("nope", None, "feature service `nope` is not in the registry"),
    ("listing_scoring", pa.table({"shop_id": ["s0"], "event_timestamp": [0]}), "the labels lack join key(s) item_id"),
    ("listing_scoring", pa.table({"shop_id": ["s0"], "item_id": ["x"], "event_timestamp": [0]}),
     "join key `item_id` is string in the labels but int64 in the logs"),
    ("listing_scoring", pa.table({"shop_id": ["s0"], "item_id": [1], "event_timestamp": [0], "__request_id": ["a"]}),
     "label column(s) __request_id would be replaced"),
    ("boost_only", None, "feature service `boost_only` logs no join keys to match labels on"),
])
def test_errors_say_what_to_do(logged, service, labels, fragment):
    _, store, _ = logged
    labels = labels if labels is not None else pa.table({"shop_id": ["s0"], "item_id": [1], "event_timestamp": [0]})
    with pytest.raises(TrainingSetError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        logged_training_table(labels, service, store)


def test_an_on_demand_views_request_data_is_logged_not_matched_on(logged):
    """Feast's log schema of `bid_scoring` has `bonus` and `tag` (what its on-demand view reads from the request):
    labels need only the view's join keys, and get the request data beside the features."""
    from common.log_columns import log_columns

    _, store, _ = logged
    columns = log_columns(store.get_feature_service("bid_scoring"), store.registry, store.project)
    assert (set(columns.join_keys), columns.request_fields) == ({"shop_id", "item_id"}, ("bonus", "tag"))
    assert columns.features == ("listing_sales__colour", "boosted__boosted")
    at = START + dt.timedelta(minutes=5)
    log = {"shop_id": ["s0"], "item_id": [1], "listing_sales__colour": ["red"],
           "listing_sales__colour__timestamp": [START], "listing_sales__colour__status": [1], "bonus": [0.5],
           "tag": ["promo"], "boosted__boosted": [3.5], "boosted__boosted__timestamp": [START],
           "boosted__boosted__status": [1], "__log_timestamp": [at], "__request_id": ["r1"]}
    folder = Path(store.get_feature_service("bid_scoring").logging_config.destination.path) / "__log_date=2026-03-01"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(log).cast(columns.schema.remove(columns.schema.get_field_index("__log_date"))),
                   folder / "worker-0.parquet")
    labels = pa.table({"shop_id": ["s0", "s1"], "item_id": [1, 1], "event_timestamp": [at, at]})
    out = logged_training_table(labels, "bid_scoring", store).to_pylist()
    assert [(r["bonus"], r["tag"], r["boosted__boosted"], r["__request_id"]) for r in out] == [
        (0.5, "promo", 3.5, "r1"), (None, None, None, None)]


@pytest.mark.parametrize("args", [["--from-log", "listing_scoring"], ["--labels", __file__],
                                  ["--from-log", "s", "--labels", __file__, "--service", "s"]])
def test_from_log_goes_with_labels_alone(args, tmp_path):
    from click.testing import CliRunner

    from featurectl.batch_commands import training_set

    result = CliRunner().invoke(training_set, [*args, "--out", str(tmp_path / "out.parquet")])
    assert result.exit_code == 2 and "--from-log SERVICE takes --labels FILE and --out FILE" in result.output
