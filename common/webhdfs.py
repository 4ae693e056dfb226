"""HDFS for featurectl's own file operations, over the NameNode's WebHDFS (HTTP) API.

pyarrow's `HadoopFileSystem` needs `libhdfs.so`, Hadoop's native client, which ships only in Hadoop's binary
tarball (no wheel, jar or Debian package carries it). fsspec's `WebHDFS` is pure Python; wrapped as a pyarrow
filesystem it serves `common.storage.Storage` like pyarrow's own filesystems do. Flink is not involved: it opens
`hdfs://` through Hadoop's Java client.
"""

from __future__ import annotations

import getpass
import os
from datetime import datetime, timezone
from urllib.parse import urlparse

from fsspec.implementations.webhdfs import WebHDFS


class WebHdfs(WebHDFS):
    """fsspec's WebHDFS with what pyarrow's wrapper and Storage rely on: modification times (as `mtime`), and a
    move that makes the target's folder and fails when HDFS refuses it (its RENAME answers `false` instead)."""

    @staticmethod
    def _process_info(info):
        info = WebHDFS._process_info(info)
        info["mtime"] = datetime.fromtimestamp(info["modificationTime"] / 1000, timezone.utc)
        return info

    def mv(self, path1, path2, **kwargs):
        self.makedirs(self._parent(path2), exist_ok=True)
        answer = self._call("RENAME", method="put", path=path1, destination=path2).json()
        if not answer.get("boolean"):
            raise OSError(f"HDFS refused to move {path1} to {path2} (a missing source or an existing target)")


def hdfs_user() -> str:
    """The user Hadoop's client (and so Flink) acts as under simple authentication."""
    return os.environ.get("HADOOP_USER_NAME") or getpass.getuser()


def webhdfs_filesystem(address: str):
    """A pyarrow filesystem over the WebHDFS at `address` (http(s)://host:port)."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    parsed = urlparse(address)
    client = WebHdfs(host=parsed.hostname, port=parsed.port or (9871 if parsed.scheme == "https" else 9870),
                     user=hdfs_user(), use_https=parsed.scheme == "https")
    return PyFileSystem(FSSpecHandler(client))
