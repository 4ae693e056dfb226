"""What `featurectl apply` does to the registry, worked out from our side: each object it creates, updates or
deletes, with the fields that change; for a view also its version before and after, and the backfilled ranges
that a new version leaves stale (the exact `featurectl backfill` commands that recompute them).

A view is compared by its definition as `apply` recorded it (`common.version_log`) against what the repo
compiles to now, so a changed filter or window shows even though Feast's objects look alike. Entities, data
sources, services, and views with no recorded definition are compared by their Feast fields, never by Feast's
metadata (creation times), which made Feast's own diff report unchanged views as updated.

On-demand views the DSL defines are compared by their Feast fields, their function's registered text included,
and deleted once the repo no longer defines them; they carry the tag `featurectl.mode`. On-demand views without
it and stream feature views, which only Feast's SDK makes, are left alone, with the data sources and entities
they read and the services that serve them: if `apply` deleted them a Feast user could never keep one beside
featurectl's views. `plan` lists them as left alone, not as deleted.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from batch.backfill_log import BackfillLog, VersionedSpan
from common.errors import FeaturectlError
from common.version_log import AppliedVersion, VersionLog
from dsl.compile_repo import CompiledRepo
from dsl.duration import format_duration
from dsl.view_version import Change, changes, view_definition, view_version

ENTITY, SOURCE, VIEW, SERVICE = "entity", "data source", "feature view", "feature service"
ON_DEMAND = "on demand feature view"
OURS = "featurectl.mode"  # the tag of the on-demand views the DSL compiles (`dsl.compile_feast`)
NO_RECORD = ("no definition recorded by `featurectl apply` (registered by an earlier featurectl or through "
             "Feast's SDK): Feast fields compared")


@dataclass
class ObjectPlan:
    kind: str
    name: str
    action: str  # create | update | delete
    changes: list[Change] = field(default_factory=list)
    versions: tuple[Optional[str], Optional[str]] = (None, None)  # a view's, before and after
    stale: list[VersionedSpan] = field(default_factory=list)  # a view's backfilled parts of another version
    note: str = ""


@dataclass
class RepoPlan:
    objects: list[ObjectPlan] = field(default_factory=list)
    to_delete: list = field(default_factory=list)  # the Feast objects `apply` deletes
    to_record: dict[str, tuple[str, dict]] = field(default_factory=dict)  # view -> (version, definition)
    left_alone: list[str] = field(default_factory=list)  # what they are, for people
    kept: set[str] = field(default_factory=set)  # the names of what is left alone
    warnings: list[str] = field(default_factory=list)

    @property
    def removed_views(self) -> list[str]:
        return [o.name for o in self.objects if o.kind == VIEW and o.action == "delete"]


def _tags(obj: Any) -> dict:
    return dict(obj.tags or {})


def _entity_fields(entity: Any) -> dict:
    return {"join_key": entity.join_key, "value_type": entity.value_type.name, "description": entity.description,
            "tags": _tags(entity)}


def _source_fields(source: Any) -> dict:
    kafka = getattr(source, "kafka_options", None)
    stream = {} if kafka is None else {
        "topic": kafka.topic, "bootstrap_servers": kafka.kafka_bootstrap_servers,
        "watermark_delay": format_duration(kafka.watermark_delay_threshold) if kafka.watermark_delay_threshold
        else "none", "message_schema": getattr(kafka.message_format, "schema_json", None)}
    return {"type": type(source).__name__, "path": getattr(source, "path", None),
            "timestamp_field": getattr(source, "timestamp_field", None),
            "batch_source": getattr(getattr(source, "batch_source", None), "name", None),
            "schema": {f.name: str(f.dtype) for f in getattr(source, "schema", None) or []}, **stream,
            "description": source.description, "tags": _tags(source)}


def _view_fields(view: Any) -> dict:
    return {"entities": sorted(view.entities), "features": {f.name: str(f.dtype) for f in view.features},
            "ttl": format_duration(view.ttl) if view.ttl else "none", "online": view.online,
            "source": view.stream_source.name if view.stream_source else None,
            "offline_table": getattr(view.batch_source, "path", None), "description": view.description,
            "owner": view.owner, "tags": _tags(view)}


def _on_demand_fields(view: Any) -> dict:
    transformation = view.feature_transformation
    return {"inputs": {name: [f.name for f in p.features] for name, p in view.source_feature_view_projections.items()},
            "request_sources": sorted(view.source_request_sources), "mode": view.mode,
            "features": {f.name: str(f.dtype) for f in view.features},
            "transformation": getattr(transformation, "udf_string", None), "description": view.description,
            "owner": view.owner, "tags": _tags(view)}


def _service_fields(service: Any) -> dict:
    return {"features": {p.name_to_use(): [f.name for f in p.features] for p in service.feature_view_projections},
            "description": service.description, "owner": service.owner, "tags": _tags(service)}


FIELDS: dict[str, Callable[[Any], dict]] = {ENTITY: _entity_fields, SOURCE: _source_fields, VIEW: _view_fields,
                                            ON_DEMAND: _on_demand_fields, SERVICE: _service_fields}


class RegistryReadError(FeaturectlError, RuntimeError):
    """An object in the registry that Feast cannot read back; the message names it and the way out."""


@dataclass
class _Registered:
    """What the registry holds for the project, by kind and name, and what featurectl leaves alone in it."""

    objects: dict[str, dict[str, Any]]
    feast_only: list  # on-demand views the DSL did not compile, and stream feature views
    kept: dict[str, set[str]]  # kind -> names left alone with them

    @classmethod
    def read(cls, store: Any) -> "_Registered":
        on_demand = store.list_on_demand_feature_views()
        objects = {ENTITY: store.list_entities(), SOURCE: store.list_data_sources(), VIEW: store.list_feature_views(),
                   ON_DEMAND: [v for v in on_demand if OURS in _tags(v)], SERVICE: store.list_feature_services()}
        feast_only = [*(v for v in on_demand if OURS not in _tags(v)), *_stream_views(store)]
        names = {v.name for v in feast_only}
        kept = {ENTITY: {e for v in feast_only for e in getattr(v, "entities", [])},
                SOURCE: {s.name for v in feast_only for s in _sources_of(v)},
                SERVICE: {s.name for s in objects[SERVICE]
                          if any(p.name in names for p in s.feature_view_projections)}}
        return cls({kind: {o.name: o for o in found} for kind, found in objects.items()}, feast_only, kept)


def _stream_views(store: Any) -> list:
    """The stream feature views registered through Feast's SDK; a RegistryReadError naming them when Feast cannot
    read one back (a Python function that does not deserialize: Feast's own apply of it may have failed half-way)."""
    try:
        return store.list_stream_feature_views()
    except Exception as exc:  # Feast re-raises what unpickling the stored function raised
        names = sorted(v.spec.name for v in store.registry.proto().stream_feature_views
                       if v.spec.project == store.project)
        raise RegistryReadError(
            f"Feast cannot read back the stream feature views of project `{store.project}` ({', '.join(names)}): "
            f"{type(exc).__name__}: {exc}. Delete the broken one with Feast's SDK, e.g. `FeatureStore(repo_path="
            f"...).registry.delete_feature_view(NAME, {store.project!r}, commit=True)`, then run this again") from None


def _sources_of(feast_only: Any) -> list:
    """The data sources an on-demand view (its request sources) or a stream view (stream and batch) reads."""
    found = list(getattr(feast_only, "source_request_sources", {}).values())
    found += [s for s in (getattr(feast_only, "stream_source", None), getattr(feast_only, "batch_source", None)) if s]
    return found


def _reads(feast_only: Any) -> list[str]:
    """The feature views an on-demand view reads."""
    return list(getattr(feast_only, "source_feature_view_projections", {}))


def _compare(kind: str, wanted: list, registered: _Registered) -> list[ObjectPlan]:
    """Creates and updates of one kind of object compared by Feast fields (views have their own, below)."""
    current = registered.objects[kind]
    out = []
    for obj in wanted:
        if obj.name not in current:
            out.append(ObjectPlan(kind, obj.name, "create"))
        elif found := changes(FIELDS[kind](current[obj.name]), FIELDS[kind](obj)):
            out.append(ObjectPlan(kind, obj.name, "update", found))
    return out


def _deletes(kind: str, wanted: list, registered: _Registered) -> list[tuple[ObjectPlan, Any]]:
    names = {o.name for o in wanted} | registered.kept.get(kind, set())
    return [(ObjectPlan(kind, name, "delete"), obj) for name, obj in sorted(registered.objects[kind].items())
            if name not in names]


def _view_plan(view, compiled, feast_view, current, record: Optional[AppliedVersion]) -> Optional[ObjectPlan]:
    """The plan of one view of the repo, None when `apply` leaves it as it is."""
    version = view_version(view, compiled)
    if current is None:
        return ObjectPlan(VIEW, view.name, "create", versions=(None, version))
    if record is None or record.definition is None:
        return ObjectPlan(VIEW, view.name, "update", changes(_view_fields(current), _view_fields(feast_view)),
                          (None, version), note=NO_RECORD)
    found = changes(record.definition, view_definition(view))
    if not found and record.version == version:
        feast_changes = changes(_view_fields(current), _view_fields(feast_view))
        if not feast_changes:
            return None
        return ObjectPlan(VIEW, view.name, "update", feast_changes, (version, version),
                          note="registered differently (through Feast's SDK?): Feast fields compared")
    note = "" if found else _same_definition_note(record.definition, view_definition(view))
    return ObjectPlan(VIEW, view.name, "update", found, (record.version, version), note=note)


def _same_definition_note(old: dict, new: dict) -> str:
    """Why a view whose definition compares equal (features are compared by name) has a new version."""
    before, after = list(old.get("features", {})), list(new.get("features", {}))
    if before != after and sorted(before) == sorted(after):
        return (f"features reordered: {', '.join(before)} -> {', '.join(after)} (the compiled query's columns follow "
                "their order, so the version changes)")
    return "same definition, other compiled SQL (another featurectl release)"


def _stale_spans(plan: ObjectPlan, backfill_log: BackfillLog, project: str) -> list[VersionedSpan]:
    """Backfilled parts that the view's new version does not hold: of another version, or of an unrecorded one
    when the version is known to change."""
    before, after = plan.versions
    if before == after:
        return []
    return [s for s in backfill_log.versions(project, plan.name)
            if s.version != after and (s.version is not None or before is not None)]


def plan_repo(compiled: CompiledRepo, store: Any, version_log: VersionLog, backfill_log: BackfillLog,
              project: str) -> RepoPlan:
    """Everything `apply` would do to the registry of `project`; reads only."""
    registered = _Registered.read(store)
    feast = compiled.feast
    plan = RepoPlan()
    plan.objects += _compare(ENTITY, feast.entities, registered) + _compare(SOURCE, feast.data_sources, registered)
    applied = version_log.applied(project)
    for view, view_sql, feast_view in zip(compiled.repo.views, compiled.views, feast.feature_views):
        view_plan = _view_plan(view, view_sql, feast_view, registered.objects[VIEW].get(view.name),
                               applied.get(view.name))
        if view_plan is not None:
            view_plan.stale = _stale_spans(view_plan, backfill_log, project)
            plan.objects.append(view_plan)
            plan.to_record[view.name] = (view_plan.versions[1], view_definition(view))
    plan.objects += _compare(ON_DEMAND, feast.on_demand_views, registered)
    plan.objects += _compare(SERVICE, feast.feature_services, registered)
    wanted = {SERVICE: feast.feature_services, ON_DEMAND: feast.on_demand_views, VIEW: feast.feature_views,
              SOURCE: feast.data_sources, ENTITY: feast.entities}
    for kind, objects in wanted.items():
        for object_plan, obj in _deletes(kind, objects, registered):
            plan.objects.append(object_plan)
            plan.to_delete.append(obj)
    _left_alone(plan, registered, {kind: {o.name for o in objects} for kind, objects in wanted.items()})
    return plan


def _left_alone(plan: RepoPlan, registered: _Registered, wanted: dict[str, set[str]]) -> None:
    deleted = set(plan.removed_views)
    for obj in registered.feast_only:
        kind = "on demand feature view" if hasattr(obj, "source_request_sources") else "stream feature view"
        reads = _reads(obj)
        plan.left_alone.append(f"{kind} {obj.name}" + (f" (reads {', '.join(reads)})" if reads else ""))
        for name in sorted(deleted & set(reads)):
            plan.warnings.append(f"{kind} `{obj.name}` reads feature view `{name}`, which apply deletes: it will "
                                 f"fail until you delete it with Feast's SDK or define `{name}` again")
    plan.kept = {obj.name for obj in registered.feast_only}
    for kind in (SERVICE, SOURCE, ENTITY):
        names = sorted(n for n in registered.kept[kind] if n in registered.objects[kind] and n not in wanted[kind])
        plan.left_alone += [f"{kind} {name}" for name in names]
        plan.kept.update(names)


def backfill_command(start: dt.datetime, end: dt.datetime, view: str, cli: str = "featurectl") -> str:
    """The command that recomputes [start, end) of `view`'s offline table; `cli` may carry global options."""
    def instant(value: dt.datetime) -> str:
        return value.isoformat().replace("+00:00", "Z")

    return f"{cli} backfill --start {instant(start)} --end {instant(end)} --view {view}"


_VERBS = {"plan": {"create": "would create", "update": "would update", "delete": "would delete"},
          "apply": {"create": "created", "update": "updated", "delete": "deleted"}}
_MARKS = {"create": "+", "update": "~", "delete": "-"}


def _view_lines(obj: ObjectPlan, cli: str) -> list[str]:
    lines = []
    before, after = obj.versions
    if obj.action == "update" and before == after:
        lines.append("    offline values unchanged: no re-backfill needed")
    if obj.stale:
        lines.append("    offline values change: re-backfill the ranges other versions wrote (`materialize` refuses "
                     "those of a recorded other version until then):")
        lines += [f"      {backfill_command(s.start, s.end, obj.name, cli)}   # version {s.version or 'not recorded'}"
                  for s in obj.stale]
    return lines


def render(plan: RepoPlan, mode: str, cli: str = "featurectl") -> list[str]:
    """The plan as lines, `mode` `plan` (what apply would do) or `apply` (what it did); `cli` starts the commands
    it prints (the global options of the run that asked)."""
    lines = []
    for obj in plan.objects:
        head = f"{_MARKS[obj.action]} {_VERBS[mode][obj.action]} {obj.kind} {obj.name}"
        if obj.kind == VIEW and obj.action != "delete":
            before, after = obj.versions
            head += f", version {after}" if before in (None, after) else f", version {before} -> {after}"
        lines.append(head + (f": {obj.note}" if obj.note else ""))
        lines += [f"    {change}" for change in obj.changes]
        if obj.kind == VIEW:
            lines += _view_lines(obj, cli)
    if not plan.objects:
        lines.append("no changes")
    if plan.left_alone:
        lines.append("left alone (registered through Feast's SDK; the DSL does not define them): "
                     + "; ".join(plan.left_alone))
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines
