"""Vector features indexed in Milvus for nearest-neighbour search, in Feast's own Milvus layout.

Redis keeps every feature value (Feast's Redis layout); Milvus holds the index. One collection per view with a
vector feature, `{project}_{view}`, made and written by Feast's own `MilvusOnlineStore`, so Feast's
`retrieve_online_documents_v2` reads what we write: primary key `{join keys}_pk` = the hex of Feast's serialized
entity key (our Redis key without the project), a FLOAT_VECTOR field per vector feature, the other features as
Feast writes them (their string form, which is what filters compare). A search asks Milvus for keys and distances
only; the features of the hits come from Redis (`serving.search`).

Milvus Lite (embedded, a file under the state folder) by default; `platform.vectors.uri` points the same code at a
Milvus server or cluster (`featurectl services up --milvus` starts one). Milvus Lite serves one process at a time:
several serving processes need a server. The index is FLAT (exact) on Lite, which refuses HNSW, and HNSW on a server,
unless `platform.vectors.index_type` says otherwise. A server builds its index per sealed segment and searches rows
still in a growing segment by brute force (our local server) or through its interim index, so a bulk load ends with
`seal`.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Mapping, Optional, Sequence

from common.config import ProjectConfig
from dsl.feature_view import FeatureView
from dsl.types import Vector
from redis_store.layout import KeyEncoder
from serving.vector_common import Filters, VectorEngine, VectorSearchError, feast_text, vector_kind

LITE_FILE = "vectors.db"
# Rows per insert call. Milvus Lite 2.5's insert time grows faster than the rows of a call (on the 2-core host:
# 0.17 ms a row at 1,000 to 5,000 rows, 0.3 at 10,000, over 2.5 at 16,384, materialize's batch), so a batch is
# sent in slices of this size: 100,000 vectors of dim 128 load in about 20 s instead of 9 to 12 min.
INSERT_ROWS = 1000
SEAL_TIMEOUT_S = 600.0
# Milvus builds no index for a segment of fewer rows (`indexCoord.segment.minSegmentNumRowsToEnableIndex`, 1024 by
# default and in the server `featurectl services up --milvus` runs): its query nodes scan such a segment, so `seal`
# counts it as served once it is sealed. A load can end with one (696 rows beside 99,304 seen after a load of 100,000).
UNINDEXED_SEGMENT_ROWS = 1024
GROWING = 2  # a segment's state (pymilvus's `SegmentState.Growing`): still taking rows, scanned
# HNSW's parameters when the config gives none, measured by hand on the local server on 100,000 clustered vectors
# of dim 128 (README, "Vector features and search"): recall@10 0.91 at ef 16, 0.98 at 32, 0.998 at 64. Isotropic
# Gaussian vectors of dim 128 are HNSW's worst case (0.49 at ef 64, 0.78 at 256): data like that wants a larger ef,
# or FLAT.
HNSW_BUILD = {"M": 16, "efConstruction": 200}
HNSW_SEARCH = {"ef": 64}
# Sent with every search whatever level the collection was made with: Bounded reads what the query node holds unless
# it lags more than Milvus's `common.gracefulTime` (5 s), so a search waits for no time tick. Measured on the local
# server (1,000 HNSW searches each at load 10): Strong p50 200 ms (it waits for the next 200 ms time tick), Bounded
# 1.7 ms, Eventually 1.8 ms.
SEARCH_CONSISTENCY = "Bounded"
# Keys per look-up of the keys a collection holds before a bulk write (Milvus's query limit). Milvus 2.3 records a
# delete even for a key it never held, and about a minute after a load of new keys deleted first (95,000 such
# deletes for 100,000 rows) it compacted the segment and rebuilt HNSW (26 s on 1 to 1.9 cores), searches meanwhile
# at p99 20 to 46 ms. A Strong look-up of 16,384 keys took 0.43 s on the local server (1,000: 0.23 s).
HELD_KEYS = 16384


def milvus_expression(filters: Filters) -> str:
    """Milvus's boolean expression of checked filters (`vector_common.filter_values`)."""
    return " and ".join(f"{name} in [{', '.join(map(_quoted, values))}]" for name, values in filters.items())


