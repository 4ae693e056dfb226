"""Push against the shared Redis and Kafka and one running `featurectl stream` (one Flink job for the module):
events pushed over HTTP (`POST /push`) and by the sync and async SDK (dicts, columns, a DataFrame) reach the stream,
and every window equals the oracle afterwards; events pushed `online_and_offline` also land in the Parquet history
as a file the backfill's input check accepts; an attribute view's values land in Feast's layout under the
event-time guard and the key ttl; refusals write nothing; Feast's own `store.push` to our push sources."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml
from confluent_kafka import Consumer, TopicPartition

from cli_helpers import free_port, project_keys, register_repo, sibling
from common.config import load_config
from dsl.types import ValueType
from feature_repo.sample_data import SampleSpec
from redis_store.layout import KeyEncoder
from serving_env import feature_server, post

pytestmark = pytest.mark.integration

stream_env = sibling("stream_env", "streaming")

MINUTE, HOUR = 60_000, 3_600_000
T0 = int(time.time() * 1000) // MINUTE * MINUTE - 3 * HOUR
SPEC = SampleSpec(n_assets=30, n_users=100, seed=23)
KEY_TTL_S = 3600
ATTRIBUTES = ("category", "creator_id", "style", "bbox_x", "bbox_y", "bbox_z", "polygon_count")

VIEWS = """\
catalog = dataclasses.replace(example.catalog, kafka_topic={topic!r} + "-catalog")
asset_activity = dataclasses.replace(example.asset_activity, source=interactions)
asset_attributes = dataclasses.replace(example.asset_attributes, source=catalog)"""


def write_repo(repo: "stream_env.StreamRepo") -> None:
    """The streaming suite's repo with an attribute view beside `asset_activity`, the key ttl and API keys on."""
    settings = yaml.safe_load(stream_env.FEATURE_STORE_YAML.format(
        project=repo.project, folder=repo.folder, redis_port=stream_env.REDIS_PORT, bootstrap=stream_env.BOOTSTRAP))
    settings["online_store"]["key_ttl_seconds"] = KEY_TTL_S
    settings["platform"]["auth"] = {"enabled": True, "refresh_s": 0.5}
    (repo.folder / "feature_store.yaml").write_text(yaml.safe_dump(settings))
    (repo.folder / "features.py").write_text(stream_env.FEATURES_PY.format(topic=repo.topic,
                                                                           views=VIEWS.format(topic=repo.topic)))


@dataclass
class Env:
    repo: "stream_env.StreamRepo"
    url: str
    keys: dict[str, str]  # key name -> secret
    stream: "stream_env.StreamProcess"
    log: "stream_env.EventLog"

    @property
    def folder(self) -> Path:
        return self.repo.folder

    def push(self, body: dict, key: str | None = "pusher") -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self.keys[key]}"} if key else {}
        return post(self.url, body, "/push", headers)

    def view(self, name: str):
        return next(v for v in self.repo.views() if v.name == name)


@pytest.fixture(scope="module")
def env(tmp_path_factory, local_services):
    folder = tmp_path_factory.mktemp("push") / "repo"
    folder.mkdir()
    suffix = uuid.uuid4().hex[:8]
    repo = stream_env.StreamRepo(folder, f"push_test_{suffix}", f"push-test-{suffix}")
    write_repo(repo)
    register_repo(folder)
    store = project_keys(folder)
    keys = {name: store.create(name, services, 1000, 1000, pushes)[1] for name, services, pushes in (
        ("pusher", [], ["*"]), ("reader", ["*"], []), ("attributes", [], ["asset_attributes_push"]))}
    stream = stream_env.StreamProcess(repo, folder.parent / "stream.log", "--view", "asset_activity")
    try:
        with feature_server(folder, free_port()) as url:
            stream.wait_running()
            yield Env(repo, url, keys, stream, stream_env.EventLog())
    finally:
        stream.stop()
        repo.cleanup()


