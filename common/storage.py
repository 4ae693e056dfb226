"""Shared storage: the folder tree through which Flink jobs and featurectl exchange files.

A stream's checkpoints and savepoints, and the tiles a backfill or a stream's start exports, are written by
Flink's TaskManagers (and, on a restore, read by its JobManager) and listed, read and deleted by featurectl. On
one machine a local folder does; when TaskManagers run on other hosts it must be storage all of them reach. A
`Storage` names a folder in either, once: as the URI Flink opens (`file:///...`, `s3://bucket/prefix`,
`hdfs://...`) and as a pyarrow filesystem for featurectl's own reads, listings and deletes.

`s3://` needs Flink's S3 filesystem (`flink-s3-fs-hadoop`, fetched by `scripts/setup.sh` into the `flink-fs`
jar folder) in the JVM that runs the job: for PyFlink's local mini-cluster, `jvm_environment` puts it on the
gateway's class path with a Hadoop `core-site.xml` naming the endpoint; a standalone cluster loads it as a
plugin (`featurectl services up --flink N` does that for its own cluster; see the README for others).

`hdfs://` is Flink's own Hadoop filesystem, which needs Hadoop's client jars (also in `flink-fs`) on the same
class path; featurectl's side goes through the NameNode's WebHDFS (`common.webhdfs`, `platform.hdfs.webhdfs`).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional
from urllib.parse import quote, unquote, urlparse
from xml.sax.saxutils import escape

from common.config import HdfsSettings, S3Settings
from common.errors import FeaturectlError

S3_JAR_GLOB = "flink-s3-fs-hadoop-*.jar"
# Hadoop's client, what Flink's `hdfs://` filesystem loads
HDFS_CLIENT_JAR_GLOBS = ("hadoop-client-api-*.jar", "hadoop-client-runtime-*.jar", "commons-logging-*.jar")
# the schemes of filesystems with real folders (deleted at once, with what they hold; made by a call)
FOLDER_SCHEMES = {"file", "hdfs"}
# the schemes of object stores, whose paths are keys in a bucket, by the scheme OpenLineage names them with
OBJECT_STORE_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs"}


class StorageError(FeaturectlError):
    """Shared storage cannot be reached or used as configured; the message names the piece and the fix."""


@dataclass(frozen=True)
class Storage:
    """A folder of shared storage. `uri`: what Flink is given; `s3`: the endpoint an `s3://` URI goes to; `hdfs`:
    the WebHDFS address featurectl reaches an `hdfs://` URI's NameNode by."""

    uri: str
    s3: Optional[S3Settings] = None
    hdfs: Optional[HdfsSettings] = None

    @classmethod
    def local(cls, folder: Path, s3: Optional[S3Settings] = None, hdfs: Optional[HdfsSettings] = None) -> "Storage":
        return cls(folder.resolve().as_uri(), s3, hdfs)

    @property
    def scheme(self) -> str:
        return urlparse(self.uri).scheme

    def child(self, *parts: str) -> "Storage":
        """A folder under this one (names quoted as a `file://` URI needs)."""
        named = [quote(part) for part in parts] if self.is_local else list(parts)
        return replace(self, uri="/".join([self.uri.rstrip("/"), *named]))

    @property
    def parent(self) -> "Storage":
        return replace(self, uri=self.uri.rstrip("/").rsplit("/", 1)[0])

    @property
    def name(self) -> str:
        last = self.uri.rstrip("/").rsplit("/", 1)[-1]
        return unquote(last) if self.is_local else last

    @property
    def display(self) -> str:
        """The folder as people write it: a local path, else the URI."""
        parsed = urlparse(self.uri)
        return unquote(parsed.path) if parsed.scheme == "file" else self.uri

    def __str__(self) -> str:
        return self.display

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def lineage_id(self) -> tuple[str, str]:
        """(namespace, name) of this folder as an OpenLineage dataset, by its naming spec
        (https://openlineage.io/docs/spec/naming), so that other producers' events about the same data meet ours:
        `file` and the path for this host's disk (`file://{host}` for another's); `s3://{bucket}` and the object
        key (an `s3a://` URI names the same bucket); for other filesystems `{scheme}://{authority}` and the path
        (`hdfs://{namenode}:{port}`)."""
        parsed = urlparse(self.uri)
        if parsed.scheme == "file":
            host = parsed.netloc if parsed.netloc not in ("", "localhost") else ""
            return (f"file://{host}" if host else "file"), unquote(parsed.path).rstrip("/") or "/"
        if parsed.scheme in OBJECT_STORE_SCHEMES:
            return f"{OBJECT_STORE_SCHEMES[parsed.scheme]}://{parsed.netloc}", parsed.path.strip("/")
        return f"{parsed.scheme}://{parsed.netloc}", parsed.path.rstrip("/") or "/"

    def located(self):
        """(pyarrow filesystem, path in it) of this folder."""
        from pyarrow import fs

        parsed = urlparse(self.uri)
        if parsed.scheme == "file":
            return fs.LocalFileSystem(), unquote(parsed.path)
        if parsed.scheme in ("s3", "s3a"):
            s3 = self.s3 or S3Settings()
            options: dict = {"region": s3.region}
            if s3.endpoint:
                endpoint = urlparse(s3.endpoint)
                options.update(endpoint_override=endpoint.netloc, scheme=endpoint.scheme or "https")
            return fs.S3FileSystem(**options), f"{parsed.netloc}{parsed.path}".rstrip("/")
        if parsed.scheme == "hdfs":
            from common.webhdfs import webhdfs_filesystem

            if self.hdfs is None or not self.hdfs.webhdfs:
                raise StorageError(f"shared storage {self.uri}: featurectl reaches HDFS through its NameNode's "
                                   "WebHDFS, and platform.hdfs.webhdfs is unset: set it to http://host:port of "
                                   "the NameNode's HTTP address (dfs.namenode.http-address)")
            return webhdfs_filesystem(self.hdfs.webhdfs), parsed.path.rstrip("/") or "/"
        try:
            return fs.FileSystem.from_uri(self.uri)
        except (OSError, ValueError) as exc:
            raise StorageError(f"shared storage {self.uri}: pyarrow cannot open it ({exc}); use a folder, file://, "
                               "s3:// or hdfs://") from None

    def _call(self, what: str, call):
        from requests import RequestException  # WebHDFS's errors (common.webhdfs)

        try:
            return call(*self.located())
        except (OSError, RequestException) as exc:
            raise StorageError(f"{'folder' if self.is_local else 'shared storage'} {self.display}: {what} failed: "
                               f"{exc}") from None

    def file_times(self) -> dict[str, int]:
        """Every file under this folder (path relative to it) with its modification time in ns, from one listing;
        none when the folder does not exist."""
        from pyarrow import fs

        def listing(filesystem, path):
            found = filesystem.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True))
            infos = {info.path[len(path):].lstrip("/"): info for info in found}
            folders = {name[:i] for name in infos for i, c in enumerate(name) if c == "/"}
            # some S3 servers list a folder as an object too: a "file" with files under it is a folder
            return {name: info.mtime_ns or 0 for name, info in infos.items()
                    if info.type == fs.FileType.File and name not in folders}

        return self._call("listing", listing)

    def files(self) -> list[str]:
        """Every file under this folder (paths relative to it), none when it does not exist."""
        return sorted(self.file_times())

    def mtime_ns(self, relative: str) -> int:
        def stat(filesystem, path):
            return filesystem.get_file_info(f"{path}/{relative}").mtime_ns or 0

        return self._call("reading a file's time", stat)

    def exists(self) -> bool:
        """Whether the folder holds any file (object stores have no empty folders)."""
        return bool(self.files())

    def make(self) -> None:
        """Make the folder where folders exist; object stores have none to make (a marker object could even
        read as a file to Flink's S3 filesystem)."""
        if self.scheme == "file":
            Path(self.display).mkdir(parents=True, exist_ok=True)
        elif self.scheme in FOLDER_SCHEMES:
            self._call("making the folder", lambda filesystem, path: filesystem.create_dir(path))

    def delete(self) -> None:
        """Remove the folder with everything under it (nothing there is fine). In an object store, every file
        under it, one request each, not a bulk delete: S3-compatible servers answer S3's multi-object delete
        slowly or not at all, and the folders written here hold a few files each; its folders go with their
        last file."""
        from pyarrow import fs

        def remove(filesystem, path):
            if self.scheme in FOLDER_SCHEMES:
                if filesystem.get_file_info(path).type != fs.FileType.NotFound:
                    filesystem.delete_dir(path)
                return
            for relative in files:
                try:
                    filesystem.delete_file(f"{path}/{relative}")
                except FileNotFoundError:  # gone already, or a server's stand-in for an empty folder
                    pass

        files = [] if self.scheme in FOLDER_SCHEMES else self.files()
        if files or self.scheme in FOLDER_SCHEMES:
            self._call("deleting", remove)

    def readable_files(self) -> list[str]:
        """The files under this folder that Flink's filesystem source and Arrow's datasets read: all but those
        whose name, or a folder's on the way, starts with `.` or `_` (hidden, or still being written)."""
        return [name for name in self.files() if not any(part.startswith((".", "_")) for part in name.split("/"))]

    def dataset(self, **options):
        """The Parquet files under the folder as one pyarrow dataset (Flink's part files have no suffix; names
        starting with `.` or `_` on the way, Flink's in-progress files, are skipped); None when there are none.
        `options` go to `pyarrow.dataset.dataset` (e.g. `partitioning`)."""
        import pyarrow.dataset as ds

        files = self.readable_files()
        if not files:
            return None
        # the files listed here, not a discovery of Arrow's own: that would take a server's stand-in object for a
        # folder (see `file_times`) for a Parquet file
        return self._call("reading", lambda filesystem, path: ds.dataset(
            [f"{path}/{name}" for name in files], filesystem=filesystem, format="parquet", partition_base_dir=path,
            **options))

    def open_input(self, relative: str):
        """A file under the folder, opened for random access (what a Parquet reader needs)."""
        return self._call("opening a file", lambda filesystem, path: filesystem.open_input_file(f"{path}/{relative}"))

    def write_parquet(self, relative: str, table) -> None:
        """Write `table` as the Parquet file `relative` under the folder (its local folders made)."""
        import pyarrow.parquet as pq

        target = self.child(*relative.split("/"))
        target.parent.make()
        self._call("writing", lambda filesystem, path: pq.write_table(table, f"{path}/{relative}",
                                                                       filesystem=filesystem))

    def move_files(self, destination: "Storage") -> None:
        """Move every file under this folder to the same place under `destination` (in the same filesystem), one
        at a time: object stores have no rename of a folder."""
        files = self.files()
        _, target = destination.located()

        def move(filesystem, path):
            for relative in files:
                filesystem.move(f"{path}/{relative}", f"{target}/{relative}")

        self._call("moving", move)

    def jvm_environment(self, jars: Path) -> dict[str, str]:
        """Environment the PyFlink gateway JVM needs to open this storage: nothing for a local folder; for S3,
        Flink's S3 filesystem on the class path and a Hadoop configuration naming the endpoint (credentials
        stay in the environment, where the JVM's default AWS credential chain reads them); for HDFS, Hadoop's
        client on the class path (the URI names the NameNode)."""
        if self.scheme == "hdfs":
            found = [sorted(jars.glob(glob)) for glob in HDFS_CLIENT_JAR_GLOBS]
            missing = [glob for glob, jar in zip(HDFS_CLIENT_JAR_GLOBS, found) if not jar]
            if missing:
                raise StorageError(f"shared storage {self.uri} needs Hadoop's client jars in {jars}, and "
                                   f"{', '.join(missing)} is not there: run scripts/setup.sh")
            return {"HADOOP_CLASSPATH": ":".join(str(jar[-1]) for jar in found)}
        if self.scheme not in ("s3", "s3a"):
            return {}
        found = sorted(jars.glob(S3_JAR_GLOB))
        if not found:
            raise StorageError(f"shared storage {self.uri} needs Flink's S3 filesystem, {S3_JAR_GLOB}, in {jars}: "
                               "run scripts/setup.sh")
        return {"HADOOP_CLASSPATH": str(found[-1]), "HADOOP_CONF_DIR": str(_hadoop_conf(self.s3 or S3Settings()))}