def _quoted(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


class VectorIndex(VectorEngine):
    """One project's vector index: writes through Feast's Milvus store, searches through pymilvus directly."""

    def __init__(self, config: ProjectConfig):
        from feast.infra.online_stores.milvus_online_store.milvus import MilvusOnlineStore

        super().__init__(config)
        self._store = MilvusOnlineStore()
        self._lock = threading.Lock()  # Feast's store caches its client and collections unguarded
        self._client: Any = None
        self._made: set[str] = set()

    @property
    def location(self) -> str:
        return self.settings.uri or str(self.config.state_dir / LITE_FILE)

    @property
    def on_server(self) -> bool:
        return bool(self.settings.uri)

    @property
    def index_type(self) -> str:
        """The configured index, else FLAT on Milvus Lite (the only exact one it has; it refuses HNSW) and HNSW on
        a server."""
        return (self.settings.index_type or ("HNSW" if self.on_server else "FLAT")).upper()

    @property
    def index_params(self) -> dict[str, Any]:
        if self.settings.index_params is not None:
            return dict(self.settings.index_params)
        return dict(HNSW_BUILD) if self.index_type == "HNSW" else {}

    @property
    def search_params(self) -> dict[str, Any]:
        if self.settings.search_params is not None:
            return dict(self.settings.search_params)
        return dict(HNSW_SEARCH) if self.index_type == "HNSW" else {}

    def feast_repo_config(self, kind: Vector):
        """Feast's RepoConfig of this project with the Milvus online store holding the index (`kind`: the view's
        vector type, whose dimension and metric Feast's store builds the collection with)."""
        from feast.repo_config import RepoConfig

        store: dict[str, Any] = {"type": "milvus", "embedding_dim": kind.dim, "metric_type": kind.metric,
                                 "index_type": self.index_type, "vector_enabled": True,
                                 "index_params": self.index_params, "search_params": self.search_params}
        if self.settings.uri:
            store.update(uri=self.settings.uri, token=self.settings.token or None)
        else:
            self.config.state_dir.mkdir(parents=True, exist_ok=True)
            store["path"] = self.location
        raw = self.config.feast_repo_config()
        return RepoConfig(repo_path=self.config.repo_path, project=raw.project, provider="local",
                          registry=raw.registry, online_store=store, offline_store={"type": "file"},
                          entity_key_serialization_version=raw.entity_key_serialization_version)

    def write(self, view: FeatureView, columns: Mapping[str, Sequence[Any]], event_ms: Sequence[int],
              bulk: bool = False) -> int:
        """Index rows of `view` (join keys and every feature, one list per column; `event_ms` per row) as Feast's
        Milvus store writes them: the entity key's hex, event time in microseconds, the vectors, the join keys and
        other features as text. An entity's previous row is replaced; an entity whose last row has no vector leaves
        the index (Redis serves it null now). Returns the rows written. (Feast's own `online_write_batch` would
        first build a protobuf per value.) `bulk` (a load, on a server): delete only the keys the collection holds,
        looked up first (`HELD_KEYS`); otherwise every key is deleted before its insert, which costs no look-up."""
        vectors = list(view.vector_features)
        encoder = KeyEncoder(self.config.project, view.entity.join_keys)
        cut = len(self.config.project.encode())
        keys = [key[:-cut].hex() for key in encoder.keys([columns[k] for k in encoder.order])]
        last = {key: i for i, key in enumerate(keys)}  # the last row of an entity wins, as in Feast's writer
        dropped = {key for key, i in last.items() if any(columns[v][i] is None for v in vectors)}
        schema = view.output_schema()
        records = {}
        for key, i in last.items():
            if key in dropped:
                continue
            record = {"event_ts": int(event_ms[i]) * 1000, "created_ts": 0,
                      **{name: feast_text(columns[name][i]) for name in view.entity.join_keys}}
            for name, kind in schema.items():
                value = columns[name][i]
                record[name] = list(map(float, value)) if isinstance(kind, Vector) else feast_text(value)
            records[key] = record
        if not records and not dropped:
            return 0
        collection, pk = self._collection(view)
        rows = [{pk: key, **record} for key, record in records.items()]
        client = self.client()
        if dropped:
            with self._lock:
                client.delete(collection_name=collection, ids=sorted(dropped))
        held = self._held(collection, pk, list(records)) if bulk and self.on_server else None
        for lo in range(0, len(rows), INSERT_ROWS):
            part = rows[lo:lo + INSERT_ROWS]
            gone = [row[pk] for row in part if held is None or row[pk] in held]
            with self._lock:
                if gone:
                    client.delete(collection_name=collection, ids=gone)
                client.insert(collection_name=collection, data=part)
        return len(rows)

    def _held(self, collection: str, pk: str, keys: list[str]) -> set[str]:
        """Which of `keys` `collection` holds now (Strong: rows inserted a moment ago, not yet flushed, included)."""
        held: set[str] = set()
        for lo in range(0, len(keys), HELD_KEYS):
            listed = ",".join(map(_quoted, keys[lo:lo + HELD_KEYS]))
            found = self.client().query(collection_name=collection, filter=f"{pk} in [{listed}]", output_fields=[pk],
                                        consistency_level="Strong", limit=HELD_KEYS)
            held.update(row[pk] for row in found)
        return held

    def _collection(self, view: FeatureView) -> tuple[str, str]:
        """The view's collection (made by Feast's own store when missing) and its primary key field."""
        feast_view = self._feast_view(view.name)
        collection = f"{self.config.project}_{view.name}"
        if collection not in self._made:
            with self._lock:
                self._store.update(self.feast_repo_config(vector_kind(view)), [], [feast_view], [], [], True)
            self._made.add(collection)
        return collection, "_".join(column.name for column in feast_view.entity_columns) + "_pk"

    def client(self):
        """A pymilvus client of the index (Milvus Lite's server is one per file and process: Feast's store and
        this client share it)."""
        if self._client is None:
            from pymilvus import MilvusClient

            if self.settings.uri:
                self._client = MilvusClient(uri=self.settings.uri, token=self.settings.token or "")
            else:
                self.config.state_dir.mkdir(parents=True, exist_ok=True)
                self._client = MilvusClient(self.location)
        return self._client

    def search(self, collection: str, feature: str, kind: Vector, vector: Sequence[float], k: int,
               filters: Optional[Filters] = None) -> list[tuple[str, float]]:
        """The `k` nearest (primary key, distance) of `vector` in `collection`'s `feature`, nearest first, among
        the entities `filters` keep."""
        hits = self.client().search(collection_name=collection, data=[list(vector)], anns_field=feature, limit=k,
                                    filter=milvus_expression(filters or {}), output_fields=[],
                                    consistency_level=SEARCH_CONSISTENCY,
                                    search_params={"metric_type": kind.metric, "params": self.search_params})
        return [(hit["id"], float(hit["distance"])) for hit in hits[0]]

    def seal(self, view: FeatureView) -> None:
        """After a bulk load on a server: seal the view's growing segments (Milvus's flush), wait until the index
        covers them and until the query node serves them through it (Milvus hands an indexed segment over some
        seconds after building it; until then it scans the rows), so that searches go through the index (HNSW).
        Milvus Lite keeps no segments to seal."""
        if not self.on_server or not view.vector_features:
            return
        collection, _ = self._collection(view)
        client = self.client()
        client.flush(collection)
        indexes = [f"vector_index_{field}" for field in view.vector_features]
        deadline = time.monotonic() + SEAL_TIMEOUT_S
        while True:
            described = [client.describe_index(collection, name) for name in indexes]
            if not any(map(_pending, described)):
                if self._served_sealed_rows(collection) >= max(int(one.get("indexed_rows") or 0) for one in described):
                    return
            if time.monotonic() > deadline:
                raise VectorSearchError(f"Milvus at {self.location} does not serve `{collection}` through its "
                                        f"index {SEAL_TIMEOUT_S:.0f} s after its flush: see the server's log")
            time.sleep(0.2)

    def served_indexed_rows(self, collection: str) -> int:
        """Rows a server's query nodes serve from segments with a built index (the rest they scan)."""
        return sum(segment.num_rows for segment in self.served_segments(collection) if segment.indexID)

    def _served_sealed_rows(self, collection: str) -> int:
        """Rows a server's query nodes serve as they will stay: through a built index, or from a sealed segment too
        small for Milvus to index (`UNINDEXED_SEGMENT_ROWS`)."""
        return sum(segment.num_rows for segment in self.served_segments(collection) if segment.indexID or (
            segment.state != GROWING and segment.num_rows < UNINDEXED_SEGMENT_ROWS))

    def served_segments(self, collection: str) -> list:
        """The segments a server's query nodes search for `collection` (pymilvus's `QuerySegmentInfo`: rows,
        state, index): each costs a search of its own, and a growing one is scanned."""
        from pymilvus import utility

        return list(utility.get_query_segment_info(collection, using=self._connection()))

    def _connection(self) -> str:
        """The alias of a pymilvus ORM connection to the server (segment information has no MilvusClient call)."""
        from pymilvus import connections

        alias = f"featurectl-{id(self)}"
        if not connections.has_connection(alias):
            connections.connect(alias=alias, uri=self.settings.uri, token=self.settings.token or "")
        return alias

    def drop(self, collection: str) -> None:
        """Forget a view's index (its collection), e.g. before indexing the view anew."""
        if self.client().has_collection(collection):
            self.client().drop_collection(collection)


def _pending(described: Mapping[str, Any]) -> bool:
    return int(described.get("pending_index_rows") or 0) > 0 or described.get("state") not in ("Finished", None)
