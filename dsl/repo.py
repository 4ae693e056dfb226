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
from dsl.source import EventSource


@dataclass
class Repository:
    entities: list[Entity] = field(default_factory=list)
    sources: list[EventSource] = field(default_factory=list)
    views: list[FeatureView] = field(default_factory=list)
    services: list[FeatureService] = field(default_factory=list)

    @classmethod
    def of(cls, objects: Iterable[object]) -> "Repository":
        """Collect definitions (and the entities/sources their views use) and validate them together."""
        repo = cls()
        for obj in objects:
            if isinstance(obj, FeatureView):
                repo._add(repo.views, obj)
                repo._add(repo.entities, obj.entity)
                repo._add(repo.sources, obj.source)
            elif isinstance(obj, Entity):
                repo._add(repo.entities, obj)
            elif isinstance(obj, EventSource):
                repo._add(repo.sources, obj)
            elif isinstance(obj, FeatureService):
                repo._add(repo.services, obj)
        repo.validate()
        return repo

    @staticmethod
    def _add(bucket: list, obj: object) -> None:
        if not any(existing is obj or existing == obj for existing in bucket):
            bucket.append(obj)

    def validate(self) -> None:
        for kind, bucket in (("entity", self.entities), ("source", self.sources), ("feature view", self.views),
                             ("feature service", self.services)):
            seen: set[str] = set()
            for obj in bucket:
                if obj.name in seen:
                    raise DuplicateNameError(f"{kind} `{obj.name}`", "is defined twice with different contents",
                                             f"rename one of the two {kind}s")
                seen.add(obj.name)
        for service in self.services:
            self.resolve_service(service)

    def view(self, name: str) -> FeatureView:
        for view in self.views:
            if view.name == name:
                return view
        raise UnknownReferenceError(f"feature view `{name}`", "is not defined",
                                    f"defined views: {', '.join(v.name for v in self.views) or 'none'}")

    def service(self, name: str) -> FeatureService:
        for service in self.services:
            if service.name == name:
                return service
        raise UnknownReferenceError(f"feature service `{name}`", "is not defined",
                                    f"defined services: {', '.join(s.name for s in self.services) or 'none'}")

    def resolve_service(self, service: FeatureService) -> list[FeatureRef]:
        """The service's features grouped per view, every name checked against the repo."""
        where = f"feature service `{service.name}`"
        refs = service.refs()
        for ref in refs:
            known = {v.name: v for v in self.views}
            if ref.view not in known:
                raise UnknownReferenceError(where, f"names unknown feature view `{ref.view}`",
                                            f"defined views: {', '.join(known) or 'none'}")
            missing = [f for f in ref.features if f not in known[ref.view].feature_names]
            if missing:
                raise UnknownReferenceError(where, f"names unknown feature `{ref.view}:{missing[0]}`",
                                            f"`{ref.view}` has: {', '.join(known[ref.view].feature_names)}")
        return refs


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
        module_name = f"featurectl_repo_{digest}_{file.stem}"
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
