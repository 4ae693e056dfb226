"""The compatibility promise, both ways, on the local Redis: what Feast writes our SDK reads identically, and what
`redis_store.layout` writes Feast's `get_online_features` reads identically. Also ttl, missing entities, output
formats, the async client and the registry refresh."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time

import pytest
import redis
from serving_env import feast_rows, make_repo

from dsl.types import ValueType
from redis_store import layout
from serving.client import AsyncOnlineClient, OnlineClient
from serving.errors import EntityError, RequestError, UnknownFeatureError, UnknownServiceError

pytestmark = pytest.mark.integration

ACTIVITY_INTS = ["views_10m", "views_1h", "views_24h", "likes_10m", "likes_1h", "likes_24h", "downloads_10m",
                 "downloads_1h", "downloads_24h", "generations_1h", "generations_24h", "unique_users_1h",
                 "unique_users_24h", "dwell_ms_max_24h"]
ACTIVITY = {
    "a1": {**{f: i for i, f in enumerate(ACTIVITY_INTS)}, "views_24h": 16384, "likes_24h": 10 ** 12,
           "downloads_24h": -5, "dwell_ms_mean_1h": 1.5, "last_user_24h": "ülrike"},
    "a2": {**{f: 7 for f in ACTIVITY_INTS}, "dwell_ms_mean_1h": -0.0, "last_user_24h": "u" * 300},
    "a3": {**{f: 1 for f in ACTIVITY_INTS}, "dwell_ms_mean_1h": 1e300, "last_user_24h": ""},
}
ATTRIBUTES = {
    "a1": {"category": "chair", "creator_id": "c1", "style": "🪑 modern", "bbox_x": 0.25, "bbox_y": -3.5,
           "bbox_z": 0.0, "polygon_count": 2 ** 40},
    "a2": {"category": "lamp", "creator_id": "c2", "style": "", "bbox_x": 1.0, "bbox_y": 2.0, "bbox_z": 3.0,
           "polygon_count": 0},
}
FEATURES = ["asset_activity:views_1h", "asset_attributes:category", "asset_activity:dwell_ms_mean_1h",
            "asset_attributes:bbox_x", "asset_activity:last_user_24h", "asset_activity:likes_24h",
            "asset_activity:downloads_24h", "asset_attributes:polygon_count", "asset_attributes:style"]
ROWS = ["a1", "missing", "a2", "a3", "a1"]  # a3 has no attributes; a1 twice


@pytest.fixture(scope="module")
def feast_written(tmp_path_factory, local_services):
    """A project of its own on the local Redis, filled by Feast's own write path."""
    host, port = local_services.redis_host_port
    repo, store = make_repo(tmp_path_factory.mktemp("compat"), f"servingcompat{os.getpid()}", f"{host}:{port}")
    feast_rows(store, "asset_activity", ACTIVITY)
    feast_rows(store, "asset_attributes", ATTRIBUTES)
    feast_rows(store, "asset_activity", {"old": ACTIVITY["a1"]},
               event_time=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3))
    client = OnlineClient.from_repo(repo)
    yield repo, store, client
    client.close()
    _delete_project_keys(redis.Redis(host=host, port=port), store.project)


def _delete_project_keys(client: redis.Redis, project: str) -> None:
    keys = list(client.scan_iter(match=b"*" + project.encode(), count=1000))
    if keys:
        client.delete(*keys)


def _feast_dict(store, features, rows, **kwargs) -> dict:
    return store.get_online_features(features, [{"asset_id": r} for r in rows], **kwargs).to_dict()


def test_values_written_by_feast_read_identically(feast_written):
    _, store, client = feast_written
    ours = client.get_features(FEATURES, {"asset_id": ROWS})
    assert ours == _feast_dict(store, FEATURES, ROWS)
    assert list(ours) == ["asset_id", *(f.split(":")[1] for f in FEATURES)]  # request order
    assert ours["last_user_24h"] == ["ülrike", None, "u" * 300, "", "ülrike"]
    assert ours["likes_24h"][0] == 10 ** 12 and ours["downloads_24h"][0] == -5


def test_feature_service_and_full_names_match_feast(feast_written):
    _, store, client = feast_written
    on_demand = {"asset_ranking": ["asset_ratios__likes_per_view_24h", "asset_ratios__bbox_volume"],
                 "cube3d_conditioning": []}
    for service in ("asset_ranking", "cube3d_conditioning"):
        ours = client.get_features(service, [{"asset_id": r} for r in ROWS], full_feature_names=True)
        theirs = _feast_dict(store, store.get_feature_service(service), ROWS, full_feature_names=True)
        # Feast 0.67 leaves on-demand features out of answers with full names (test_on_demand_serving compares them)
        assert {k: v for k, v in ours.items() if k in theirs} == theirs
        assert [k for k in ours if k not in theirs] == on_demand[service]


