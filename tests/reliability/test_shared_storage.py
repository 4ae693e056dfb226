"""Shared storage on a real S3 server (S3Proxy, started by `featurectl services up --s3`): a backfill that reads its
history from S3, exports its tiles there and writes its offline tables there is exact, and `materialize` reads
those tables from S3; a stream keeps its checkpoints and history tiles in S3,
and killed, resumes from a checkpoint there, its served values equal to the oracle."""

from __future__ import annotations

import random
import uuid
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pytest
import redis
import yaml
from pyarrow import fs

from cli_helpers import ROOT, featurectl, free_port
from common.config import load_config
from dsl import load_repo
from fault_env import sibling

stream_env = sibling("stream_env", "streaming")
exactness = sibling("test_stream_exactness", "streaming")
history = sibling("backfill_history", "batch")
backfill_rows = sibling("test_backfill", "batch")
materialized = sibling("test_materialize", "batch")
training = sibling("test_training_set", "batch")
in_process = sibling("version_env", "featurectl")  # the CLI in this process: a subprocess costs seconds of imports
StreamProcess, StreamRepo = stream_env.StreamProcess, stream_env.StreamRepo
MINUTE, T0 = exactness.MINUTE, exactness.T0
BUCKET = "featurectl-shared"
KEYS = {"AWS_ACCESS_KEY_ID": "featurectl-test", "AWS_SECRET_ACCESS_KEY": "featurectl-test-secret"}
# botocore (under s3fs, which Feast's file offline store reads S3 with) asks for checksums S3Proxy does not
# implement ("A header you provided implies functionality that is not implemented"); only when required, then
BOTOCORE_CHECKSUMS = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                      "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The S3 server of a scratch repo; yields the `platform` settings that put a repo's shared storage on it and
    the folder where the server keeps the bucket's objects."""
    env = pytest.MonkeyPatch()
    for name, value in {**KEYS, **BOTOCORE_CHECKSUMS}.items():
        env.setenv(name, value)
    port = free_port()
    platform = {"s3": {"endpoint": f"http://127.0.0.1:{port}", "local_port": port, "path_style_access": True}}
    try:
        with storage_service(tmp_path_factory.mktemp("shared_storage"), "s3", platform,
                             f"s3://{BUCKET}/services") as repo:
            yield platform, load_config(repo).state_dir / "s3" / "data" / BUCKET
    finally:
        env.undo()


@contextmanager
def storage_service(folder, service: str, platform: dict, shared_storage: str):
    """A scratch repo in `folder` with these `platform` settings and shared storage, whose `service` runs (started
    by `featurectl services up --only`) while the context lasts; yields the repo's folder."""
    repo = sibling("test_services", "featurectl").scratch_repo(folder)
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    raw["platform"].update(platform, shared_storage=shared_storage)
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    up = featurectl("--repo", str(repo), "services", "up", "--only", service)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield repo
    finally:
        down = featurectl("--repo", str(repo), "services", "down")
        assert down.returncode == 0, down.stdout + down.stderr


def stored_files(folder) -> list:
    """The objects the S3 server holds under `folder` (its filesystem backend lists an empty folder as an object
    that cannot be deleted; the files on its disk are what it stores)."""
    return [p for p in folder.rglob("*") if p.is_file()]


def on_s3(repo_yaml, s3: tuple, prefix: str) -> None:
    platform = s3[0]
    raw = yaml.safe_load(repo_yaml.read_text())
    raw["platform"].update(platform, shared_storage=f"s3://{BUCKET}/{prefix}")
    repo_yaml.write_text(yaml.safe_dump(raw))


def upload(folder, storage) -> None:
    """Copy a local folder's files to a folder of shared storage."""
    filesystem, path = storage.located()
    fs.copy_files(str(folder), path, source_filesystem=fs.LocalFileSystem(), destination_filesystem=filesystem)


def test_backfill_from_history_in_s3_to_an_offline_table_in_s3_is_exact_and_materializes(s3, tmp_path):
    """History, exported tiles and offline tables all in S3: the backfill is exact, nothing of it lands in the
    local data folder, and `materialize` reads the table from S3 into Redis."""
    repo = history.example_repo_copy(tmp_path / "repo", tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}")
    on_s3(repo / "feature_store.yaml", s3, "backfill")
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    raw["project"] = project = f"s3data_{uuid.uuid4().hex[:8]}"
    raw["platform"]["data_storage"] = f"s3://{BUCKET}/data"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    data = load_config(repo).data_storage
    backfill_exactly(repo, data, tmp_path / "upload")
    assert not stored_files(s3[1] / "backfill"), "the backfill's tiles were left in S3"
    assert not (tmp_path / "data").exists(), "the backfill wrote to the local data folder"
    assert_materializes(repo, data, project)
    assert_feast_reads_the_same(repo, data)


