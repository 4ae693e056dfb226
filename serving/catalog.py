"""What the server needs from Feast's registry, read once and refreshed in the background.

The request path never touches the registry: it reads an immutable `Catalog` (views, their features and types,
join keys, ttl, services), swapped atomically by `CatalogRefresher` every `cache_ttl_seconds`. When the registry
becomes unreachable (its PostgreSQL down), the server keeps serving the last catalog read and says so in `/ready`.

The catalog also marks the views whose online values were written by another version than the one applied
(`common.version_log`): requests for them are refused (`VersionConflictError`) until they are materialized
again, or streamed, at the applied version.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from common.log_columns import log_columns
from common.version_log import VersionLog
from dsl.duration import milliseconds
from dsl.types import MAX_VECTOR_DIM, VECTOR_METRICS, FeatureType, ValueType, Vector
from redis_store.layout import field_name, ts_field
from serving.errors import RegistryError
from serving.on_demand import OnDemandSpec, on_demand_spec

logger = logging.getLogger(__name__)

_versions = itertools.count(1)


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    kind: Optional[FeatureType]  # None: a Feast type outside the DSL (lists, bytes...), decoded generically
    field: bytes  # the hash field, murmur3 of `view:feature`


@dataclass(frozen=True)
class ViewSpec:
    name: str  # the name used in requests and in output names
    storage_name: str  # the name hashed into Redis fields (differs only with Feast's online view versioning)
    join_keys: tuple[tuple[str, ValueType], ...]
    features: dict[str, FeatureSpec]
    ttl_ms: Optional[int]  # None or 0: values never expire
    ts_field: bytes
    conflict: Optional[str] = None  # why requests for the view are refused: its online values' version


@dataclass(frozen=True)
class LogSpec:
    """A feature service whose served vectors are logged: where, how often, and Feast's schema of its log."""

    service: str
    path: str  # the folder of its FileLoggingDestination
    sample_rate: float
    schema: Any  # pyarrow.Schema, as Feast's FeatureServiceLoggingSource derives it
    features: tuple[str, ...]  # log column of each served feature (`view__feature`), in the service's order
    request_fields: tuple[str, ...] = ()  # request data its on-demand views read: logged from the request


@dataclass(frozen=True)
class Catalog:
    project: str
    views: dict[str, ViewSpec]
    services: dict[str, tuple[str, ...]]  # service name -> feature refs `view:feature`, in definition order
    logged: dict[str, LogSpec] = field(default_factory=dict)  # services with a file logging destination
    on_demand: dict[str, OnDemandSpec] = field(default_factory=dict)
    version: int = field(default_factory=lambda: next(_versions))


def value_type(dtype: Any) -> Optional[ValueType]:
    """The DSL type of a Feast dtype; None for types the DSL lacks (lists, bytes...)."""
    by_feast = {kind.feast_type(): kind for kind in ValueType}
    try:
        return by_feast.get(dtype)
    except TypeError:  # unhashable Feast types (Array(...)) are served with the generic decoder
        return None


def field_type(feast_field: Any) -> Optional[FeatureType]:
    """The DSL type of a Feast field: a `Vector` for a float list indexed for search (its length and metric kept
    on the field), else `value_type` of its dtype."""
    metric = (feast_field.vector_search_metric or "L2").upper()
    if feast_field.vector_index and 0 < feast_field.vector_length <= MAX_VECTOR_DIM and metric in VECTOR_METRICS:
        from feast import types as ft

        if feast_field.dtype == ft.Array(ft.Float32):
            return Vector(feast_field.vector_length, metric)
    return value_type(feast_field.dtype)


def version_conflicts(version_log: VersionLog, project: str) -> dict[str, str]:
    """View -> why it is refused, for each view whose online values are of another version than the applied."""
    return {view: (f"feature view `{view}`: its online values are of version {written.version} "
                   f"(`{written.written_by}` at {written.written_at:%Y-%m-%d %H:%M}Z), but version "
                   f"{applied.version} is applied (at {applied.applied_at:%Y-%m-%d %H:%M}Z) and may compute "
                   f"something else; re-backfill it (`featurectl versions --view {view}` lists the ranges) and run "
                   f"`featurectl materialize START END --view {view}`, or restart `featurectl stream` for it; "
                   f"`--allow-stale {view}` on materialize accepts its offline rows as they are")
            for view, (written, applied) in version_log.conflicts(project).items()}


def _view_spec(view: Any, versioning: bool, conflict: Optional[str]) -> ViewSpec:
    from feast.infra.online_stores.helpers import compute_versioned_name

    storage = compute_versioned_name(view, versioning)
    join_keys = []
    for column in view.entity_columns:
        kind = value_type(column.dtype)
        if kind not in (ValueType.STRING, ValueType.INT32, ValueType.INT64):
            raise RegistryError(f"feature view `{view.name}`: join key `{column.name}` has type {column.dtype}; "
                                "the online reader supports string, int32 and int64 join keys")
        join_keys.append((column.name, kind))
    features = {f.name: FeatureSpec(f.name, field_type(f), field_name(storage, f.name))
                for f in view.features}
    ttl_ms = milliseconds(view.ttl) if view.ttl else None
    return ViewSpec(view.name, storage, tuple(join_keys), features, ttl_ms or None, ts_field(storage), conflict)