def test_response_body_matches_feast_feature_server(feast_written):
    from feast.feature_server_utils import convert_response_to_dict

    _, store, client = feast_written
    ours = client.get_online_features(FEATURES, {"asset_id": ROWS}).to_feast_response()
    theirs = convert_response_to_dict(store.get_online_features(FEATURES, [{"asset_id": r} for r in ROWS]).proto)
    ours_by_name = dict(zip(ours["metadata"]["feature_names"], ours["results"]))
    theirs_by_name = dict(zip(theirs["metadata"]["feature_names"], theirs["results"]))
    assert ours_by_name.keys() == theirs_by_name.keys()
    for name, result in theirs_by_name.items():
        assert ours_by_name[name]["values"] == result["values"], name
        assert ours_by_name[name]["event_timestamps"] == result["event_timestamps"], name
    # where Feast 0.67 says PRESENT for a row it did not find, we say NOT_FOUND (as Feast's proto documents)
    assert ours_by_name["views_1h"]["statuses"] == ["PRESENT", "NOT_FOUND", "PRESENT", "PRESENT", "PRESENT"]
    assert ours_by_name["category"]["statuses"][3] == "NOT_FOUND"


def test_values_written_with_redis_layout_read_identically_by_feast(feast_written):
    _, store, client = feast_written
    host, port = client.settings.nodes[0]
    writer = redis.Redis(host=host, port=port)
    keys = layout.KeyEncoder(store.project, {"asset_id": ValueType.STRING})
    now_ms = int(time.time() * 1000) - 60_000
    kinds = {"views_1h": ValueType.INT64, "likes_24h": ValueType.INT64, "downloads_24h": ValueType.INT64,
             "dwell_ms_mean_1h": ValueType.FLOAT64, "last_user_24h": ValueType.STRING}
    rows = {"w1": {"views_1h": 3, "likes_24h": 2 ** 62, "downloads_24h": -(2 ** 40), "dwell_ms_mean_1h": 0.1,
                   "last_user_24h": "ß" * 200},
            "w2": {"views_1h": 0, "likes_24h": None, "downloads_24h": 16383, "dwell_ms_mean_1h": None,
                   "last_user_24h": "w"}}
    for i, (asset, row) in enumerate(rows.items()):
        mapping = {layout.field_name("asset_activity", f): layout.encode_value(v, kinds[f]) for f, v in row.items()}
        mapping[layout.ts_field("asset_activity")] = layout.encode_timestamp(now_ms + i * 1001)
        writer.hset(keys.key([asset]), mapping=mapping)
    features = [f"asset_activity:{f}" for f in kinds]
    assets = ["w1", "w2", "nobody"]
    assert client.get_features(features, {"asset_id": assets}) == _feast_dict(store, features, assets)


def test_stale_missing_and_null_values_come_back_as_none(feast_written):
    _, _, client = feast_written
    response = client.get_online_features(["asset_activity:views_1h", "asset_attributes:category"],
                                          {"asset_id": ["old", "nobody", "a3"]})
    assert response.to_dict() == {"asset_id": ["old", "nobody", "a3"], "views_1h": [None, None, 1],
                                  "category": [None, None, None]}
    body = response.to_feast_response()["results"]
    assert body[1]["statuses"] == ["OUTSIDE_MAX_AGE", "NOT_FOUND", "PRESENT"]  # asset_activity's ttl is 2 days
    assert body[2]["statuses"] == ["NOT_FOUND", "NOT_FOUND", "NOT_FOUND"]


@pytest.mark.parametrize("row", ["a1", "a2", "a3", "missing", "old"])
def test_one_row_answers_as_that_row_of_a_batch(feast_written, row):
    """One-row requests take their own decoding path: values, statuses and timestamps must not differ."""
    _, store, client = feast_written
    rows = [*ROWS, "old"]
    batch = client.get_online_features(FEATURES, {"asset_id": rows}).to_feast_response()
    alone = client.get_online_features(FEATURES, {"asset_id": [row]}).to_feast_response()
    at = rows.index(row)
    assert alone["metadata"] == batch["metadata"]
    assert alone["results"] == [{k: [v[at]] for k, v in result.items()} for result in batch["results"]]
    if row != "old":  # Feast 0.67's SDK returns a stale row's values; we return None, as its statuses say
        assert client.get_features(FEATURES, {"asset_id": [row]}) == _feast_dict(store, FEATURES, [row])


