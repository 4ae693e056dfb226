"""Vector features indexed in PostgreSQL's pgvector for nearest-neighbour search, in Feast's own PostgreSQL layout.

Redis keeps every feature value (Feast's Redis layout); PostgreSQL holds the index. One table per view with a vector
feature, `{project}_{view}`, made by Feast's own `PostgreSQLOnlineStore` (`vector_enabled`) and written by it (a push)
or with the same rows by binary COPY (a bulk load), so Feast's `retrieve_online_documents(_v2)` reads what we write:
a row per (entity key, feature) with Feast's serialized entity key, the value's protobuf, its text (`value_text`,
what filters compare) and, for a vector feature, `vector_value`. We type `vector_value` with the view's dimension
(a write of another dimension is refused) and add one HNSW index per vector feature (partial: `WHERE feature_name =
...`). A search asks for keys and distances only; the features of the hits come from Redis (`serving.search`).

Embedded by default: a private PostgreSQL 16 with pgvector from the `pgserver` wheel, its data and unix socket in
`<state_dir>/pgvector/` (no TCP port). The first process that needs it starts it; every later one, of any process of
the repo, connects to the same server (pgserver's lock file, `postmaster.pid` and its list of the processes using
it); the last of them to exit stops it, as an embedded engine should leave nothing running, and `featurectl
services down` stops one left behind by a killed process. `platform.vectors.uri` (postgresql://...) points the same
code at any PostgreSQL with pgvector.

Searches without filters walk the HNSW index (approximate, `ef_search`). pgvector 0.6 applies a filter after the
index walk, which can leave fewer than k hits or miss nearer ones, so a filtered search is an exact scan of the
filtered entities instead: exact answers, at the cost of a distance per filtered row.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from common.config import ProjectConfig
from dsl.feature_view import FeatureView
from dsl.types import Vector
from serving.vector_common import Filters, VectorEngine, VectorSearchError, check_indexable, vector_kind

EMBEDDED_FOLDER = "pgvector"
HNSW_BUILD = {"m": 16, "ef_construction": 200}
# ef_search 64: recall@10 0.999 to 0.9998 on 100,000 clustered vectors of dim 128, 0.52 on isotropic Gaussian ones
# (`featurectl bench search --engine pgvector`, README)
HNSW_SEARCH = {"ef_search": 64}
# pgvector's operator and HNSW operator class per metric, and how its distance turns into the one Milvus reports
# (the SDK's `distance` means the same on either engine): squared L2, cosine similarity, inner product.
OPERATORS = {"L2": ("<->", "vector_l2_ops", lambda d: d * d), "COSINE": ("<=>", "vector_cosine_ops", lambda d: 1 - d),
             "IP": ("<#>", "vector_ip_ops", lambda d: -d)}
MAINTENANCE_WORK_MEM = "1GB"  # an HNSW build that fits in memory is several times faster


def embedded_folder(config: ProjectConfig) -> Path:
    return config.state_dir / EMBEDDED_FOLDER


def _pgserver():
    """The pgserver module, imported without platformdirs' warning about an unset XDG_RUNTIME_DIR (CI, containers:
    pgserver keeps nothing there that we use)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import pgserver
        import pgserver._commands
    return pgserver


_PRUNED_AT_EXIT: set[Path] = set()


def embedded_server(config: ProjectConfig):
    """pgserver's handle of the repo's embedded PostgreSQL, started when no process runs it yet; it stays up while
    any process of the repo holds a handle, and the last one's exit stops it. pgserver counts a process as a
    handle until that process's own exit handler removes it, so one that never ran it (killed, or ended by a
    signal) would keep the server up for good: the pids of processes gone are dropped when a handle is taken and
    again just before this process's exit handler runs."""
    import atexit

    pgserver = _pgserver()
    logging.getLogger("pgserver").setLevel(logging.WARNING)  # it logs every pg_ctl command line at INFO
    config.state_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(embedded_folder(config), cleanup_mode="stop")
    _drop_gone_handles(server)
    if server.pgdata not in _PRUNED_AT_EXIT:  # atexit runs the last registered first: before pgserver's cleanup
        _PRUNED_AT_EXIT.add(server.pgdata)
        atexit.register(_drop_gone_handles, server)
    return server


