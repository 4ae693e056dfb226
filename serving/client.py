"""The online SDK: `get_features(features | service, entity_rows)` over Feast's Redis layout.

    client = OnlineClient.from_repo("feature_repo")
    client.get_features("asset_ranking", {"asset_id": ["a1", "a2"]})          # dict of columns
    client.get_features(["asset_activity:views_1h"], [{"asset_id": "a1"}], output="arrow")
    client.search("asset_shape:embedding", vector, k=10, features=["category"])   # nearest neighbours

One request = one pipelined round trip to Redis (one per node on a cluster), whatever the number of views.
`AsyncOnlineClient` is the same client for asyncio servers: planning, encoding and decoding are shared; only
the line that talks to Redis differs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence, TypeVar, overload

from redis_store.cluster import AsyncCluster, SyncCluster
from redis_store.node import Answered, AsyncNode, SyncNode
from redis_store.settings import RedisSettings
from serving.catalog import CatalogRefresher
from serving.errors import ServingError
from serving.plan import Plan, build_plan
from serving.request import EntityRows, PreparedRequest
from serving.result import OnlineFeatures
from serving.search import SearchResult, feature_refs, hit_rows, plan_search, result

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from serving.push import Pusher, PushResult
    from serving.push_request import PushMode
    from serving.push_rows import PushRows
    from serving.search import SearchPlan
    from serving.pgvector_index import PgVectorIndex
    from serving.vector_index import VectorIndex

Features = Sequence[str] | str  # `view:feature` references, or a feature service name
Output = Literal["dict", "arrow", "pandas"]
Client = TypeVar("Client", bound="_ClientCore")
_MAX_PLANS = 1024


class _ClientCore:
    """Registry, plans and request building: everything but the I/O."""

    def __init__(self, repo_config: Any, *, timeout_s: float = 1.0, refresh_s: Optional[float] = None,
                 spin_us: float = 200):
        self.repo_config = repo_config
        self.settings = dataclasses.replace(RedisSettings.from_feast(repo_config.online_store, timeout_s),
                                            spin_s=spin_us / 1e6)
        self.registry = CatalogRefresher(repo_config, refresh_s)
        self.registry.start()
        self._plans: dict[tuple, Plan] = {}
        self._pusher: Optional[Pusher] = None
        self._pusher_lock = threading.Lock()
        self._index: Optional[VectorIndex | PgVectorIndex] = None

    @classmethod
    def from_repo(cls: type[Client], repo: str | Path = "feature_repo", registry: Optional[str] = None,
                  **kwargs: Any) -> Client:
        """A client for a feature repo folder (its feature_store.yaml); `registry` overrides the registry URL."""
        from common.config import load_config

        return cls(load_config(repo, registry_override=registry).feast_repo_config(), **kwargs)

    def plan(self, features: Features, full_feature_names: bool = False) -> Plan:
        catalog = self.registry.catalog
        key = (features if isinstance(features, str) else tuple(features), full_feature_names)
        plan = self._plans.get(key)
        if plan is None or plan.catalog_version != catalog.version:
            plan = build_plan(catalog, features, full_feature_names)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def prepare(self, features: Features, entity_rows: EntityRows, full_feature_names: bool) -> PreparedRequest:
        return PreparedRequest(self.plan(features, full_feature_names), entity_rows)

    def pusher(self) -> Pusher:
        """The repo's push sources and their writers (`serving.push`), read on the first push: the definitions
        and platform settings of the repo folder."""
        with self._pusher_lock:
            if self._pusher is None:
                from serving.push import Pusher

                self._pusher = Pusher(self._repo_path("push"))
            return self._pusher

    def _repo_path(self, what: str) -> Path:
        repo_path = getattr(self.repo_config, "repo_path", None)
        if repo_path is None:
            raise ServingError(f"{what} needs the feature repo folder: make the client with `from_repo(PATH)` or a "
                               "RepoConfig with `repo_path`")
        return Path(repo_path)

    def vector_index(self) -> VectorIndex | PgVectorIndex:
        """The project's vector index (`serving.vector_common.open_index`), opened on the first search."""
        with self._pusher_lock:
            if self._index is None:
                from common.config import load_config
                from serving.vector_common import open_index

                self._index = open_index(load_config(self._repo_path("search")))
            return self._index

    def plan_search(self, view_feature: str, vector: Any, k: int, filters: Optional[dict],
                    features: Optional[Sequence[str]]) -> tuple[SearchPlan, list[tuple[str, float]]]:
        """The plan and the index's hits (keys, distances) of a search: the blocking part, Redis aside."""
        plan = plan_search(self.registry.catalog, view_feature, vector, k, filters, features)
        return plan, self.vector_index().search(plan.collection, plan.feature, plan.kind, plan.vector, plan.k,
                                                plan.filters)

    def _close_pusher(self) -> None:
        if self._pusher is not None:
            self._pusher.close()


