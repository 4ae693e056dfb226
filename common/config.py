"""The project's settings: Feast's `feature_store.yaml` plus the `platform` section only featurectl reads.

One file is the single source of truth: Redis comes from Feast's `online_store.connection_string`, the registry
from Feast's `registry.path`, and everything Feast does not know about (Kafka, PostgreSQL, Flink, the state
folder) from `platform`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from common.errors import FeaturectlError

DEFAULT_REPO = Path("feature_repo")
SQLITE_PREFIX = "sqlite:///"
LOCAL_POSTGRES = "postgres"  # a registry "URL" that names the PostgreSQL of `featurectl services up --postgres`

log = logging.getLogger(__name__)
_warned_relative_registries: set[tuple[Path, str]] = set()


class ConfigError(FeaturectlError):
    """The repo's settings are missing or wrong; the message says which and how to fix them."""


class KafkaSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bootstrap_servers: str = Field("127.0.0.1:19092", description="host:port of the broker listener")
    controller_port: int = Field(19093, description="KRaft controller port of the local single-node broker")
    partitions: Optional[int] = Field(None, ge=1, description="partitions of the topics `featurectl stream` "
                                      "creates (source, tiles, dead letters); None: the stream's parallelism. "
                                      "A source's `kafka_partitions` overrides it for its own topic")
    replication_factor: int = Field(1, ge=1, description="replicas of the topics `featurectl stream` creates; a "
                                    "source's `kafka_replication_factor` overrides it for its topics")


class PostgresSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="start a local PostgreSQL with `services up`")
    port: int = 15432
    database: str = "featurectl"
    user: str = "featurectl"


class LocalFlinkSettings(BaseModel):
    """The session cluster `featurectl services up --flink N` starts on 127.0.0.1 from PyFlink's distribution."""

    model_config = ConfigDict(extra="forbid")
    rest_port: int = Field(18081, description="the JobManager's REST port: what `--jobmanager` names")
    rpc_port: int = Field(16123, description="the JobManager's RPC port (TaskManagers register there)")
    slots: int = Field(2, ge=1, description="task slots per TaskManager")
    jobmanager_memory: str = Field("1024m", description="the JobManager's total process memory")
    taskmanager_memory: str = Field("1600m", description="each TaskManager's total process memory")


class FlinkSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    jobmanager: Optional[str] = Field(None, description="REST address (host:port) of a Flink cluster's JobManager; "
                                                        "None = local mini-cluster")
    parallelism: int = 1
    local: LocalFlinkSettings = LocalFlinkSettings()


class AuthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(False, description="require an API key on POST /get-online-features, POST /push and "
                                             "POST /generate (`featurectl keys create`); `serve --require-api-key` "
                                             "also turns it on")
    refresh_s: float = Field(10.0, gt=0, description="seconds between reloads of the keys (revocations take effect) "
                                                     "and flushes of usage to the registry database")


class HttpSettings(BaseModel):
    """Limits of both HTTP servers (`serve`, `generate-server`): each refusal is a JSON error and closes the
    connection. They bound what one client can make a server hold or parse before any of its work is done."""

    model_config = ConfigDict(extra="forbid")
    max_url_bytes: int = Field(8192, ge=256, description="longest request target (path and query); else 414")
    max_header_bytes: int = Field(16384, ge=1024, description="all header names and values of one request; else 431")
    max_headers: int = Field(100, ge=8, description="header lines in one request; else 431")
    request_timeout_s: float = Field(10.0, gt=0, description="from a request's first byte to its last; else 408. "
                                                             "Also how long an answer may wait for the client "
                                                             "to read it before the connection is dropped")
    keep_alive_s: float = Field(30.0, gt=0, description="an idle keep-alive connection is closed after this")
    max_pipelined: int = Field(32, ge=1, description="requests read ahead of their answers on one connection; "
                                                     "past it the server stops reading until it has answered")


class FeatureLogSettings(BaseModel):
    """How each `featurectl serve` worker buffers the vectors it logs for services with `logging` (the DSL's
    `FeatureLogging` says which services and which share of their requests)."""

    model_config = ConfigDict(extra="forbid")
    queue_rows: int = Field(20_000, ge=1, description="rows served and not yet turned into Arrow; a request that "
                                                      "would pass it is not logged (counted as dropped), never "
                                                      "waited for")
    flush_rows: int = Field(100_000, ge=1, description="a worker writes its Parquet files once it holds this many "
                                                       "rows")
    flush_s: float = Field(60.0, gt=0, description="... or every this many seconds when it holds any, and at "
                                                   "shutdown")


