"""Request plans: which Redis hashes and fields a request reads, and how the replies become columns.

Views that share an entity live in the same Redis hash (the key depends only on the entity and the project), so a
plan reads each entity's hash once with one HMGET of every requested field of every view plus their `_ts`
fields: one command per entity row, whatever the number of views. Plans are built once per feature list (or
service) and catalog version; the constant parts of each command are packed then.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Optional, Sequence

from common.errors import shown
from dsl.types import ValueType
from redis_store.decode import ColumnDecoder, column_decoder
from redis_store.layout import KeyEncoder
from serving.catalog import Catalog, ViewSpec
from serving.errors import RequestError, UnknownFeatureError, UnknownServiceError, VersionConflictError

_LENGTH_PREFIX = [b"$%d\r\n" % n for n in range(512)]


def _bulk(data: bytes) -> bytes:
    return (_LENGTH_PREFIX[len(data)] if len(data) < 512 else b"$%d\r\n" % len(data)) + data + b"\r\n"


@dataclass
class TypeBatch:
    """Features of one view sharing a decoder: their values over all rows are decoded in one call."""

    decode: ColumnDecoder
    positions: list[int]  # in the group's field list
    names: list[str]  # output names
    pick: Callable[[Sequence], Sequence[Any]] = field(init=False, repr=False)  # one row's values of the batch

    def __post_init__(self) -> None:
        if len(self.positions) == 1:
            position = self.positions[0]
            self.pick = lambda row: (row[position],)
        else:
            self.pick = itemgetter(*self.positions)


@dataclass
class ViewRead:
    """The requested features of one view inside a group's field list."""

    view: ViewSpec
    ts_pos: int
    batches: list[TypeBatch]
    names: list[str]  # output names of the view's requested features


@dataclass
class GroupRead:
    """Views sharing one entity: one HMGET per entity row reads all their fields."""

    encoder: KeyEncoder
    head: bytes  # "*N\r\n$5\r\nHMGET\r\n"
    tail: bytes  # "\r\n" then every field, packed
    views: list[ViewRead]

    def commands(self, keys: list[bytes]) -> list[bytes]:
        head, tail, prefix = self.head, self.tail, _LENGTH_PREFIX
        return [head + (prefix[len(key)] if len(key) < 512 else b"$%d\r\n" % len(key)) + key + tail
                for key in keys]


@dataclass
class Plan:
    catalog_version: int
    join_keys: dict[str, ValueType]  # every join key the entity rows must carry
    names: list[str]  # output feature names, in request order
    kinds: dict[str, Optional[ValueType]]  # of every output column, join keys included
    groups: list[GroupRead]
    service: Optional[str]


def _parse_ref(ref: str, catalog: Catalog) -> tuple[ViewSpec, str]:
    if not isinstance(ref, str) or ":" not in ref:
        raise UnknownFeatureError(f"feature reference {shown(ref)} is not of the form `view:feature`, "
                                  f"e.g. `asset_activity:views_1h`")
    view_name, feature = ref.split(":", 1)
    view = catalog.views.get(view_name)
    if view is None:
        hint = difflib.get_close_matches(view_name, list(catalog.views), n=1)
        known = ", ".join(sorted(catalog.views)) or "none (run `featurectl apply`)"
        raise UnknownFeatureError(f"unknown feature view `{view_name}` in `{ref}`"
                                  + (f"; did you mean `{hint[0]}`?" if hint else f"; known views: {known}"))
    if feature not in view.features:
        hint = difflib.get_close_matches(feature, list(view.features), n=1)
        raise UnknownFeatureError(f"feature view `{view_name}` has no feature `{feature}`"
                                  + (f"; did you mean `{view_name}:{hint[0]}`?" if hint else ""))
    if view.conflict:
        raise VersionConflictError(view.conflict)
    return view, feature


def resolve(catalog: Catalog, features: Sequence[str] | str) -> tuple[list[str], Optional[str]]:
    """Feature refs of a request: a list of `view:feature`, or the name of a feature service."""
    if isinstance(features, str):
        refs = catalog.services.get(features)
        if refs is None:
            hint = difflib.get_close_matches(features, list(catalog.services), n=1)
            raise UnknownServiceError(f"unknown feature service `{features}`"
                                      + (f"; did you mean `{hint[0]}`?" if hint else
                                         f"; known services: {', '.join(sorted(catalog.services)) or 'none'}"))
        return list(refs), features
    if not features:
        raise RequestError("no features requested: pass a list of `view:feature` references or a service name")
    return list(features), None


def build_plan(catalog: Catalog, features: Sequence[str] | str, full_feature_names: bool = False) -> Plan:
    refs, service = resolve(catalog, features)
    by_view: dict[str, tuple[ViewSpec, list[str]]] = {}
    for ref in refs:
        view, feature = _parse_ref(ref, catalog)
        wanted = by_view.setdefault(view.name, (view, []))[1]
        if feature in wanted:
            raise RequestError(f"feature `{ref}` is requested twice; list each feature once")
        wanted.append(feature)

    names, kinds, owner = [], {}, {}
    for ref in refs:
        view, feature = _parse_ref(ref, catalog)
        name = f"{view.name}__{feature}" if full_feature_names else feature
        if name in owner:
            raise RequestError(f"feature name `{feature}` is requested from views `{owner[name]}` and `{view.name}`; "
                               "pass full_feature_names=true to tell them apart")
        owner[name] = view.name
        names.append(name)
        kinds[name] = view.features[feature].kind

    groups: dict[tuple, list[tuple[ViewSpec, list[str]]]] = {}
    join_keys: dict[str, ValueType] = {}
    for view, wanted in by_view.values():
        groups.setdefault(view.join_keys, []).append((view, wanted))
        for key, kind in view.join_keys:
            if join_keys.setdefault(key, kind) is not kind:
                raise RequestError(f"join key `{key}` has type {join_keys[key].value} in one view and "
                                   f"{kind.value} in `{view.name}`; request these views separately")
    plan_groups = [_group(catalog.project, keys, members, full_feature_names) for keys, members in groups.items()]
    join_keys = dict(sorted(join_keys.items()))
    return Plan(catalog.version, join_keys, names, {**join_keys, **kinds}, plan_groups, service)


def _group(project: str, join_keys: tuple, members: list, full_feature_names: bool) -> GroupRead:
    fields: list[bytes] = []
    views = []
    for view, wanted in members:
        by_decoder: dict[ColumnDecoder, tuple[list[int], list[str]]] = {}
        for feature in wanted:
            positions, names = by_decoder.setdefault(column_decoder(view.features[feature].kind), ([], []))
            positions.append(len(fields))
            names.append(f"{view.name}__{feature}" if full_feature_names else feature)
            fields.append(view.features[feature].field)
        fields.append(view.ts_field)
        batches = [TypeBatch(decode, positions, names) for decode, (positions, names) in by_decoder.items()]
        views.append(ViewRead(view, len(fields) - 1, batches, [name for batch in batches for name in batch.names]))
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
    tail = b"\r\n" + b"".join(_bulk(f) for f in fields)
    return GroupRead(KeyEncoder(project, dict(join_keys)), head, tail, views)
