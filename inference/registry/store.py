"""Model versions and their aliases in MLflow's Model Registry, kept in the project's registry database.

MLflow's tables live beside Feast's registry, never among them: MLflow names its tables generically (`runs`,
`experiments`, `alembic_version`), so on PostgreSQL they go in their own schema (`mlflow`) of the same database
and on SQLite in a sibling file (`registry.db` -> `registry.mlflow.db`; SQLite has no schemas). The registry
records where a checkpoint is and its SHA-256, not a copy of it: a server refuses a version whose file changed.

Aliases are MLflow's (`models:/NAME@champion`); MLflow keeps no history of them, so the versions that were
champion are kept in a tag of the registered model, newest last, which is what `rollback` walks back.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from inference.errors import Cube3DError
from inference.registry.checkpoint_check import VerifiedCheckpoint
from inference.registry.lineage import FeatureLineage

log = logging.getLogger(__name__)

ALIASES = ("champion", "challenger")
MLFLOW_SCHEMA = "mlflow"
SCHEME = "models:/"
_OWN = "featurectl."                     # prefix of the tags this module writes; users' tags may not use it
_HISTORY = _OWN + "champion_history"     # registered-model tag: versions that were champion, comma-separated
_LINEAGE_KEYS = ("feature_service", "feature_service_version", "feature_views")


class ModelRegistryError(Cube3DError):
    """A model, version or alias that does not exist, or a registry database MLflow cannot use."""


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: int
    source: str                          # the checkpoint file
    config: str                          # the Cube 3D config it was verified against
    sha256: str
    created: dt.datetime
    aliases: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)       # the user's
    lineage: Mapping[str, str] = field(default_factory=dict)    # feature service, its version, its views

    @property
    def label(self) -> str:
        """What a response names as the model that answered: `NAME/VERSION`."""
        return f"{self.name}/{self.version}"


def mlflow_uri(registry_url: str) -> str:
    """The MLflow store URI for the project's registry URL (see the module docstring for why not the same tables)."""
    if registry_url.startswith("sqlite:///"):
        path = registry_url[len("sqlite:///"):]
        stem = path[:-3] if path.endswith(".db") else path
        return f"sqlite:///{stem}.mlflow.db"
    if registry_url.startswith("postgresql"):
        separator = "&" if "?" in registry_url else "?"
        return f"{registry_url}{separator}options=-csearch_path%3D{MLFLOW_SCHEMA}"
    raise ModelRegistryError(f"the model registry needs a SQLite or PostgreSQL registry, not `{registry_url}`: set "
                             "`registry.path` in feature_store.yaml to a sqlite:/// or postgresql:// URL")


def parse_model_uri(uri: str) -> tuple[str, str]:
    """`models:/NAME@ALIAS` -> (NAME, ALIAS)."""
    name, _, alias = uri[len(SCHEME):].partition("@") if uri.startswith(SCHEME) else ("", "", "")
    if not name or alias not in ALIASES:
        raise ModelRegistryError(f"`{uri}` is not a model alias URI: use models:/NAME@champion "
                                 "(or @challenger)")
    return name, alias


