"""Request plans: which Redis hashes and fields a request reads, and how the replies become columns.

Views that share an entity live in the same Redis hash (the key depends only on the entity and the project), so a
plan reads each entity's hash once with one HMGET of every requested field of every view plus their `_ts`
fields: one command per entity row, whatever the number of views. Plans are built once per feature list (or
service) and catalog version; the constant parts of each command are packed then. An on-demand view adds the
stored features it reads to those HMGETs (under `view:feature` keys, never answered) and its request fields to
what the entity rows must carry; its features are computed after decoding (`serving.on_demand`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from common.errors import shown
from dsl.types import ValueType
from redis_store.decode import ColumnDecoder, column_decoder
from redis_store.layout import KeyEncoder
from serving.catalog import Catalog, ViewSpec
from serving.errors import RequestError, UnknownFeatureError, UnknownServiceError, VersionConflictError
from serving.on_demand import OnDemandRead, OnDemandSpec

if TYPE_CHECKING:
    from serving.row_answer import RowAnswer
    from serving.row_values import RowValues

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
    on_demand: list[OnDemandRead] = field(default_factory=list)
    request_fields: dict[str, Optional[ValueType]] = field(default_factory=dict)  # columns beside the join keys
    row_answer: Optional[RowAnswer] = field(default=None, repr=False)  # one row's JSON writer, made on first use
    row_values: Optional[RowValues] = field(default=None, repr=False)  # one row's SDK dict writer, made on first use


def _parse_ref(ref: str, catalog: Catalog) -> tuple[ViewSpec | OnDemandSpec, str]:
    if not isinstance(ref, str) or ":" not in ref:
        raise UnknownFeatureError(f"feature reference {shown(ref)} is not of the form `view:feature`, "
                                  f"e.g. `asset_activity:views_1h`")
    view_name, feature = ref.split(":", 1)
    view = catalog.views.get(view_name) or catalog.on_demand.get(view_name)
    if view is None:
        every = [*catalog.views, *catalog.on_demand]
        hint = difflib.get_close_matches(view_name, every, n=1)
        known = ", ".join(sorted(every)) or "none (run `featurectl apply`)"
        raise UnknownFeatureError(f"unknown feature view `{view_name}` in `{ref}`"
                                  + (f"; did you mean `{hint[0]}`?" if hint else f"; known views: {known}"))
    if feature not in view.features:
        hint = difflib.get_close_matches(feature, list(view.features), n=1)
        raise UnknownFeatureError(f"feature view `{view_name}` has no feature `{feature}`"
                                  + (f"; did you mean `{view_name}:{hint[0]}`?" if hint else ""))
    if isinstance(view, ViewSpec) and view.conflict:
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
    by_view: dict[str, tuple[ViewSpec | OnDemandSpec, list[str]]] = {}
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
        kinds[name] = view.features[feature].kind if isinstance(view, ViewSpec) else view.features[feature]

    stored = {n: (v, wanted) for n, (v, wanted) in by_view.items() if isinstance(v, ViewSpec)}
    hidden: set[tuple[str, str]] = set()  # stored features read only as on-demand inputs
    computed = [_on_demand_read(catalog, spec, wanted, stored, hidden, full_feature_names)
                for spec, wanted in by_view.values() if isinstance(spec, OnDemandSpec)]
    groups: dict[tuple, list[tuple[ViewSpec, list[str]]]] = {}
    join_keys: dict[str, ValueType] = {}
    for view, wanted in stored.values():
        groups.setdefault(view.join_keys, []).append((view, wanted))
        for key, kind in view.join_keys:
            if join_keys.setdefault(key, kind) is not kind:
                raise RequestError(f"join key `{key}` has type {join_keys[key].value} in one view and "
                                   f"{kind.value} in `{view.name}`; request these views separately")
    plan_groups = [_group(catalog.project, keys, members, full_feature_names, hidden)
                   for keys, members in groups.items()]
    join_keys = dict(sorted(join_keys.items()))
    return Plan(catalog.version, join_keys, names, {**join_keys, **kinds}, plan_groups, service, computed,
                _request_fields(computed, join_keys))


def _value_key(view: str, feature: str, hidden: set[tuple[str, str]], full_feature_names: bool) -> str:
    """Where a plan puts a stored feature's decoded values: its output name, or `view:feature` (which no output
    name can be) when it is only an on-demand input."""
    if (view, feature) in hidden:
        return f"{view}:{feature}"
    return f"{view}__{feature}" if full_feature_names else feature


def _on_demand_read(catalog: Catalog, spec: OnDemandSpec, wanted: list[str], stored: dict,
                    hidden: set[tuple[str, str]], full_feature_names: bool) -> OnDemandRead:
    """The read of one on-demand view; the stored features it needs join `stored` (unrequested ones: `hidden`)."""
    inputs: list[tuple[str, str]] = []
    for view_name, alias, features in spec.inputs:
        view = catalog.views.get(view_name)
        if view is None or any(f not in view.features for f in features):
            raise UnknownFeatureError(f"on-demand view `{spec.name}` reads features of `{view_name}` that the "
                                      "registry does not hold; run `featurectl apply`")
        if view.conflict:
            raise VersionConflictError(view.conflict)
        requested = stored.setdefault(view_name, (view, []))[1]
        for feature in features:
            if feature not in requested:
                requested.append(feature)
                hidden.add((view_name, feature))
            key = _value_key(view_name, feature, hidden, full_feature_names)
            inputs += [(feature, key), (f"{alias}__{feature}", key)]
    names = [f"{spec.name}__{f}" if full_feature_names else f for f in wanted]
    return OnDemandRead(spec, names, list(wanted), inputs)


def _request_fields(reads: list[OnDemandRead], join_keys: dict[str, ValueType]) -> dict[str, Optional[ValueType]]:
    fields: dict[str, Optional[ValueType]] = {}
    for read in reads:
        for name, kind in read.spec.request.items():
            if fields.setdefault(name, kind) is not kind or name in join_keys:
                raise RequestError(f"request field `{name}` of on-demand view `{read.spec.name}` has another type "
                                   "in another requested view, or is a join key; request these views separately")
    return fields


def _group(project: str, join_keys: tuple, members: list, full_feature_names: bool,
           hidden: set[tuple[str, str]]) -> GroupRead:
    fields: list[bytes] = []
    views = []
    for view, wanted in members:
        by_decoder: dict[ColumnDecoder, tuple[list[int], list[str]]] = {}
        for feature in wanted:
            positions, names = by_decoder.setdefault(column_decoder(view.features[feature].kind), ([], []))
            positions.append(len(fields))
            names.append(_value_key(view.name, feature, hidden, full_feature_names))
            fields.append(view.features[feature].field)
        fields.append(view.ts_field)
        batches = [TypeBatch(decode, positions, names) for decode, (positions, names) in by_decoder.items()]
        views.append(ViewRead(view, len(fields) - 1, batches, [name for batch in batches for name in batch.names]))
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2)
    tail = b"\r\n" + b"".join(_bulk(f) for f in fields)
    return GroupRead(KeyEncoder(project, dict(join_keys)), head, tail, views)
