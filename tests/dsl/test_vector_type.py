"""`dsl.Vector(dim)`: validated eagerly, registered in Feast as an indexed float list, written in Feast's layout
byte for byte (Feast's own protobuf and its own `get_online_features` read it), decoded by our SDK as a list of
floats, and pushed only at the declared dimension."""

from __future__ import annotations

import datetime as dt
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from feast import types as ft
from feast.protos.feast.types.Value_pb2 import FloatList, Value

from cli_helpers import sibling
from dsl import Aggregation, Attribute, Entity, EventSource, FeatureView, String, Timestamp, Vector
from dsl.compile_feast import feast_field
from dsl.errors import DefinitionError, TypeMismatchError
from redis_store import columns, layout
from serving.push_rows import PushRowError, check_columns

vector_env = sibling("vector_env", "serving")
asset = Entity("asset", join_keys={"asset_id": String})


def _source(kind) -> EventSource:
    return EventSource(name="shapes", schema={"asset_id": String, "embedding": kind, "at": Timestamp},
                       timestamp_field="at", path="shapes")


@pytest.mark.parametrize("dim", [0, -3, 40_000, 2.5, "8", True])
def test_dimension_is_bounded(dim):
    with pytest.raises(TypeMismatchError, match="dim .* is not an int from 1 to 32768"):
        Vector(dim)


def test_unknown_metric_is_refused():
    with pytest.raises(TypeMismatchError, match="metric 'hamming' is unknown; use one of: L2, COSINE, IP"):
        Vector(8, metric="hamming")


def test_vector_is_an_attribute_not_an_aggregation():
    view = FeatureView("shape", asset, _source(Vector(8)), features=[Attribute("embedding")])
    assert view.output_schema() == {"embedding": Vector(8)} and view.vector_features == {"embedding": Vector(8)}
    with pytest.raises(TypeMismatchError, match=r"`last` over vector\(8\) column `embedding`.*Attribute"):
        FeatureView("shape", asset, _source(Vector(8)), features=[Aggregation("last", "embedding", windows=["1h"])])


def test_one_vector_feature_per_view():
    source = EventSource("two", {"asset_id": String, "a": Vector(4), "b": Vector(4), "t": Timestamp}, "t", path="two")
    with pytest.raises(DefinitionError, match=r"feature view `two_vectors`: has 2 Vector features \(a, b\): Feast "
                                              r"indexes one vector feature per view.*a feature view of its own"):
        FeatureView("two_vectors", asset, source, [Attribute("a"), Attribute("b")])


def test_source_names_vector_among_the_types():
    with pytest.raises(TypeMismatchError, match="Vector\\(dim\\)"):
        _source(list)


def test_feast_field_carries_the_index_flags():
    field = feast_field("embedding", Vector(16, metric="COSINE"))
    assert field.dtype == ft.Array(ft.Float32)
    assert (field.vector_index, field.vector_length, field.vector_search_metric) == (True, 16, "COSINE")
    assert not feast_field("category", String).vector_index


def test_arrow_type_is_a_fixed_size_float32_list():
    assert Vector(4).arrow_type() == pa.list_(pa.float32(), 4)


@pytest.mark.parametrize("dim", [1, 2, 31, 32, 33, 128, 4096])
def test_encoding_is_feasts_protobuf(dim):
    values = np.random.default_rng(dim).normal(size=dim).astype(np.float32).tolist()
    ours = layout.encode_value(values, Vector(dim))
    assert ours == Value(float_list_val=FloatList(val=values)).SerializeToString()
    assert layout.decode_value(ours) == values
    column = pa.array([values, None, values], pa.list_(pa.float32()))
    assert columns.value_column(column, Vector(dim)).to_pylist() == [ours, b"", ours]
    fixed = pa.array([values, None, values], Vector(dim).arrow_type())
    assert columns.value_column(fixed.slice(1), Vector(dim)).to_pylist() == [b"", ours]