def _create_schema(registry_url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(registry_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {MLFLOW_SCHEMA}"))
    finally:
        engine.dispose()


class ModelRegistry:
    """Register, list, promote and roll back model versions; resolve an alias for a server."""

    def __init__(self, registry_url: str):
        self.uri = mlflow_uri(registry_url)
        if registry_url.startswith("postgresql"):
            _create_schema(registry_url)
        from mlflow import MlflowClient

        for noisy in ("mlflow", "alembic"):     # table creation and migration notes (mlflow sets its level at import)
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def register(self, name: str, checkpoint: VerifiedCheckpoint, tags: Mapping[str, str] | None = None,
                 lineage: FeatureLineage | None = None) -> ModelVersion:
        """A new version of `name` (made on first use), numbered by MLflow: 1, 2, ..."""
        tags = dict(tags or {})
        reserved = sorted(k for k in tags if k.startswith(_OWN) or k in _LINEAGE_KEYS)
        if reserved:
            raise ModelRegistryError(f"tag(s) {', '.join(reserved)} are reserved for featurectl: rename them")
        own = {_OWN + "config": checkpoint.config, _OWN + "sha256": checkpoint.sha256,
               **{_OWN + k: v for k, v in (lineage.tags() if lineage else {}).items()}}
        with self._errors():
            if not self._exists(name):
                self.client.create_registered_model(name)
            mv = self.client.create_model_version(name, str(checkpoint.path), tags={**tags, **own})
            return self.version(name, int(mv.version))

    def names(self) -> list[str]:
        with self._errors():
            return sorted(m.name for m in self.client.search_registered_models())

    def versions(self, name: str) -> list[ModelVersion]:
        """Every version of `name`, oldest first."""
        with self._errors():
            self._require(name)
            aliases = self._aliases(name)
            found = self.client.search_model_versions(f"name = '{_quoted(name)}'")
            return sorted((_version(mv, aliases) for mv in found), key=lambda v: v.version)

    def version(self, name: str, version: int) -> ModelVersion:
        with self._errors():
            self._require(name)
            try:
                mv = self.client.get_model_version(name, str(version))
            except Exception:  # MLflow's RESOURCE_DOES_NOT_EXIST
                have = [str(v.version) for v in self.client.search_model_versions(f"name = '{_quoted(name)}'")]
                raise ModelRegistryError(f"model `{name}` has no version {version}; versions: "
                                         f"{', '.join(sorted(have, key=int)) or 'none'}") from None
            return _version(mv, self._aliases(name))

    def resolve(self, name: str, alias: str) -> Optional[ModelVersion]:
        """The version `alias` points to now; None when it points nowhere (a server keeps what it has)."""
        with self._errors():
            version = self._aliases(name).get(alias)
            return None if version is None else self.version(name, version)

    def promote(self, name: str, version: int, alias: str) -> ModelVersion:
        """Point `alias` at `version`; a new champion is appended to the champion history."""
        if alias not in ALIASES:
            raise ModelRegistryError(f"unknown alias `{alias}`; use one of {', '.join(ALIASES)}")
        self.version(name, version)
        with self._errors():
            if alias == "champion":
                history = self._history(name)
                if not history or history[-1] != version:
                    self._set_history(name, history + [version])
            self.client.set_registered_model_alias(name, alias, str(version))
        return self.version(name, version)

    def rollback(self, name: str) -> tuple[int, int]:
        """Point `champion` back at the previous champion; (from, to)."""
        with self._errors():
            self._require(name)
            current = self._aliases(name).get("champion")
            history = self._history(name)
            while history and history[-1] == current:
                history.pop()
            if current is None or not history:
                raise ModelRegistryError(f"model `{name}` has no previous champion to roll back to; promote a "
                                         f"version instead: featurectl models promote {name} VERSION "
                                         "--alias champion")
            self.client.set_registered_model_alias(name, "champion", str(history[-1]))
            self._set_history(name, history)
            return current, history[-1]

    # ---- helpers ------------------------------------------------------------------------------------
    @staticmethod
    @contextlib.contextmanager
    def _errors() -> Iterator[None]:
        from mlflow.exceptions import MlflowException

        try:
            yield
        except MlflowException as exc:
            raise ModelRegistryError(f"the model registry refused the operation: {exc.message}") from None

    def _exists(self, name: str) -> bool:
        return bool(self.client.search_registered_models(f"name = '{_quoted(name)}'"))

    def _require(self, name: str) -> None:
        if not self._exists(name):
            raise ModelRegistryError(f"no model `{name}` in the registry; registered: "
                                     f"{', '.join(self.names()) or 'none'} (featurectl models register NAME PATH)")

    def _aliases(self, name: str) -> dict[str, int]:
        return {alias: int(v) for alias, v in self.client.get_registered_model(name).aliases.items()}

    def _history(self, name: str) -> list[int]:
        value = self.client.get_registered_model(name).tags.get(_HISTORY, "")
        return [int(v) for v in value.split(",") if v]

    def _set_history(self, name: str, history: list[int]) -> None:
        self.client.set_registered_model_tag(name, _HISTORY, ",".join(map(str, history)))


def _quoted(name: str) -> str:
    return name.replace("'", "''")


def _version(mv: Any, aliases: Mapping[str, int]) -> ModelVersion:
    tags = dict(mv.tags or {})
    own = {k[len(_OWN):]: tags.pop(k) for k in list(tags) if k.startswith(_OWN)}
    lineage = {k: own[k] for k in _LINEAGE_KEYS if k in own}
    version = int(mv.version)
    created = dt.datetime.fromtimestamp(mv.creation_timestamp / 1e3, dt.timezone.utc)
    return ModelVersion(mv.name, version, mv.source, own.get("config", ""), own.get("sha256", ""), created,
                        tuple(sorted(a for a, v in aliases.items() if v == version)), tags, lineage)