def remote(*storages: "Optional[Storage]") -> "Optional[Storage]":
    """The first of `storages` that is not a local folder: the one whose filesystem a job's JVM needs (a job
    reading history from S3 and writing tiles to a local folder needs S3's); None when all are local."""
    return next((s for s in storages if s is not None and not s.is_local), None)


def as_storage(where: "Path | Storage") -> "Storage":
    """A folder given as a local path or as a `Storage`, as a `Storage`."""
    return where if isinstance(where, Storage) else Storage.local(Path(where))


def s3_flink_options(s3: S3Settings) -> dict[str, str]:
    """Flink configuration keys of the S3 filesystem plugin (a standalone cluster's config)."""
    options = {"s3.path.style.access": str(s3.path_style_access).lower(),
               # no deletes of parent "directory" objects after each write and rename (AWS no longer needs them),
               # and single deletes: S3-compatible servers answer the multi-object delete slowly or not at all
               "s3.directory.marker.retention": "keep",
               "s3.multiobjectdelete.enable": "false"}
    if s3.endpoint:
        options["s3.endpoint"] = s3.endpoint
        options["s3.connection.ssl.enabled"] = str(s3.endpoint.startswith("https")).lower()
    return options


_HADOOP_CONFS: dict[str, Path] = {}


def _hadoop_conf(s3: S3Settings) -> Path:
    """A folder holding the `core-site.xml` of these settings, for the life of this process."""
    key = s3.model_dump_json()
    if key in _HADOOP_CONFS:
        return _HADOOP_CONFS[key]
    properties = {f"fs.s3a.{key[3:]}": value for key, value in s3_flink_options(s3).items()}
    properties["fs.s3a.endpoint.region"] = s3.region
    folder = Path(tempfile.mkdtemp(prefix="featurectl-hadoop-conf-"))
    atexit.register(shutil.rmtree, folder, True)
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
                   for k, v in properties.items())
    (folder / "core-site.xml").write_text(f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n')
    _HADOOP_CONFS[key] = folder
    return folder