def _log_spec(service: Any, registry: Any, project: str) -> Optional[LogSpec]:
    """The service's logging as the server needs it; None without logging, with a destination other than files
    (logged by Feast's own servers, not ours), or when Feast cannot derive its log schema (the service is then
    served, not logged, and a warning says why)."""
    from feast.infra.offline_stores.file_source import FileLoggingDestination

    config = service.logging_config
    if config is None:
        return None
    if not isinstance(config.destination, FileLoggingDestination):
        logger.warning("feature service `%s` logs to a %s, which featurectl serve does not write; not logged",
                       service.name, type(config.destination).__name__)
        return None
    try:
        columns = log_columns(service, registry, project)
    except Exception as exc:  # a view type Feast has no log schema for, a registry read failing now
        logger.warning("feature service `%s`: no log schema (%s); served but not logged", service.name, exc)
        return None
    return LogSpec(service.name, config.destination.path, config.sample_rate, columns.schema, columns.features,
                   columns.request_fields)


def load_catalog(registry: Any, project: str, versioning: bool = False,
                 version_log: Optional[VersionLog] = None) -> Catalog:
    """Read views and services of `project` through Feast's registry API (no cache: always the stored state), and
    their versions from `version_log` when given."""
    try:
        views = registry.list_feature_views(project, allow_cache=False)
        services = registry.list_feature_services(project, allow_cache=False)
        conflicts = version_conflicts(version_log, project) if version_log is not None else {}
        logged = {spec.service: spec for spec in (_log_spec(s, registry, project) for s in services) if spec}
        on_demand = registry.list_on_demand_feature_views(project, allow_cache=False, skip_udf=True)
    except Exception as exc:  # SQLAlchemy, protobuf, file errors: one message for the caller
        raise RegistryError(f"cannot read the Feast registry of project `{project}`: {exc}; "
                            "check `registry.path` in feature_store.yaml and run `featurectl apply`") from exc
    specs = {v.name: _view_spec(v, versioning, conflicts.get(v.name)) for v in views if v.entity_columns}
    refs = {}
    for service in services:
        refs[service.name] = tuple(f"{p.name_to_use()}:{f.name}" for p in service.feature_view_projections
                                   for f in p.features)
    computed = {odfv.name: spec for odfv in on_demand if (spec := on_demand_spec(odfv, value_type)) is not None}
    return Catalog(project, specs, refs, logged, computed)


class CatalogRefresher:
    """Holds the current catalog and reloads it in a daemon thread; a failed reload keeps the previous one."""

    def __init__(self, repo_config: Any, interval_s: Optional[float] = None):
        from feast import FeatureStore

        self._registry = FeatureStore(config=repo_config).registry
        self._project = repo_config.project
        self._versioning = bool(getattr(repo_config.registry, "enable_online_feature_view_versioning", False))
        url = str(repo_config.registry.path)
        self._versions = VersionLog(url) if "://" in url else None  # a SQL registry: our tables beside Feast's
        self.interval_s = interval_s if interval_s is not None else (repo_config.registry.cache_ttl_seconds or 60)
        self.catalog = self._load()
        self.loaded_at = time.time()  # the last successful read of the registry
        self.error: Optional[str] = None  # why the last reload failed; None after a successful one
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self._thread is None and self.interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="catalog-refresh", daemon=True)
            self._thread.start()

    def refresh(self) -> Catalog:
        """Reload now; an unchanged registry keeps the current catalog (and the plans cached against it)."""
        new = self._load()
        self.loaded_at, self.error = time.time(), None
        if (new.views, new.services, new.logged, new.on_demand) != (self.catalog.views, self.catalog.services,
                                                                    self.catalog.logged, self.catalog.on_demand):
            self.catalog = new
            logger.info("registry changed: %d views, %d services", len(new.views), len(new.services))
        return self.catalog

    def _load(self) -> Catalog:
        return load_catalog(self._registry, self._project, self._versioning, self._versions)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except RegistryError as exc:
                self.error = str(exc)
                logger.warning("registry refresh failed, serving the previous definitions: %s", exc)

    def state(self) -> dict[str, Any]:
        """For `/ready`: `current`, or `cached` while reloads fail (the definitions served are those read at
        `loaded_at`), with the reason."""
        loaded = dt.datetime.fromtimestamp(self.loaded_at, dt.timezone.utc).isoformat()
        if self.error is None:
            return {"state": "current", "loaded_at": loaded}
        return {"state": "cached", "loaded_at": loaded, "error": self.error}

    def close(self) -> None:
        self._stop.set()
        if self._versions is not None:
            self._versions.close()