class OnlineClient(_ClientCore):
    """Thread-safe: each concurrent call uses its own pooled connection."""

    def __init__(self, repo_config: Any, **kwargs: Any):
        super().__init__(repo_config, **kwargs)
        s = self.settings
        self.redis: SyncNode | SyncCluster = SyncCluster(s) if s.cluster else SyncNode(s, s.nodes[0])

    def get_online_features(self, features: Features, entity_rows: EntityRows, *,
                            full_feature_names: bool = False) -> OnlineFeatures:
        """Values, statuses and event timestamps (what the HTTP server returns)."""
        request, replies = self.fetch(features, entity_rows, full_feature_names)
        return request.finish(replies)

    def fetch(self, features: Features, entity_rows: EntityRows,
              full_feature_names: bool = False) -> tuple[PreparedRequest, list]:
        """The request and its replies, not yet decoded (`AsyncOnlineClient.fetch`, in one blocking call)."""
        request = self.prepare(features, entity_rows, full_feature_names)
        return request, self.redis.read(request.keys, request.commands) if request.commands else []

    @overload
    def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                     output: Literal["dict"] = ...) -> dict[str, list[Any]]: ...

    @overload
    def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                     output: Literal["arrow"]) -> pa.Table: ...

    @overload
    def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                     output: Literal["pandas"]) -> pd.DataFrame: ...

    def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = False,
                     output: Output = "dict") -> Any:
        """Columns: the join keys in name order, then the features in request order; a dict of lists, or
        `output="arrow"` / `"pandas"`."""
        request, replies = self.fetch(features, entity_rows, full_feature_names)
        return request.to_dict(replies) if output == "dict" else request.finish(replies).to(output)

    def push(self, source: str, rows: PushRows, *, to: PushMode = "online") -> PushResult:
        """Write rows to a push source: events to an event source by its name (its Kafka topic with `to="online"`,
        its Parquet history with `"offline"`, or both), values of an attribute view to `{view}_push` (Redis).
        `rows`: a list of dicts, a dict of columns or a pandas DataFrame. Every row is checked before anything is
        written; see `serving.push`."""
        pusher = self.pusher()
        prepared = pusher.prepare(self.registry.catalog, source, rows, to)
        replies = self.redis.read(prepared.keys, prepared.commands) if prepared.commands else []
        return prepared.finish(replies, *pusher.write_events(prepared))

    def search(self, view_feature: str, vector: Any, k: int = 10, filters: Optional[dict] = None,
               features: Optional[Sequence[str]] = None) -> SearchResult:
        """The `k` entities whose `view_feature` (a Vector feature, `view:feature`) is nearest to `vector`:
        their ids (join keys), distances and the `features` of the same view asked for, nearest first.
        `filters`: `{feature: value}` or `{feature: [values]}` on the view's other features (`serving.search`)."""
        plan, hits = self.plan_search(view_feature, vector, k, filters, features)
        rows = hit_rows(plan, self.registry.catalog.project, hits)
        values = self.get_features(feature_refs(plan), rows) if rows and plan.features else None
        return result(rows, hits, plan, values)

    def ping(self) -> None:
        self.redis.ping()

    def close(self) -> None:
        self.registry.close()
        self._close_pusher()
        self.redis.close()

    def __enter__(self) -> "OnlineClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncOnlineClient(_ClientCore):
    """For one event loop: concurrent requests share one connection per node and pipeline on it."""

    def __init__(self, repo_config: Any, **kwargs: Any):
        super().__init__(repo_config, **kwargs)
        s = self.settings
        self.redis: AsyncNode | AsyncCluster = AsyncCluster(s) if s.cluster else AsyncNode(s, s.nodes[0])

    async def get_online_features(self, features: Features, entity_rows: EntityRows, *,
                                  full_feature_names: bool = False) -> OnlineFeatures:
        request, replies = await self.fetch(features, entity_rows, full_feature_names)
        return request.finish(replies)

    async def fetch(self, features: Features, entity_rows: EntityRows,
                    full_feature_names: bool = False) -> tuple[PreparedRequest, list]:
        """The request and its replies, not yet decoded: the feature server writes a one-row answer straight
        from them (`PreparedRequest.answer_json`)."""
        request = self.prepare(features, entity_rows, full_feature_names)
        return request, await self.redis.read(request.keys, request.commands) if request.commands else []

    def reads_soon(self) -> bool:
        """Whether `read_soon` may be called now: one node (no cluster) whose connection is open."""
        redis = self.redis
        return isinstance(redis, AsyncNode) and redis.is_open()

    def read_soon(self, request: PreparedRequest, answered: Answered) -> None:
        """Hand a prepared request's replies (or the failure) to `answered`, for callers that answer from a callback
        rather than a coroutine (they check the replies: `redis_store.node.check_replies`); only while
        `reads_soon()`."""
        self.redis.submit(request.commands, answered)  # type: ignore[union-attr]

    @overload
    async def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                           output: Literal["dict"] = ...) -> dict[str, list[Any]]: ...

    @overload
    async def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                           output: Literal["arrow"]) -> pa.Table: ...

    @overload
    async def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = ...,
                           output: Literal["pandas"]) -> pd.DataFrame: ...

    async def get_features(self, features: Features, entity_rows: EntityRows, *, full_feature_names: bool = False,
                           output: Output = "dict") -> Any:
        request, replies = await self.fetch(features, entity_rows, full_feature_names)
        return request.to_dict(replies) if output == "dict" else request.finish(replies).to(output)

    async def push(self, source: str, rows: PushRows, *, to: PushMode = "online") -> PushResult:
        """`OnlineClient.push`; Kafka and the history file are written on a worker thread."""
        pusher = self.pusher()
        prepared = pusher.prepare(self.registry.catalog, source, rows, to)
        replies = await self.redis.read(prepared.keys, prepared.commands) if prepared.commands else []
        written = await asyncio.get_running_loop().run_in_executor(None, pusher.write_events, prepared)
        return prepared.finish(replies, *written)

    async def search(self, view_feature: str, vector: Any, k: int = 10, filters: Optional[dict] = None,
                     features: Optional[Sequence[str]] = None) -> SearchResult:
        """`OnlineClient.search`; the index is asked on a worker thread, Redis on this loop's connection."""
        plan, hits = await asyncio.to_thread(self.plan_search, view_feature, vector, k, filters, features)
        rows = hit_rows(plan, self.registry.catalog.project, hits)
        values = await self.get_features(feature_refs(plan), rows) if rows and plan.features else None
        return result(rows, hits, plan, values)

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        self.registry.close()
        self._close_pusher()
        await self.redis.close()

    async def __aenter__(self) -> "AsyncOnlineClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