def backfill_exactly(repo, data, scratch) -> None:
    """Put the example's history into the data storage (written in `scratch` first), apply the repo and backfill
    the history's span: every offline table exact against the oracle."""
    events = history.write_history(load_repo(ROOT / "feature_repo"), scratch)
    upload(scratch, data)
    start, end = history.utc(history.T0_MS), history.utc(history.T1_MS)
    in_process.run(repo, "apply")
    # a subprocess: PyFlink's JVM takes the classpath the storage needs only when it starts (see common.flink)
    done = featurectl("--repo", str(repo), "backfill", "--start", start.isoformat(), "--end", end.isoformat(),
                      timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for view in load_repo(repo).views:
        if view.offline:
            backfill_rows.assert_rows_match_oracle(view, backfill_rows.read_offline(data, view),
                                                   events[view.source.name], history.T0_MS, history.T1_MS)


def assert_materializes(repo, data, project: str) -> None:
    """`materialize` of the history's span puts each entity's latest row of asset_activity's offline table
    (read from `data`) into Redis."""
    start, end = history.utc(history.T0_MS), history.utc(history.T1_MS)
    view = load_repo(repo).view("asset_activity")
    in_process.run(repo, "materialize", start.isoformat(), end.isoformat(), "--view", view.name)
    client = redis.Redis(*load_config(repo).redis_host_port)
    try:
        expected = materialized.expected_latest(backfill_rows.read_offline(data, view), start, end)
        ids = sorted(expected)
        assert ids and materialized.read_ours(client, project, view, ids) == [
            {name: expected[i][name] for name in view.output_schema()} for i in ids]
    finally:
        materialized.cleanup(client, project)


def assert_feast_reads_the_same(repo, data) -> None:
    """Feast's file offline store reads the tables in S3 (its FileSource carries the S3 endpoint) and agrees
    with our training-set reader on every row it returns (see `test_training_set` for the rows it drops)."""
    from feast import FeatureStore

    from batch.training import get_historical_features

    requests = training.request_rows(200, seed=4).to_pandas()
    requests["request"] = np.arange(len(requests))
    store = FeatureStore(repo_path=str(repo))
    theirs = store.get_historical_features(entity_df=requests, features=store.get_feature_service(
        "asset_ranking")).to_df().set_index("request").sort_index()
    ours = get_historical_features(requests, "asset_ranking", load_repo(repo), data)
    ours = ours.set_index("request").loc[theirs.index]
    assert len(theirs) > len(requests) / 2
    def values(column) -> list:
        return [None if pd.isna(v) else v for v in column]

    for name in load_repo(repo).view("asset_activity").feature_names + ["category", "style"]:
        assert values(ours[name]) == values(theirs[name]), name


def test_stream_checkpoints_in_s3_and_resumes_from_them_exactly(s3, tmp_path):
    repo = StreamRepo.create(tmp_path / "repo", ("asset_activity",), name="stream_s3")
    on_s3(repo.folder / "feature_store.yaml", s3, "streams-test")
    view = repo.views()[0]
    rng, log = random.Random(31), stream_env.EventLog()
    halves = exactness.interaction_parts(log, rng, 2, 600, 30 * MINUTE, 40)
    on_time_after = [len([e for e in log.on_time if e["event_time"] < T0 + (i + 1) * 30 * MINUTE]) for i in range(2)]
    stream = StreamProcess(repo, tmp_path / "stream-1.log")
    try:
        stream.wait_running()
        stream_env.produce(repo.topic, halves[0])
        applied = stream.wait_events({view.name: on_time_after[0]})
        status = stream.wait(lambda s: (s.get("checkpoint") or {}).get("at", "") > applied["updated_at"],
                             "a checkpoint after the first half")
        assert status["checkpoint"]["path"].startswith(f"s3://{BUCKET}/streams-test/streams/"), status["checkpoint"]
        shared = load_config(repo.folder).shared_storage.child("streams")
        assert any(p.endswith("/_metadata") and "/chk-" in p for p in shared.files()), shared.files()
        assert not list((repo.folder / "state").rglob("chk-*")), "checkpoints went to the local state folder"
        stream.kill()

        stream = StreamProcess(repo, tmp_path / "stream-2.log")
        status = stream.wait_running()
        assert (status["restored_from"] or "").startswith(f"s3://{BUCKET}/"), status["restored_from"]
        stream_env.produce(repo.topic, halves[1])
        stream.wait_events({view.name: on_time_after[1]})
        keys = sorted({e["asset_id"] for e in log.on_time})
        want, got = stream_env.expected(view, log.on_time), stream_env.served(repo.project, view, keys)
        assert not stream_env.mismatches(want, got, view.feature_names)
        assert stream.stop() == 0
        in_process.run(repo.folder, "teardown", "--yes")
        assert not stored_files(s3[1] / "streams-test"), "teardown left the stream's files in S3"
    finally:
        stream.kill()
        repo.cleanup()
