"""A view's definition as plain data, its version, and the fields that changed between two definitions.

The **version** fingerprints what a view's offline and online values depend on: its compiled tile query (filters,
aggregations, tile, join keys, column types), its tile columns, its window specs (names, lengths, output types)
and the history folder it reads. Two definitions of one version compute the same values from the same events,
so a change of version is what makes backfilled ranges stale; a description or a tag is not in it, nor is the ttl
of a view without Attributes (an Attribute is `last` over the ttl: its window's length is in it).

The **definition** is the view as its author wrote it, as JSON-ready data: `featurectl apply` stores it, and
`featurectl plan` compares it field by field with what the repo compiles to now (`changes`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from dsl.compile_flink import CompiledView
from dsl.duration import format_duration
from dsl.feature_view import FeatureView
from dsl.features import Aggregation

VERSION_CHARS = 12


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # a field one side of a change does not have


def view_version(view: FeatureView, compiled: CompiledView) -> str:
    """The view's version: a hash of what its values depend on (see the module docstring)."""
    fingerprint = {
        "tile_query": compiled.tile_query,
        "tile_columns": [[c.name, c.sql_type] for c in compiled.tile_columns],
        "windows": [[w.name, w.op, w.kind.value, w.tiles, dict(w.partials)] for w in compiled.windows],
        "keys": [[k, t.value] for k, t in zip(compiled.key_columns, compiled.key_types)],
        "tile_ms": compiled.tile_ms,
        "history": view.source.path or view.source.name,
    }
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:VERSION_CHARS]


def _features(view: FeatureView) -> dict[str, dict]:
    """Features keyed by what stays put when a window changes: an aggregation's name, an attribute's feature."""
    types = view.output_schema()
    out: dict[str, dict] = {}
    for feature in view.features:
        if isinstance(feature, Aggregation):
            key = feature.base_name
            spec = {"op": feature.op, "column": feature.column, "windows": [w.label for w in feature.parsed_windows],
                    "filter": feature.filter_sql, "type": types[feature.feature_names[0]].value}
        else:
            key = feature.feature_names[0]
            spec = {"op": "attribute", "column": feature.column, "type": types[key].value}
        spec["description"] = feature.description
        out[key if key not in out else f"{key} (attribute)"] = spec
    return out


def view_definition(view: FeatureView) -> dict[str, Any]:
    """The view as written, as JSON data (lists, not tuples, so it equals itself read back from JSON)."""
    source = view.source
    data = {
        "entity": {"name": view.entity.name, "join_keys": {k: t.value for k, t in view.entity.join_keys.items()}},
        "source": {"name": source.name, "history": source.path or source.name, "kafka_topic": source.kafka_topic,
                   "timestamp_field": source.timestamp_field,
                   "watermark_delay": format_duration(source.watermark_delay),
                   "allowed_lateness": format_duration(source.allowed_lateness)},
        "columns": {c: source.schema[c].value for c in view.columns_read},
        "tile": format_duration(view.tile),
        "ttl": format_duration(view.ttl),
        "online": view.online,
        "offline": view.offline,
        "description": view.description,
        "owner": view.owner,
        "tags": dict(view.tags),
        "features": _features(view),
    }
    if view.expectations:  # only when there are some: definitions recorded before them stay equal
        data["expectations"] = [e.spec() for e in view.expectations]
    return json.loads(json.dumps(data))


@dataclass(frozen=True)
class Change:
    """One field that differs: `path` like `features.views.filter`; `old` or `new` is MISSING when absent."""

    path: str
    old: Any
    new: Any

    def __str__(self) -> str:
        if self.old is MISSING:
            return f"{self.path}: added ({_shown(self.new)})"
        if self.new is MISSING:
            return f"{self.path}: removed (was {_shown(self.old)})"
        if isinstance(self.old, list) and isinstance(self.new, list) and max(len(self.old), len(self.new)) > 4:
            edits = [f"-{_shown(x)}" for x in self.old if x not in self.new]
            edits += [f"+{_shown(x)}" for x in self.new if x not in self.old]
            return f"{self.path}: {' '.join(edits) or 'reordered'}"
        return f"{self.path}: {_shown(self.old)} -> {_shown(self.new)}"


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_shown(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    if value is None:
        return "none"
    if value == "":
        return '""'
    return str(value)


def changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[Change]:
    """The leaves that differ between two definitions (or any two nested dicts), in the order of `old` then the
    keys only `new` has; a sub-dict on one side only is one change."""
    out: list[Change] = []
    for key in [*old, *(k for k in new if k not in old)]:
        before, after = old.get(key, MISSING), new.get(key, MISSING)
        if isinstance(before, dict) and isinstance(after, dict):
            out.extend(changes(before, after, f"{prefix}{key}."))
        elif before != after:
            out.append(Change(f"{prefix}{key}", before, after))
    return out