class VectorSettings(BaseModel):
    """Where vector features are indexed for nearest-neighbour search (`serving.vector_common.open_index`): in
    `engine`, embedded unless `uri` names its server or cluster (Milvus: Milvus Lite, a file under the state
    folder, one process at a time; pgvector: a private PostgreSQL in `<state_dir>/pgvector/`); the same client code
    and Feast's own online store of that engine read either."""

    model_config = ConfigDict(extra="forbid")
    engine: Literal["pgvector", "milvus"] = Field("pgvector", description="PostgreSQL's pgvector "
                                                                          "(`serving.pgvector_index`, the default) "
                                                                          "or Milvus (`serving.vector_index`)")
    uri: Optional[str] = Field(None, description="the engine's server or cluster: Milvus's, e.g. "
                                                 "http://milvus:19530 (the one `featurectl services up --milvus` "
                                                 "starts: http://127.0.0.1:<local_port>), or a PostgreSQL with "
                                                 "pgvector, e.g. postgresql://user:pass@host:5432/db; None = "
                                                 "embedded: Milvus Lite in `<state_dir>/vectors.db`, or pgvector "
                                                 "in `<state_dir>/pgvector/`")
    token: Optional[str] = Field(None, description="API key or `user:password` of the Milvus server")
    index_type: Optional[str] = Field(None, description="Milvus index of each vector feature; None: FLAT (exact) "
                                                        "on Milvus Lite, which refuses HNSW and searches IVF_FLAT "
                                                        "with fixed parameters of its own (README), HNSW on a "
                                                        "server")
    index_params: Optional[dict[str, Any]] = Field(None, description="None: the index type's defaults "
                                                                     "(`serving.vector_index`); pgvector: HNSW's "
                                                                     "m 16, ef_construction 200")
    search_params: Optional[dict[str, Any]] = Field(None, description="None: the index type's defaults; "
                                                                      "pgvector: ef_search 64")
    local_port: int = Field(19530, description="port of the Milvus server `featurectl services up --milvus` "
                                               "starts; it also takes the 11 ports after it (its inner services)")

    @model_validator(mode="after")
    def _uri_fits_engine(self) -> "VectorSettings":
        """A Milvus address under the pgvector engine (the default) or a PostgreSQL one under Milvus would fail
        at the first write, far from the cause: refuse it here."""
        if self.uri:
            postgres = self.uri.startswith(("postgresql://", "postgres://"))
            if self.engine == "pgvector" and not postgres:
                raise ValueError(f"vectors.uri {self.uri!r} is not a PostgreSQL address (postgresql://...) for the "
                                 "pgvector engine: for a Milvus server set `engine: milvus` beside it")
            if self.engine == "milvus" and postgres:
                raise ValueError(f"vectors.uri {self.uri!r} is a PostgreSQL address but the engine is milvus: set "
                                 "`engine: pgvector` beside it")
        return self


class ServingSettings(BaseModel):
    """What `featurectl serve` does beside answering: its workers read these at start."""

    model_config = ConfigDict(extra="forbid")
    monitoring: bool = Field(True, description="the freshness and data-quality metrics: rows served per view and "
                                               "status counted per request, the views' newest values and stream "
                                               "lags read every second, a sample of served values binned for "
                                               "drift; false: none of it, and /metrics and /stats leave them out")


class S3Settings(BaseModel):
    """The S3 service `s3://` shared storage talks to. Credentials are never in the file: featurectl, pyarrow and
    Flink's S3 filesystem read AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment."""

    model_config = ConfigDict(extra="forbid")
    endpoint: Optional[str] = Field(None, description="http(s)://host:port of an S3-compatible server; None: AWS")
    region: str = Field("us-east-1", description="the buckets' region")
    path_style_access: bool = Field(False, description="bucket in the path, not the host name (most servers "
                                                       "other than AWS need it)")
    local_port: int = Field(19000, description="port of the S3 server `featurectl services up --s3` starts")


class HdfsSettings(BaseModel):
    """How featurectl reaches `hdfs://` storage. Flink opens `hdfs://namenode:port/...` itself (Hadoop's client);
    featurectl lists, reads, writes and deletes through the NameNode's WebHDFS (HTTP), which needs no native
    library. Both act as the user Hadoop's client takes: HADOOP_USER_NAME, else the login name."""

    model_config = ConfigDict(extra="forbid")
    webhdfs: Optional[str] = Field(None, description="http(s)://host:port of the NameNode's WebHDFS "
                                                     "(dfs.namenode.http-address); None: featurectl cannot open "
                                                     "hdfs:// storage")
    local_port: int = Field(19870, description="NameNode RPC port of the HDFS `featurectl services up --hdfs` "
                                               "starts (hdfs://127.0.0.1:PORT)")
    local_http_port: int = Field(19871, description="its NameNode's HTTP (WebHDFS) port")


class PlatformSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state_dir: str = "../.featurectl"
    data_dir: str = "../data"
    shared_storage: Optional[str] = Field(
        None, description="where Flink jobs and featurectl exchange files (stream checkpoints and savepoints, "
                          "exported tiles): a folder, or a Flink filesystem URI (s3://bucket/prefix, hdfs://..., "
                          "file:///mnt/shared) that every TaskManager reaches; None: folders under "
                          "state_dir and data_dir, on this machine only")
    data_storage: Optional[str] = Field(
        None, description="where the sources' Parquet histories (a source's relative `path`) and the views' "
                          "offline tables live, when not in data_dir: a Flink filesystem URI (s3://bucket/prefix, "
                          "hdfs://..., file:///mnt/shared) that the TaskManagers and every host running featurectl "
                          "reach. Feature logs, asset files and the history `POST /push` appends to stay in data_dir")
    s3: S3Settings = S3Settings()
    hdfs: HdfsSettings = HdfsSettings()
    kafka: KafkaSettings = KafkaSettings()
    postgres: PostgresSettings = PostgresSettings()
    flink: FlinkSettings = FlinkSettings()
    auth: AuthSettings = AuthSettings()
    http: HttpSettings = HttpSettings()
    feature_logging: FeatureLogSettings = FeatureLogSettings()
    serving: ServingSettings = ServingSettings()
    vectors: VectorSettings = VectorSettings()


class ProjectConfig:
    """Resolved settings of one feature repo (paths made absolute against the repo folder)."""

    def __init__(self, repo_path: Path, raw: dict[str, Any], registry_override: Optional[str] = None):
        self.repo_path = repo_path.resolve()
        self.raw = raw
        self.project: str = raw.get("project") or ""
        if not self.project:
            raise ConfigError(f"{repo_path}/feature_store.yaml has no `project`: add `project: <name>`")
        self.platform = _platform_settings(repo_path, raw.get("platform") or {})
        self.registry_url = self._resolve_registry(registry_override)

    @property
    def state_dir(self) -> Path:
        return (self.repo_path / self.platform.state_dir).resolve()

    @property
    def data_dir(self) -> Path:
        return (self.repo_path / self.platform.data_dir).resolve()

    @property
    def shared_storage(self):
        """The `common.storage.Storage` of `platform.shared_storage` (a relative folder is taken against the repo);
        None when unset: each job's files stay in its local folders."""
        from common.storage import Storage

        where = self.platform.shared_storage
        if where is None:
            return None
        if "://" not in where:
            return Storage.local((self.repo_path / where).resolve(), self.platform.s3, self.platform.hdfs)
        return Storage(where, self.platform.s3, self.platform.hdfs)

    @property
    def data_storage(self):
        """The `common.storage.Storage` holding the sources' histories and the views' offline tables:
        `platform.data_storage`, else the local data_dir."""
        from common.storage import Storage

        where = self.platform.data_storage
        if where is None:
            return Storage.local(self.data_dir, self.platform.s3, self.platform.hdfs)
        if "://" not in where:
            raise ConfigError(f"platform.data_storage {where!r} is not a URI: give a Flink filesystem URI such as "
                              "s3://bucket/prefix, or leave it out and set platform.data_dir to the folder")
        return Storage(where, self.platform.s3, self.platform.hdfs)

    def local_data_dir(self, what: str) -> Path:
        """The data folder for `what`, which writes the histories or offline tables as local files; refused when
        they live elsewhere (`platform.data_storage`)."""
        storage = self.data_storage
        if not storage.is_local:
            raise ConfigError(f"{what} works on local files, but platform.data_storage puts the histories and "
                              f"offline tables in {storage.uri}: run it against a repo whose data is in a folder")
        return Path(storage.display)

    @property
    def redis_host_port(self) -> tuple[str, int]:
        conn = (self.raw.get("online_store") or {}).get("connection_string", "127.0.0.1:6379")
        host_port = conn.split(",")[0]
        host, _, port = host_port.rpartition(":")
        return host or "127.0.0.1", int(port)


    @property
    def key_ttl_seconds(self) -> int:
        """Feast's `online_store.key_ttl_seconds`: every write of a key sets its expiry to this; 0 when unset."""
        value = (self.raw.get("online_store") or {}).get("key_ttl_seconds") or 0
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"online_store.key_ttl_seconds must be a whole number of seconds >= 0, got {value!r}")
        return value

    @property
    def uses_postgres_registry(self) -> bool:
        return self.registry_url.startswith("postgresql")

    def _resolve_registry(self, override: Optional[str]) -> str:
        """The registry URL: `--registry`, else `FEATURECTL_REGISTRY`, else the yaml's `registry.path`; the word
        `postgres` in any of them is the local PostgreSQL."""
        from_yaml = (self.raw.get("registry") or {}).get("path")
        url = override or os.environ.get("FEATURECTL_REGISTRY") or from_yaml
        if url == LOCAL_POSTGRES:
            return self.postgres_url()
        if not url:
            raise ConfigError("feature_store.yaml has no `registry.path`: set a sqlite:/// or postgresql:// URL")
        if url.startswith(SQLITE_PREFIX):
            url = self._sqlite_registry(url, relative_from_yaml=url == from_yaml)
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        return url

    def _sqlite_registry(self, url: str, relative_from_yaml: bool) -> str:
        """An absolute SQLite URL (a relative path is taken against the repo folder), its folder made: SQLite
        creates the file but not the folders above it."""
        path = Path(url[len(SQLITE_PREFIX):])
        if not path.is_absolute():
            if relative_from_yaml:
                _warn_relative_registry(self.repo_path, url)
            path = (self.repo_path / path).resolve()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = (f"cannot make the registry's folder {path.parent} ({exc.strerror}): point `registry.path` at a "
                   f"writable place, e.g. {SQLITE_PREFIX}${{HOME}}/.featurectl/registry.db")
            raise ConfigError(msg) from None
        return SQLITE_PREFIX + str(path)

    def postgres_url(self) -> str:
        pg = self.platform.postgres
        return f"postgresql+psycopg://{pg.user}@127.0.0.1:{pg.port}/{pg.database}"

    def feast_repo_config(self):
        """A Feast `RepoConfig` for this repo, with the resolved registry URL."""
        from feast.repo_config import RepoConfig

        raw = {k: v for k, v in self.raw.items() if k != "platform"}
        registry = dict(raw.get("registry") or {})
        registry["path"] = self.registry_url
        raw["registry"] = registry
        return RepoConfig(repo_path=self.repo_path, **raw)