def test_column_of_another_dimension_is_refused():
    with pytest.raises(ValueError, match=r"row 1 holds 3 numbers where a vector\(4\) needs 4"):
        columns.value_column(pa.array([[1, 2, 3, 4], [1, 2, 3]]), Vector(4))


@pytest.mark.parametrize("value, message", [
    ([1.0, 2.0], r"vector\(3\) takes a list of 3 numbers, got 2: the dimension does not match"),
    ("abc", r"vector\(3\) takes a list of 3 numbers, not str"),
    ([1.0, "x", 2.0], r"element 1: float32 takes a number, not str"),
    ([1.0, float("nan"), 2.0], r"element 1: nan is not a finite number"),
])
def test_push_rows_check_the_dimension(value, message):
    with pytest.raises(PushRowError, match=f"row 0, column `embedding`: {message}"):
        check_columns({"embedding": [value]}, {"embedding": Vector(3)}, {}, "push source `p`")
    assert check_columns({"embedding": [[1, 2.5, 3]]}, {"embedding": Vector(3)}, {}, "push source `p`") == 1


@pytest.mark.integration
def test_pushed_vectors_read_back_by_our_sdk_and_feast(tmp_path, local_services):
    from serving.client import OnlineClient

    project = f"vec{time.time_ns() % 10**9}"
    repo, store = vector_env.make_vector_repo(tmp_path, project, dim=8)
    vectors = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    ids = ["a1", "a2", "a3"]
    now_ms = int(time.time() * 1000) - 60_000
    with OnlineClient.from_repo(repo) as client:
        client.push("asset_shape_push", {"asset_id": ids, "category": ["chair", "table", None], "faces": [1, 2, 3],
                                         "embedding": list(vectors), "event_timestamp": [now_ms] * 3})
        with pytest.raises(PushRowError, match="row 0, column `embedding`: .*got 7: the dimension does not match"):
            client.push("asset_shape_push", {"asset_id": ["a4"], "category": ["x"], "faces": [1],
                                             "embedding": [[0.0] * 7], "event_timestamp": [now_ms]})
        ours = client.get_features(["asset_shape:embedding", "asset_shape:category"],
                                   [{"asset_id": i} for i in [*ids, "a4"]])
    assert ours["embedding"][:3] == vectors.tolist() and ours["embedding"][3] is None
    theirs = store.get_online_features(["asset_shape:embedding"], [{"asset_id": i} for i in ids]).to_dict()
    assert [list(v) for v in theirs["embedding"]] == vectors.tolist()


@pytest.mark.integration
def test_materialized_vectors_read_back_by_feast(tmp_path, local_services):
    from batch.materialize import materialize_view
    from common.config import load_config
    from dsl.repo import load_repo
    from redis_store.settings import RedisSettings

    project = f"vec{time.time_ns() % 10**9}"
    repo, store = vector_env.make_vector_repo(tmp_path, project, dim=5)
    cfg = load_config(repo)
    view = load_repo(repo).views[0]
    vectors = np.random.default_rng(2).normal(size=(4, 5)).astype(np.float32)
    when = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=1)
    table = pa.table({"asset_id": ["m1", "m2", "m3", "m4"], "category": ["a", "b", "c", "d"], "faces": [1, 2, 3, 4],
                      "embedding": pa.array(list(vectors), Vector(5).arrow_type()),
                      "event_timestamp": pa.array([when] * 4, pa.timestamp("us", "UTC"))})
    path = tmp_path / "offline"
    path.mkdir()
    pq.write_table(table, path / "part.parquet")
    hour = dt.timedelta(hours=1)
    materialize_view(RedisSettings.from_config(cfg), view, project, path, when - hour, when + hour)
    theirs = store.get_online_features(["asset_shape:embedding", "asset_shape:faces"],
                                       [{"asset_id": i} for i in ["m1", "m2", "m3", "m4"]]).to_dict()
    assert [list(v) for v in theirs["embedding"]] == vectors.tolist() and theirs["faces"] == [1, 2, 3, 4]
