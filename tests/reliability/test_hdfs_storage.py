"""Shared storage on a real HDFS (Hadoop's MiniDFSCluster, started by `featurectl services up --hdfs`): a backfill
whose PyFlink job reads its history from `hdfs://`, exports its tiles there and writes its offline tables there
is exact, and `materialize` reads those tables back through WebHDFS; featurectl's own file operations (listing,
reading, writing, moving, deleting) work on the same filesystem."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pytest
import yaml

from cli_helpers import featurectl, free_port, sibling
from common.config import load_config
from common.storage import HDFS_CLIENT_JAR_GLOBS, Storage, StorageError

history = sibling("backfill_history", "batch")
shared = sibling("test_shared_storage", "reliability")


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    """The HDFS of a scratch repo; yields the `platform` settings that reach it and its hdfs:// URI."""
    rpc, http = free_port(), free_port()
    platform = {"hdfs": {"local_port": rpc, "local_http_port": http, "webhdfs": f"http://127.0.0.1:{http}"}}
    uri = f"hdfs://127.0.0.1:{rpc}"
    with shared.storage_service(tmp_path_factory.mktemp("hdfs_storage"), "hdfs", platform, f"{uri}/services"):
        yield platform, uri


def on_hdfs(repo, hdfs: tuple, prefix: str) -> str:
    """Point the repo's shared and data storage at folders of the HDFS; returns the project's new name."""
    platform, uri = hdfs
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    raw["project"] = project = f"hdfsdata_{uuid.uuid4().hex[:8]}"
    raw["platform"].update(platform, shared_storage=f"{uri}/{prefix}/shared", data_storage=f"{uri}/{prefix}/data")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    return project


@pytest.mark.integration
def test_backfill_from_history_in_hdfs_to_an_offline_table_in_hdfs_is_exact_and_materializes(hdfs, tmp_path):
    """History, exported tiles and offline tables all in HDFS: the backfill is exact, nothing of it lands in the
    local data folder or stays in the shared folder, and `materialize` reads the table from HDFS into Redis."""
    repo = history.example_repo_copy(tmp_path / "repo", tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}")
    project = on_hdfs(repo, hdfs, "backfill")
    cfg = load_config(repo)
    data = cfg.data_storage
    shared.backfill_exactly(repo, data, tmp_path / "upload")
    assert not cfg.shared_storage.files(), "the backfill's tiles were left in HDFS"
    assert not (tmp_path / "data").exists(), "the backfill wrote to the local data folder"
    shared.assert_materializes(repo, data, project)
    data.delete()
    assert not data.exists() and not data.parent.files()


@pytest.mark.integration
def test_files_written_moved_and_deleted_in_hdfs(hdfs, tmp_path):
    """Storage's operations on hdfs://: a written Parquet file is listed with its time and read back, a move
    makes the target's folders, a delete removes the folder and what it holds, and a missing folder is empty."""
    platform, uri = hdfs
    repo = history.example_repo_copy(tmp_path / "repo", tmp_path / "data", f"sqlite:///{tmp_path / 'registry.db'}")
    on_hdfs(repo, hdfs, "files")
    root = load_config(repo).shared_storage
    table = pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    root.child("in").write_parquet("part/one.parquet", table)
    assert root.child("nowhere").files() == [] and not root.child("nowhere").exists()
    assert root.files() == ["in/part/one.parquet"] and root.mtime_ns("in/part/one.parquet") > 0
    root.child("in").move_files(root.child("out", "deep"))
    assert root.files() == ["out/deep/part/one.parquet"]
    assert root.child("out").dataset().to_table().equals(table)
    root.delete()
    assert not root.exists()
    root.delete()

    unreachable = Storage(f"{uri}/x", None, None)
    with pytest.raises(StorageError, match="platform.hdfs.webhdfs"):
        unreachable.files()


def test_missing_hdfs_jars_say_run_setup(tmp_path):
    """Without the jars `scripts/setup.sh` fetches, `up --hdfs` and a Flink job on hdfs:// name the folder and
    the fix (an install error, not a skip)."""
    empty = tmp_path / "jars"
    (empty / "flink-fs").mkdir(parents=True)
    repo = sibling("test_services", "featurectl").scratch_repo(tmp_path)
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    raw["platform"]["hdfs"] = {"local_port": free_port(), "local_http_port": free_port()}
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
    done = featurectl("--repo", str(repo), "services", "up", "--only", "hdfs",
                      env={**os.environ, "FEATURECTL_JARS": str(empty)})
    assert done.returncode != 0
    assert f"no hadoop-hdfs-*-tests.jar in {empty / 'hdfs'}: run scripts/setup.sh" in done.stderr
    storage = Storage("hdfs://127.0.0.1:1/x")
    with pytest.raises(StorageError, match="hadoop-client-api-.*run scripts/setup.sh"):
        storage.jvm_environment(empty / "flink-fs")
    for glob in HDFS_CLIENT_JAR_GLOBS:
        (empty / "flink-fs" / glob.replace("*", "1.0")).touch()
    assert storage.jvm_environment(empty / "flink-fs") == {"HADOOP_CLASSPATH": ":".join(
        str(empty / "flink-fs" / glob.replace("*", "1.0")) for glob in HDFS_CLIENT_JAR_GLOBS)}


def test_up_starts_the_local_hdfs_when_the_data_is_on_it(tmp_path):
    from featurectl.services import wanted_services

    repo = sibling("test_services", "featurectl").scratch_repo(tmp_path)
    raw = yaml.safe_load((repo / "feature_store.yaml").read_text())
    for host, started in (("127.0.0.1", True), ("localhost", True), ("namenode.example", False)):
        raw["platform"]["data_storage"] = f"hdfs://{host}:19870/data"
        (repo / "feature_store.yaml").write_text(yaml.safe_dump(raw))
        names = [svc.name for svc in wanted_services(load_config(repo), None, False)]
        assert ("hdfs" in names) == started, (host, names)
