"""Local S3: S3Proxy over a folder, for shared storage (`platform.shared_storage: s3://...`) on one machine.

S3Proxy answers the S3 API (signatures v2 and v4, multipart uploads) and keeps each bucket as a folder under
`<state_dir>/s3/data/`. It checks requests against one key pair, the one featurectl, pyarrow and Flink's S3
filesystem read from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, so `up` needs them set. Once it answers, the
bucket that `platform.shared_storage` names is made.
"""

from __future__ import annotations

import os
import subprocess
from urllib.parse import urlparse

from common.flink import jar_dir
from featurectl.services.process import LocalService, LocalServiceError, require_java, spawn

CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class S3Server(LocalService):
    name = "s3"
    ready_timeout_s = 60.0

    @property
    def properties(self):
        return self.dir / "s3proxy.conf"

    @property
    def marker(self) -> str:
        return str(self.properties)

    @property
    def ports(self) -> list[int]:
        return [self.cfg.platform.s3.local_port]

    def check_installed(self) -> None:
        require_java("S3Proxy needs Java 17")
        if not list(jar_dir("s3proxy").glob("s3proxy-*.jar")):
            raise LocalServiceError(f"no S3Proxy jar in {jar_dir('s3proxy')}: run scripts/setup.sh")
        missing = [name for name in CREDENTIALS if not os.environ.get(name)]
        if missing:
            raise LocalServiceError(f"the local S3 server takes the key pair of {' and '.join(CREDENTIALS)}, and "
                                    f"{', '.join(missing)} is unset: export both (any values; every featurectl "
                                    "command and Flink then sign with them)")

    def start(self) -> subprocess.Popen:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.properties.write_text("\n".join([
            f"s3proxy.endpoint=http://{self.address}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={os.environ[CREDENTIALS[0]]}",
            f"s3proxy.credential={os.environ[CREDENTIALS[1]]}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={data}",
        ]) + "\n")
        self.properties.chmod(0o600)
        jar = sorted(jar_dir("s3proxy").glob("s3proxy-*.jar"))[-1]
        return spawn(["java", "-Xmx256m", "-jar", str(jar), "--properties", str(self.properties)],
                     self.log_file, self.pid_file)

    def _filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(endpoint_override=self.address, scheme="http", region=self.cfg.platform.s3.region,
                               allow_bucket_creation=True, connect_timeout=1, request_timeout=2)

    def ready(self) -> bool:
        from pyarrow import fs

        try:
            self._filesystem().get_file_info(fs.FileSelector("", recursive=False))
        except OSError:
            return False
        return True

    def after_ready(self) -> None:
        """Make the bucket the shared storage names, when it is on this server."""
        storage = self.cfg.shared_storage
        endpoint = urlparse(self.cfg.platform.s3.endpoint or "").netloc
        if storage is None or storage.scheme not in ("s3", "s3a") or endpoint != self.address:
            return
        self._filesystem().create_dir(urlparse(storage.uri).netloc)
