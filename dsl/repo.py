"""A repository of definitions: collected from a folder of Python files, checked as a whole."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from dsl.duration import MAX_DAYS
from dsl.entity import Entity
from dsl.errors import DefinitionError, DuplicateNameError, UnknownReferenceError
from dsl.feature_view import FeatureRef, FeatureService, FeatureView
from dsl.on_demand import OnDemandView, RequestFields
from dsl.portable import REPO_MODULE_PREFIX
from dsl.source import EventSource


@dataclass
class Repository:
    entities: list[Entity] = field(default_factory=list)
    sources: list[EventSource] = field(default_factory=list)
    views: list[FeatureView] = field(default_factory=list)
    services: list[FeatureService] = field(default_factory=list)
    on_demand: list[OnDemandView] = field(default_factory=list)

    @classmethod
    def of(cls, objects: Iterable[object]) -> "Repository":
        """Collect definitions (and the entities/sources their views use) and validate them together."""
        repo = cls()
        for obj in objects:
            if isinstance(obj, OnDemandView):
                repo._add(repo.on_demand, obj)
                for ref in obj.stored_inputs:
                    repo._add_view(ref.of)
            elif isinstance(obj, FeatureView):
                repo._add_view(obj)
            elif isinstance(obj, Entity):
                repo._add(repo.entities, obj)
            elif isinstance(obj, EventSource):
                repo._add(repo.sources, obj)
            elif isinstance(obj, FeatureService):
                repo._add(repo.services, obj)
        repo.validate()
        return repo

    def _add_view(self, view: FeatureView) -> None:
        self._add(self.views, view)
        self._add(self.entities, view.entity)
        self._add(self.sources, view.source)

    @staticmethod
    def _add(bucket: list, obj: object) -> None:
        if not any(existing is obj or existing == obj for existing in bucket):
            bucket.append(obj)

    def validate(self) -> None:
        for kind, bucket in (("entity", self.entities), ("source", self.sources), ("feature view", self.views),
                             ("on-demand view", self.on_demand), ("feature service", self.services)):
            seen: set[str] = set()
            for obj in bucket:
                if obj.name in seen:
                    raise DuplicateNameError(f"{kind} `{obj.name}`", "is defined twice with different contents",
                                             f"rename one of the two {kind}s")
                seen.add(obj.name)
        self._validate_on_demand()
        for service in self.services:
            self.resolve_service(service)

    def _validate_on_demand(self) -> None:
        """On-demand views share the feature views' names (`view:feature` names either); their request fields
        become Feast data sources, beside each view's `{view}_offline` and `{view}_push`."""
        views = {v.name for v in self.views}
        taken = {f"{name}_{suffix}" for name in views for suffix in ("offline", "push")}
        request: dict[str, RequestFields] = {}
        for odfv in self.on_demand:
            if odfv.name in views:
                raise DuplicateNameError(f"on-demand view `{odfv.name}`", "has the name of a feature view",
                                         "rename one of the two")
            for source in odfv.request_sources:
                if request.setdefault(source.name, source) != source or source.name in taken:
                    raise DuplicateNameError(f"request fields `{source.name}`", "are defined twice with different "
                                             "contents, or take the name of a view's Feast source",
                                             "rename one of them")

    def on_demand_view(self, name: str) -> OnDemandView:
        return _named(self.on_demand, "on-demand view", name, "on-demand views")

    def view(self, name: str) -> FeatureView:
        return _named(self.views, "feature view", name, "views")

    def service(self, name: str) -> FeatureService:
        return _named(self.services, "feature service", name, "services")

    def resolve_service(self, service: FeatureService) -> list[FeatureRef]:
        """The service's features grouped per view, every name checked against the repo."""
        where = f"feature service `{service.name}`"
        refs = service.refs()
        for ref in refs:
            known = {v.name: v for v in [*self.views, *self.on_demand]}
            if ref.view not in known:
                raise UnknownReferenceError(where, f"names unknown feature view `{ref.view}`",
                                            f"defined views: {', '.join(known) or 'none'}")
            missing = [f for f in ref.features if f not in known[ref.view].feature_names]
            if missing:
                raise UnknownReferenceError(where, f"names unknown feature `{ref.view}:{missing[0]}`",
                                            f"`{ref.view}` has: {', '.join(known[ref.view].feature_names)}")
        return refs


def _named(bucket: list, kind: str, name: str, plural: str):
    for obj in bucket:
        if obj.name == name:
            return obj
    raise UnknownReferenceError(f"{kind} `{name}`", "is not defined",
                                f"defined {plural}: {', '.join(o.name for o in bucket) or 'none'}")


def load_repo(path: Path | str) -> Repository:
    """Import every `*.py` file of the folder (not starting with `_`) and collect what they define."""
    folder = Path(path)
    files = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if not files:
        raise DefinitionError(f"feature repo {folder.resolve()}", "holds no Python definition files",
                              "add a features.py that defines entities, sources and feature views")
    objects: list[object] = []
    for file in files:
        digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
        module_name = f"{REPO_MODULE_PREFIX}{digest}_{file.stem}"
        spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except OverflowError as exc:  # e.g. timedelta(days=99999999999), before any definition can check it
            raise _overflow_error(file, exc) from None
        objects.extend(vars(module).values())
    return Repository.of(objects)


def _overflow_error(file: Path, exc: OverflowError) -> DefinitionError:
    """A number too large for Python itself in a definition file, reported at its line."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(file)]
    where = f"feature repo file {file.name}" + (f", line {lines[-1]}" if lines else "")
    return DefinitionError(where, f"a number is too large ({exc})",
                           f"durations are at most {MAX_DAYS}d (100 years): write e.g. ttl=\"7d\" or "
                           "timedelta(days=7)")