def test_zero_rows_give_empty_columns(feast_written):
    _, _, client = feast_written
    assert client.get_features(FEATURES[:2], {"asset_id": []}) == {"asset_id": [], "views_1h": [], "category": []}


def test_arrow_and_pandas_outputs_are_typed(feast_written):
    _, _, client = feast_written
    table = client.get_features(FEATURES, {"asset_id": ROWS}, output="arrow")
    assert table.column_names == ["asset_id", *(f.split(":")[1] for f in FEATURES)]
    assert str(table.schema.field("views_1h").type) == "int64" and str(table.schema.field("bbox_x").type) == "double"
    frame = client.get_features(FEATURES, {"asset_id": ROWS}, output="pandas")
    assert frame["asset_id"].tolist() == ROWS and frame["category"].isna().tolist() == [False, True, False, True, False]
    with pytest.raises(ValueError, match="unknown `output`"):
        client.get_features(FEATURES, {"asset_id": ROWS}, output="csv")


def test_async_client_reads_what_the_sync_one_reads(feast_written):
    repo, _, client = feast_written

    async def read() -> tuple:
        async with AsyncOnlineClient.from_repo(repo) as aclient:
            return await asyncio.gather(aclient.get_features(FEATURES, {"asset_id": ROWS}),
                                        aclient.get_features("asset_ranking", {"asset_id": ROWS}))

    mine, service = asyncio.run(read())
    assert mine == client.get_features(FEATURES, {"asset_id": ROWS})
    assert service == client.get_features("asset_ranking", {"asset_id": ROWS})


@pytest.mark.parametrize("features, rows, error, fragment", [
    (["asset_activity:view_1h"], {"asset_id": ["a"]}, UnknownFeatureError, "did you mean `asset_activity:views_1h`"),
    (["asset_activty:views_1h"], {"asset_id": ["a"]}, UnknownFeatureError, "did you mean `asset_activity`"),
    (["views_1h"], {"asset_id": ["a"]}, UnknownFeatureError, "not of the form `view:feature`"),
    ("asset_rankin", {"asset_id": ["a"]}, UnknownServiceError, "did you mean `asset_ranking`"),
    ([], {"asset_id": ["a"]}, RequestError, "no features requested"),
    (["asset_activity:views_1h"], {"asset_id": [1]}, EntityError, "row 0 holds int 1"),
    (["asset_activity:views_1h"], {"user_id": ["u"]}, EntityError, "lack join key(s) `asset_id`"),
    (["asset_activity:views_1h"], {"asset_id": ["a"], "x": ["b"]}, EntityError, "unknown join key(s) `x`"),
    (["asset_activity:views_1h", "user_activity:events_1h"], {"asset_id": ["a"], "user_id": ["u", "v"]},
     EntityError, "different lengths"),
    (["asset_activity:generations_1h", "user_activity:generations_24h", "asset_activity:generations_24h"],
     {"asset_id": ["a"], "user_id": ["u"]}, RequestError, "pass full_feature_names"),
])
def test_bad_requests_say_what_is_wrong(feast_written, features, rows, error, fragment):
    _, _, client = feast_written
    with pytest.raises(error) as caught:
        client.get_features(features, rows)
    assert fragment in str(caught.value)


def test_two_entities_in_one_request(feast_written):
    _, store, client = feast_written
    features = ["asset_activity:views_1h", "user_activity:events_1h"]
    rows = {"asset_id": ["a1", "a2"], "user_id": ["u1", "u2"]}
    assert client.get_features(features, rows) == store.get_online_features(
        features, [{"asset_id": a, "user_id": u} for a, u in zip(*rows.values())]).to_dict()


def test_registry_changes_reach_the_client_in_the_background(feast_written):
    from feast import FeatureService

    repo, store, _ = feast_written
    client = OnlineClient.from_repo(repo, refresh_s=0.2)
    try:
        with pytest.raises(UnknownServiceError):
            client.get_features("fresh_service", {"asset_id": ["a1"]})
        store.apply([FeatureService(name="fresh_service", features=[store.get_feature_view("asset_attributes")[
            ["category"]]])])
        deadline = time.monotonic() + 15
        while "fresh_service" not in client.registry.catalog.services and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get_features("fresh_service", {"asset_id": ["a1"]}) == {"asset_id": ["a1"],
                                                                               "category": ["chair"]}
    finally:
        client.close()