def topic_end(topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": stream_env.BOOTSTRAP, "group.id": f"test-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def events_body(events: list[dict], to: str = "online") -> dict:
    return {"push_source_name": "asset_interactions", "to": to,
            "df": {c: [e.get(c) for e in events] for c in stream_env.COLUMNS}}


def test_refused_pushes_write_nothing(env):
    good = stream_env.sample_events(SPEC, 3, T0 - HOUR, T0, part=9)
    now = int(time.time() * 1000)
    cases = [
        ({**events_body(good), "push_source_name": "asset_interaction"}, 400, "unknown_push_source",
         "did you mean `asset_interactions`?"),
        ({**events_body(good), "push_source_name": "asset_activity_push"}, 400, "push_refused",
         "Push the events to `asset_interactions` instead"),
        (events_body([*good[:2], {**good[2], "dwell_ms": "42"}]), 400, "bad_rows",
         "row 2, column `dwell_ms`: int64 takes an integer, not str '42'"),
        (events_body([*good[:1], {**good[1], "event_time": float(good[1]["event_time"])}]), 400, "bad_rows",
         "row 1, column `event_time`: timestamp takes an integer (epoch milliseconds)"),
        (events_body([good[0], {**good[1], "asset_id": None}]), 400, "bad_rows",
         "row 1, column `asset_id`: no value, but source `asset_interactions` needs one"),
        (events_body([{**good[0], "event_time": good[0]["event_time"] // 1000}]), 400, "bad_rows",
         "it looks like seconds"),
        (events_body([{**good[0], "event_time": now + 2 * HOUR}]), 400, "bad_rows", "more than an hour ahead"),
        ({"push_source_name": "asset_interactions", "df": {"asset_id": ["a"], "event_time": [now], "dwel_ms": [1]}},
         400, "bad_rows", "has no column 'dwel_ms'"),
        ({"push_source_name": "asset_interactions", "df": {"user_id": ["u"], "event_time": [now]}}, 400,
         "bad_rows", "needs column `asset_id`"),
        ({**attribute_body(["a"], now, "x"), "to": "online_and_offline"}, 400, "push_refused",
         "the offline table of `asset_attributes` is the backfill's"),
        ({**events_body(good), "too": "online"}, 400, "bad_request", "unknown field 'too'"),
        (b'{"push_source_name": "asset_interactions", "df": ', 400, "malformed_json", "malformed JSON"),
    ]
    before = topic_end(env.repo.topic)
    for body, status, code, fragment in cases:
        got, reply = env.push(body)
        assert (got, reply["code"]) == (status, code), (body, reply)
        assert fragment in reply["error"], reply
    assert env.push(events_body(good), key=None)[1]["code"] == "missing_api_key"
    status, reply = env.push(events_body(good), key="reader")  # reading everything grants no push
    assert status == 403 and "may not push to 'asset_interactions'" in reply["error"] and "--push" in reply["error"]
    assert env.push(events_body(good), key="attributes")[0] == 403
    assert topic_end(env.repo.topic) == before
    assert not (env.folder / "data" / "asset_interactions").exists()
    with urllib.request.urlopen(env.url + "/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    assert 'featurectl_responses_total{endpoint="/push",status="400"}' in metrics


async def _push_async(folder: Path, rows) -> object:
    from serving import AsyncOnlineClient

    async with AsyncOnlineClient.from_repo(folder) as client:
        return await client.push("asset_interactions", rows)


def test_pushed_events_reach_the_running_stream_and_windows_stay_exact(env):
    import pandas as pd

    from serving import OnlineClient

    events = stream_env.sample_events(SPEC, 800, T0, T0 + 120 * MINUTE, part=1)
    http, rows, frame, offline = events[:250], events[250:450], events[450:650], events[650:]
    status, reply = env.push(events_body(http))
    assert status == 200 and reply["events_sent"] == len(http), reply
    with OnlineClient.from_repo(env.folder) as client:
        result = client.push("asset_interactions", rows)
    assert (result.rows, result.events_sent, result.history_file) == (len(rows), len(rows), None)
    table = pd.DataFrame(frame).astype({"dwell_ms": "Int64"})  # absent dwell times: pandas' NA, not a float NaN
    table["event_time"] = pd.to_datetime(table["event_time"], unit="ms", utc=True)
    assert asyncio.run(_push_async(env.folder, table)).events_sent == len(frame)
    status, reply = env.push(events_body(offline, "online_and_offline"))
    assert status == 200 and reply["events_sent"] == len(offline) and reply["history_file"].startswith("push-")
    for event in events:
        env.log.event(event)
    env.stream.wait_events({"asset_activity": len(env.log.on_time)})
    view = env.view("asset_activity")
    want = stream_env.expected(view, env.log.on_time)
    got = stream_env.served(env.repo.project, view, sorted(want))
    assert want.keys() == got.keys() and len(want) > 10
    assert not stream_env.mismatches(want, got, view.feature_names)


def test_events_pushed_offline_are_history_the_backfill_accepts(env):
    import pyarrow.parquet as pq

    from batch.input_schema import SourceNeeds, check_history

    history = env.folder / "data" / "asset_interactions"
    files = sorted(history.iterdir())
    assert [f.name[:5] for f in files] == ["push-"] and files[0].suffix == ".parquet"
    table = pq.read_table(files[0])
    source = env.view("asset_activity").source
    assert table.schema.names == list(source.schema)
    assert [f.type for f in table.schema] == [k.arrow_type() for k in source.schema.values()]
    offline = stream_env.sample_events(SPEC, 800, T0, T0 + 120 * MINUTE, part=1)[650:]
    assert table.to_pylist() == [{c: e.get(c) for c in source.schema} for e in offline]
    checked = check_history(SourceNeeds.of_views([env.view("asset_activity")]), env.folder / "data")
    assert checked.rows == {"asset_interactions": len(offline)} and not checked.warnings
    assert checked.latest_ms["asset_interactions"] == max(e["event_time"] for e in offline)


def test_events_kafka_does_not_take_leave_no_history_behind(env):
    from serving.catalog import Catalog
    from serving.errors import PushUnavailableError
    from serving.push import Pusher

    pusher = Pusher(env.folder)
    pusher.bootstrap_servers, pusher.delivery_timeout_s = f"127.0.0.1:{free_port()}", 1.0  # nothing listens there
    events = stream_env.sample_events(SPEC, 2, T0, T0 + MINUTE, part=7)
    prepared = pusher.prepare(Catalog(env.repo.project, {}, {}), "asset_interactions", events, "online_and_offline")
    history = env.folder / "data" / "asset_interactions"
    before = sorted(history.iterdir())
    with pytest.raises(PushUnavailableError, match="did not take 2 of 2 events .* nothing was written: push the "
                                                   "same rows again"):
        pusher.write_events(prepared)
    assert sorted(history.iterdir()) == before


def attribute_body(assets: list[str], at, category: str) -> dict:
    values = {"category": category, "creator_id": "creator_1", "style": "voxel", "bbox_x": 1.5, "bbox_y": 2.0,
              "bbox_z": 0.25, "polygon_count": 1200}
    return {"push_source_name": "asset_attributes_push",
            "df": {"asset_id": assets, "event_timestamp": [at] * len(assets),
                   **{name: [value] * len(assets) for name, value in values.items()}}}


def _attributes(folder: Path, assets: list[str]) -> dict:
    from serving import OnlineClient

    with OnlineClient.from_repo(folder) as client:
        return client.get_features([f"asset_attributes:{a}" for a in ATTRIBUTES], {"asset_id": assets})


def test_attribute_values_are_written_online_under_the_event_time_guard(env):
    import pandas as pd

    from feast import FeatureStore

    from serving import OnlineClient

    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    status, reply = env.push(attribute_body(["attr_a", "attr_b"], (now - dt.timedelta(hours=1)).isoformat(),
                                            "plant"), key="attributes")
    assert status == 200 and (reply["online_written"], reply["online_older_skipped"]) == (2, 0), reply
    older = attribute_body(["attr_a"], int((now - dt.timedelta(hours=2)).timestamp() * 1000), "vehicle")
    status, reply = env.push(older, key="attributes")
    assert status == 200 and (reply["online_written"], reply["online_older_skipped"]) == (0, 1), reply
    values = _attributes(env.folder, ["attr_a", "attr_b"])
    assert values["category"] == ["plant", "plant"] and values["polygon_count"] == [1200, 1200]
    newer = pd.DataFrame({"asset_id": ["attr_a"], "event_timestamp": [pd.Timestamp(now)], "category": ["building"],
                          "creator_id": [None], "style": ["voxel"], "bbox_x": [3.0], "bbox_y": [1.0],
                          "bbox_z": [2.0], "polygon_count": [9]})
    with OnlineClient.from_repo(env.folder) as client:
        assert client.push("asset_attributes_push", newer).online_written == 1
    values = _attributes(env.folder, ["attr_a", "attr_b"])
    assert values["category"] == ["building", "plant"] and values["creator_id"] == [None, "creator_1"]
    key = KeyEncoder(env.repo.project, {"asset_id": ValueType.STRING}).key(["attr_a"])
    assert 0 < redis.Redis(port=stream_env.REDIS_PORT).ttl(key) <= KEY_TTL_S
    store = FeatureStore(config=load_config(env.folder).feast_repo_config())
    feast = store.get_online_features(features=["asset_attributes:category", "asset_attributes:bbox_x"],
                                      entity_rows=[{"asset_id": "attr_a"}]).to_dict()
    assert (feast["category"], feast["bbox_x"]) == (["building"], [3.0])


def test_feasts_own_push_online_lands_in_our_layout_and_offline_is_refused(env):
    import pandas as pd

    from feast import FeatureStore
    from feast.data_source import PushMode

    from batch.feast_offline_store import OfflinePushRefused
    from batch.offline_table import RangeWriter
    from batch.windows import offline_schema
    from dsl.compile_feast import offline_table_path
    from dsl.compile_flink import SourceSettings, compile_view

    store = FeatureStore(config=load_config(env.folder).feast_repo_config())
    now = dt.datetime.now(dt.timezone.utc)
    frame = pd.DataFrame({"asset_id": ["feast_a"], "event_timestamp": [now], "category": ["terrain"],
                          "creator_id": ["creator_9"], "style": ["cartoon"], "bbox_x": [0.5], "bbox_y": [0.75],
                          "bbox_z": [1.25], "polygon_count": [321]})
    store.push("asset_attributes_push", frame, to=PushMode.ONLINE)
    values = _attributes(env.folder, ["feast_a"])
    assert {a: values[a][0] for a in ATTRIBUTES} == {a: frame[a][0] for a in ATTRIBUTES}

    view = env.view("asset_attributes")
    table = offline_table_path(env.folder / "data", view)
    schema = offline_schema(compile_view(view, SourceSettings(stream_env.BOOTSTRAP, env.folder / "data")))
    day = int(time.time() // 86_400) * 86_400_000
    with RangeWriter(table, schema, day, day + 86_400_000) as writer:
        writer.write(pa_rows(schema, frame, day))
        writer.commit()
    before = {p: p.read_bytes() for p in table.rglob("*") if p.is_file()}
    with pytest.raises(OfflinePushRefused, match=r"`asset_attributes`: its offline table .* is written by "
                                                 r"`featurectl backfill` only .* then backfill"):
        store.push("asset_attributes_push", frame, to=PushMode.ONLINE_AND_OFFLINE)
    assert {p: p.read_bytes() for p in table.rglob("*") if p.is_file()} == before


def pa_rows(schema, frame, at_ms: int):
    """One offline-table row of the view, as a backfill writes it."""
    import pyarrow as pa

    columns = {f.name: [at_ms] if f.name == "event_timestamp" else frame[f.name].tolist() for f in schema}
    return pa.table({name: pa.array(values, type=schema.field(name).type) for name, values in columns.items()})