def _drop_gone_handles(server) -> None:
    """Remove the pids of processes that no longer run from pgserver's list of the server's users."""
    import psutil

    with type(server)._lock:
        pids = server.global_process_id_list.get()
        live = [pid for pid in pids if psutil.pid_exists(pid)]
        if live != pids:
            server.global_process_id_list.put(live)


def stop_embedded(config: ProjectConfig) -> Optional[str]:
    """Stop the repo's embedded PostgreSQL if it runs (`featurectl services down`); what was done, or None."""
    folder = embedded_folder(config)
    if not (folder / "postmaster.pid").exists():
        return None
    _pgserver()._commands.pg_ctl(["-w", "stop"], pgdata=folder, user="pgserver" if os.geteuid() == 0 else None)
    return f"pgvector: stopped the embedded PostgreSQL in {folder}"


class PgVectorIndex(VectorEngine):
    """One project's vector index in pgvector: tables made and written by Feast's PostgreSQL store, searched by one
    prepared SQL query per search on a connection of the calling thread."""

    def __init__(self, config: ProjectConfig):
        from feast.infra.online_stores.postgres_online_store.postgres import PostgreSQLOnlineStore

        super().__init__(config)
        self._store = PostgreSQLOnlineStore()
        self._lock = threading.Lock()  # Feast's store keeps one connection unguarded
        self._local = threading.local()
        self._conninfo: Optional[str] = None
        self._made: set[str] = set()
        self._indexed: set[str] = set()
        self._value_num: dict[str, bool] = {}  # per table: whether it has Feast's optional `value_num` column
        self._write_configs: dict[Vector, Any] = {}

    @property
    def on_server(self) -> bool:
        return bool(self.settings.uri)

    @property
    def location(self) -> str:
        return self.settings.uri or str(embedded_folder(self.config))

    @property
    def index_type(self) -> str:
        return "HNSW"

    @property
    def index_params(self) -> dict[str, Any]:
        return dict(HNSW_BUILD if self.settings.index_params is None else self.settings.index_params)

    @property
    def search_params(self) -> dict[str, Any]:
        return dict(HNSW_SEARCH if self.settings.search_params is None else self.settings.search_params)

    def conninfo(self) -> str:
        """The server's connection string: `uri`, else the embedded server's (started if need be)."""
        if self._conninfo is None:
            self._conninfo = self.settings.uri or embedded_server(self.config).get_uri()
        return self._conninfo

    def feast_repo_config(self, kind: Vector):
        """Feast's RepoConfig of this project with the PostgreSQL online store holding the index (`kind`, the
        view's vector type, as Milvus's engine takes it: Feast's PostgreSQL store needs no dimension)."""
        from feast.repo_config import RepoConfig
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(self.conninfo())
        store = {"type": "postgres", "host": parts.get("host") or "localhost", "port": int(parts.get("port") or 5432),
                 "database": parts.get("dbname") or "postgres", "user": parts.get("user") or "postgres",
                 "password": parts.get("password") or "", "sslmode": parts.get("sslmode") or "prefer",
                 "vector_enabled": True}
        raw = self.config.feast_repo_config()
        return RepoConfig(repo_path=self.config.repo_path, project=raw.project, provider="local",
                          registry=raw.registry, online_store=store, offline_store={"type": "file"},
                          entity_key_serialization_version=raw.entity_key_serialization_version)

    def _write_config(self, kind: Vector):
        """`feast_repo_config(kind)`, built once: every write reads its entity-key serialization version, and a
        push writes often."""
        config = self._write_configs.get(kind)
        if config is None:
            config = self._write_configs[kind] = self.feast_repo_config(kind)
        return config

    def connection(self):
        """This thread's connection (autocommit, `ef_search` set), opened on its first use."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            import psycopg

            conn = psycopg.connect(self.conninfo(), autocommit=True)
            for name, value in self.search_params.items():
                conn.execute(f"SET hnsw.{_identifier(name)} = {int(value)}")
            self._local.conn = conn
        return conn

    def _table(self, view: FeatureView) -> str:
        """The view's table, made by Feast's own store when missing, its `vector_value` typed with the view's
        dimension."""
        table = f"{self.config.project}_{view.name}"
        if table not in self._made:
            check_indexable(self.config, [view])
            kind = vector_kind(view)
            with self._lock:
                self.connection().execute("CREATE EXTENSION IF NOT EXISTS vector")
                self._store.update(self._write_config(kind), [], [self._feast_view(view.name)], [], [], True)
            self.connection().execute(f"ALTER TABLE {_identifier(table)} ALTER COLUMN vector_value "
                                      f"TYPE vector({kind.dim})")
            self._made.add(table)
        return table

    def write(self, view: FeatureView, columns: Mapping[str, Sequence[Any]], event_ms: Sequence[int],
              bulk: bool = False) -> int:
        """Write rows of `view` (join keys and every feature, one list per column; `event_ms` per row) in Feast's
        PostgreSQL layout (`_load`): a row per entity and feature, an entity's latest row winning, and none older
        than what the table holds, as Redis's guarded write keeps the newer (a materialization writes an entity's
        rows of several batches in any order; a push may be older than what is stored). An entity whose latest row
        has no vector leaves the index (its value in Redis is null now: a hit would find a vector the store no
        longer serves), unless the table holds a newer one. Returns the entities written. `bulk` (a load): the
        HNSW index is left to `seal`, which builds it once over every row (pgvector's advice for a load: faster
        than growing it row by row)."""
        import datetime as dt

        import psycopg
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.type_map import python_values_to_proto_values

        vectors = list(view.vector_features)
        join_keys = sorted(view.entity.join_keys)
        last: dict[tuple, int] = {}  # per entity its latest row (of equal times, the later one)
        for i in range(len(event_ms)):
            key = tuple(columns[k][i] for k in join_keys)
            if key not in last or event_ms[i] >= event_ms[last[key]]:
                last[key] = i
        rows = [i for i in last.values() if all(columns[v][i] is not None for v in vectors)]
        gone = {key: i for key, i in last.items() if any(columns[v][i] is None for v in vectors)}
        if not rows and not gone:
            return 0
        kinds = {**view.entity.join_keys, **view.output_schema()}
        plain = {name: [list(map(float, columns[name][i])) if name in vectors else columns[name][i] for i in rows]
                 for name in kinds}  # a vector's ints as floats: Feast's float list takes no int
        protos = {name: python_values_to_proto_values(plain[name], kind.feast_value_type())
                  for name, kind in kinds.items()}
        keys = [EntityKey(join_keys=join_keys, entity_values=[protos[k][n] for k in join_keys])
                for n in range(len(rows))]
        whens = [dt.datetime.fromtimestamp(int(event_ms[i]) / 1000, dt.timezone.utc) for i in rows]
        features = view.feature_names  # a property that builds its list: once, not per write
        table = self._table(view)
        try:
            if rows:
                self._load(view, table, keys, whens, {name: protos[name] for name in features}, plain)
            if gone:
                self._delete(view, table, list(gone),
                             [dt.datetime.fromtimestamp(int(event_ms[i]) / 1000, dt.timezone.utc)
                              for i in gone.values()])
        except psycopg.errors.DataException as exc:
            raise VectorSearchError(f"`{view.name}` rows refused by PostgreSQL ({exc}): its vectors must have "
                                    f"{vector_kind(view).dim} numbers") from exc
        if not bulk and table not in self._indexed:
            self._ensure_indexes(view, table)
        return len(rows)

    def _load(self, view: FeatureView, table: str, keys: list, whens: list, protos: Mapping[str, list],
              plain: Mapping[str, list]) -> None:
        """The rows Feast's `online_write_batch` writes (same columns, same bytes), loaded by binary COPY into a
        temporary table and merged into the view's table by one INSERT ... ON CONFLICT that keeps a stored row
        newer than the loaded one: Feast's writer sends an INSERT per entity and feature, formats every vector as
        text, and replaces whatever is stored."""
        from feast.infra.key_encoding_utils import get_list_val_str, serialize_entity_key
        from feast.infra.online_stores.helpers import extract_text_and_num
        from pgvector import Vector as PgVector
        from pgvector.psycopg import register_vector

        conn = self.connection()
        if not getattr(self._local, "vector_types", False):
            register_vector(conn)
            self._local.vector_types = True
        with_num = self._has_value_num(table)
        columns = ["entity_key", "feature_name", "value", "value_text", "value_num", "vector_value", "event_ts",
                   "created_ts"]
        types = ["bytea", "text", "bytea", "text", "float8", "vector", "timestamptz", "timestamptz"]
        if not with_num:
            del columns[4], types[4]
        names = ", ".join(columns)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns[2:])
        version = self._write_config(vector_kind(view)).entity_key_serialization_version
        vectors = set(view.vector_features)
        with conn.transaction():
            conn.execute(f"CREATE TEMP TABLE featurectl_load (LIKE {_identifier(table)}) ON COMMIT DROP")
            with conn.cursor().copy(f"COPY featurectl_load ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(types)
                for n, key in enumerate(keys):
                    key_bin = serialize_entity_key(key, entity_key_serialization_version=version)
                    for name, values in protos.items():
                        value = values[n]
                        text, num = extract_text_and_num(value, with_num)
                        # Feast's text of a list value; a vector in pgvector's binary form, from the same floats
                        vector = PgVector(plain[name][n]) if name in vectors else get_list_val_str(value)
                        row = [key_bin, name, value.SerializeToString(), text, num, vector, whens[n], None]
                        if not with_num:
                            del row[4]
                        copy.write_row(row)
            conn.execute(f"INSERT INTO {_identifier(table)} ({names}) SELECT {names} FROM featurectl_load "
                         f"ON CONFLICT (entity_key, feature_name) DO UPDATE SET {updates} "
                         f"WHERE {_identifier(table)}.event_ts <= EXCLUDED.event_ts")

    def _has_value_num(self, table: str) -> bool:
        """Whether the table has Feast's optional `value_num` column (made with `enable_openai_compatible_store`),
        asked once per table: a materialization loads batch after batch."""
        if table not in self._value_num:
            self._value_num[table] = self.connection().execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %s "
                "AND column_name = 'value_num'", (table,)).fetchone() is not None
        return self._value_num[table]

    def _delete(self, view: FeatureView, table: str, keys: Sequence[tuple], whens: Sequence[Any]) -> None:
        """Remove entities (join key values in sorted key order) from the view's table, each unless it holds a
        row newer than its time in `whens`."""
        from feast.infra.key_encoding_utils import serialize_entity_key
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.type_map import python_values_to_proto_values

        join_keys = sorted(view.entity.join_keys)
        values = [python_values_to_proto_values([key[n] for key in keys], view.entity.join_keys[k].feast_value_type())
                  for n, k in enumerate(join_keys)]
        version = self._write_config(vector_kind(view)).entity_key_serialization_version
        serialized = [serialize_entity_key(EntityKey(join_keys=join_keys, entity_values=[v[n] for v in values]),
                                           entity_key_serialization_version=version) for n in range(len(keys))]
        self.connection().execute(
            f"DELETE FROM {_identifier(table)} AS t USING (SELECT unnest(%s::bytea[]) AS k, "
            "unnest(%s::timestamptz[]) AS ts) AS g WHERE t.entity_key = g.k AND NOT EXISTS (SELECT 1 FROM "
            f"{_identifier(table)} AS n WHERE n.entity_key = g.k AND n.event_ts > g.ts)", [serialized, list(whens)])

    def seal(self, view: FeatureView) -> None:
        """After a bulk load: build the view's HNSW indexes if missing (an existing one grew with the rows)."""
        if view.vector_features:
            self._ensure_indexes(view, self._table(view))

    def _ensure_indexes(self, view: FeatureView, table: str) -> None:
        kind = vector_kind(view)
        params = ", ".join(f"{_identifier(name)} = {int(value)}" for name, value in self.index_params.items())
        conn = self.connection()
        conn.execute(f"SET maintenance_work_mem = '{MAINTENANCE_WORK_MEM}'")
        for feature in view.vector_features:
            conn.execute(f"CREATE INDEX IF NOT EXISTS {_identifier(f'{table}_{feature}_hnsw')} ON "
                         f"{_identifier(table)} USING hnsw (vector_value {OPERATORS[kind.metric][1]}) "
                         f"WITH ({params}) WHERE feature_name = '{_literal(feature)}'")
        conn.execute("ANALYZE " + _identifier(table))
        self._indexed.add(table)

    def search(self, collection: str, feature: str, kind: Vector, vector: Sequence[float], k: int,
               filters: Optional[Filters] = None) -> list[tuple[str, float]]:
        """The `k` nearest (entity key as hex, distance as Milvus reports it) of `vector` in table `collection`'s
        `feature`, nearest first, among the entities `filters` keep: HNSW without filters, an exact scan with."""
        operator, _, distance = OPERATORS[kind.metric]
        query = "[" + ",".join(map(repr, vector)) + "]"
        table = _identifier(collection)
        # the feature name inline, not a parameter: a prepared statement's generic plan then still matches the
        # partial index's `WHERE feature_name = '...'`
        vectors = f"{table} WHERE feature_name = '{_literal(feature)}'"
        params: dict[str, Any] = {"q": query, "k": k}
        if not filters:
            sql = (f"SELECT entity_key, vector_value {operator} %(q)s::vector FROM {vectors} "
                   f"ORDER BY vector_value {operator} %(q)s::vector LIMIT %(k)s")
        else:
            kept = []
            for n, (name, values) in enumerate(filters.items()):
                kept.append(f"entity_key IN (SELECT entity_key FROM {table} WHERE feature_name = %(f{n})s "
                            f"AND value_text = ANY(%(v{n})s))")
                params.update({f"f{n}": name, f"v{n}": list(values)})
            # MATERIALIZED: the distances of every filtered row, sorted, never an index walk that filters after
            sql = (f"WITH scanned AS MATERIALIZED (SELECT entity_key, vector_value {operator} %(q)s::vector AS d "
                   f"FROM {vectors} AND {' AND '.join(kept)}) "
                   "SELECT entity_key, d FROM scanned ORDER BY d LIMIT %(k)s")
        conn = self.connection()
        ef_search = int(self.search_params.get("ef_search", 40))  # pgvector's default
        if filters or k <= ef_search:
            rows = conn.execute(sql, params, prepare=True).fetchall()
        else:  # an HNSW walk returns at most ef_search rows: widen it to k for this search
            with conn.transaction():
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(k)}")
                rows = conn.execute(sql, params, prepare=True).fetchall()
        return [(bytes(key).hex(), distance(float(d))) for key, d in rows]

    def drop(self, collection: str) -> None:
        """Forget a view's index (its table), e.g. before indexing the view anew."""
        self.connection().execute(f"DROP TABLE IF EXISTS {_identifier(collection)}")
        self._made.discard(collection)
        self._indexed.discard(collection)
        self._value_num.pop(collection, None)


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return text.replace("'", "''")