def load_config(repo_path: Path | str = DEFAULT_REPO, registry_override: Optional[str] = None) -> ProjectConfig:
    path = Path(repo_path)
    yaml_path = path / "feature_store.yaml"
    if not yaml_path.is_file():
        raise ConfigError(
            f"no feature_store.yaml in {path.resolve()}: run featurectl from the project root or pass --repo PATH"
        )
    with yaml_path.open() as fh:
        raw = yaml.safe_load(os.path.expandvars(fh.read())) or {}  # `${VAR}`, as Feast reads the file
    return ProjectConfig(path, raw, registry_override)


def _platform_settings(repo_path: Path, platform: Any) -> PlatformSettings:
    """The `platform` section, or a ConfigError naming each wrong setting (`platform.http.max_headers: ...`)."""
    if not isinstance(platform, dict):
        raise ConfigError(f"{repo_path}/feature_store.yaml: `platform` must be a mapping of settings, got "
                          f"{platform!r}")
    try:
        return PlatformSettings(**platform)
    except ValidationError as exc:
        wrong = "; ".join(_setting_error(error) for error in exc.errors())
        raise ConfigError(f"{repo_path}/feature_store.yaml: {wrong}. Fix each one, or remove it for its "
                          "default") from None


def _setting_error(error: Any) -> str:
    where = "platform." + ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{where} is not a setting (check its spelling and section)"
    return f"{where}: {error['msg'][:1].lower()}{error['msg'][1:]}, got {error['input']!r}"


def _warn_relative_registry(repo_path: Path, url: str) -> None:
    """Feast takes a relative SQLite path against the current folder, featurectl against the repo: say so once."""
    if (repo_path, url) in _warned_relative_registries:
        return
    _warned_relative_registries.add((repo_path, url))
    log.warning("%s/feature_store.yaml: registry.path %s is relative; featurectl reads it against the repo folder, "
                "Feast's own CLI and SDK against the current folder: use an absolute path or "
                "sqlite:///${HOME}/.featurectl/registry.db", repo_path, url)
