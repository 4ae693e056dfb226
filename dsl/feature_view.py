"""Feature views (entity + source + features + ttl) and feature services (features grouped for a model)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Mapping, Optional, Sequence

from dsl import aggregates
from dsl.duration import format_duration, parse_duration
from dsl.entity import Entity
from dsl.errors import (DefinitionError, DuplicateNameError, TypeMismatchError, UnknownColumnError,
                        UnknownReferenceError, WindowError, backticked)
from dsl.expectations import Expectation, check_expectations
from dsl.feature_logging import FeatureLogging
from dsl.features import Aggregation, Attribute, Feature, Window
from dsl.names import check_name
from dsl.source import RESERVED_COLUMNS, EventSource
from dsl.types import FeatureType, ValueType, Vector


@dataclass(frozen=True)
class FeatureRef:
    """Some features of one view, as a feature service lists them: `view[["a", "b"]]` or `"view:a"`. `of` is the
    view itself when the reference was made from it (an on-demand view reads its inputs' types there)."""

    view: str
    features: tuple[str, ...]
    of: Optional["FeatureView"] = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class FeatureView:
    """Features of one entity computed from one source.

    `tile` is the granularity of the partial aggregates behind every window: windows must be whole multiples of
    it, and served values move in steps of one tile. `ttl` bounds how old a value may be and still be served.
    `expectations` (`dsl.expectations`) are checked on every backfill's rows; a failure stops `materialize`.
    """

    name: str
    entity: Entity
    source: EventSource
    features: Sequence[Feature]
    ttl: str | timedelta = "7d"
    tile: str | timedelta = "1m"
    online: bool = True
    offline: bool = True
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    expectations: Sequence[Expectation] = ()

    def __post_init__(self) -> None:
        where = f"feature view {backticked(self.name)}"
        check_name(where, "name", self.name)
        if not isinstance(self.entity, Entity):
            raise DefinitionError(where, f"entity must be an Entity, got {type(self.entity).__name__}")
        if not isinstance(self.source, EventSource):
            raise DefinitionError(where, f"source must be an EventSource, got {type(self.source).__name__}")
        if not self.features:
            raise DefinitionError(where, "has no features", "add Aggregation(...) or Attribute(...) entries")
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "ttl", parse_duration(self.ttl, f"{where} ttl"))
        object.__setattr__(self, "tile", parse_duration(self.tile, f"{where} tile"))
        self._check_join_keys(where)
        if any(isinstance(f, Attribute) for f in self.features):
            self._check_attribute_ttl(where)
        names: dict[str, str] = {}
        for feature in self.features:
            self._check_feature(feature, where)
            for feature_name in feature.feature_names:
                if feature_name in RESERVED_COLUMNS:
                    raise DefinitionError(where, f"feature name `{feature_name}` is reserved for the offline table",
                                          "give the feature another name=\"...\"")
                if feature_name in self.entity.join_keys:
                    raise DuplicateNameError(where, f"feature name `{feature_name}` is a join key of entity "
                                             f"`{self.entity.name}` (the offline table and Feast keep both in one "
                                             "row)", "give the feature another name=\"...\"")
                if feature_name in names:
                    raise DuplicateNameError(where, f"feature name `{feature_name}` is used twice",
                                             "give one of the aggregations another name=\"...\"")
                names[feature_name] = feature_name
        if len(self.vector_features) > 1:
            raise DefinitionError(where, f"has {len(self.vector_features)} Vector features "
                                  f"({', '.join(self.vector_features)}): Feast indexes one vector feature per view",
                                  "declare each vector in a feature view of its own")
        object.__setattr__(self, "expectations", tuple(self.expectations))
        check_expectations(where, self.expectations, self.output_schema())

    def _check_join_keys(self, where: str) -> None:
        schema = self.source.schema
        for key, kind in self.entity.join_keys.items():
            if key not in schema:
                raise UnknownColumnError(where, f"join key `{key}` of entity `{self.entity.name}` is not a column "
                                         f"of source `{self.source.name}`", f"add `{key}` to the source schema")
            if schema[key] is not kind:
                raise TypeMismatchError(where, f"join key `{key}` is {kind.value} in entity `{self.entity.name}` "
                                        f"but {schema[key].value} in source `{self.source.name}`",
                                        "declare the same type in both")

    def _check_feature(self, feature: Feature, where: str) -> None:
        schema = self.source.schema
        if isinstance(feature, Attribute):
            self._check_column(feature.column, where)
            return
        if not isinstance(feature, Aggregation):
            raise DefinitionError(where, f"feature {feature!r} is neither an Aggregation nor an Attribute")
        inner = f"{where}, aggregation `{feature.base_name}`"
        if feature.column is not None:
            self._check_column(feature.column, inner)
            kind = schema[feature.column]
            if isinstance(kind, Vector):
                raise TypeMismatchError(inner, f"`{feature.op}` over {kind.value} column `{feature.column}`",
                                        "a vector is served as it is: declare it as Attribute(\"" + feature.column
                                        + "\")")
            if aggregates.OPS[feature.op].numeric_only and not kind.is_numeric:
                raise TypeMismatchError(inner, f"`{feature.op}` over {kind.value} column `{feature.column}`",
                                        "use a numeric column, or count / approx_distinct / last for this one")
        if feature.filter is not None:
            if feature.filter.check(schema, inner) is not ValueType.BOOL:
                raise TypeMismatchError(inner, f"filter {feature.filter!r} is not a condition",
                                        "write a comparison such as col(\"event_type\") == \"view\"")
        for window in feature.parsed_windows:
            self._check_window(window, inner)

    def _check_column(self, column: str, where: str) -> None:
        if column not in self.source.schema:
            raise UnknownColumnError(where, f"unknown column `{column}` in source `{self.source.name}`",
                                     f"use one of: {', '.join(self.source.schema)}")

    def _check_attribute_ttl(self, where: str) -> None:
        """An Attribute is `last` over the ttl, counted in tiles: a ttl that is no whole number of tiles would
        serve a value longer or shorter than the ttl says."""
        ttl, tile = self.ttl, self.tile
        if ttl < tile or ttl % tile:
            raise WindowError(where, f"ttl {format_duration(ttl)} is not a whole number of tiles "
                              f"({format_duration(tile)}): an Attribute is the latest value within the ttl, counted "
                              "in tiles",
                              "pick a ttl that the tile divides, e.g. ttl=\"7d\" with tile=\"1h\"")

    def _check_window(self, window: Window, where: str) -> None:
        tile = self.tile
        if window.length < tile:
            raise WindowError(where, f"window `{window.label}` is shorter than the view's tile "
                              f"({format_duration(tile)})", "use a longer window or a smaller tile=\"...\" on the view")
        if window.length % tile:
            raise WindowError(where, f"window `{window.label}` is not a whole number of tiles "
                              f"({format_duration(tile)})", "pick a tile that divides every window, e.g. tile=\"1m\"")

    @property
    def aggregations(self) -> list[Aggregation]:
        return [f for f in self.features if isinstance(f, Aggregation)]

    @property
    def attributes(self) -> list[Attribute]:
        return [f for f in self.features if isinstance(f, Attribute)]

    @property
    def feature_names(self) -> list[str]:
        return [name for feature in self.features for name in feature.feature_names]

    @property
    def columns_read(self) -> list[str]:
        """The source columns the view's queries read, in order, each once: join keys, event time, then what each
        feature aggregates, keeps or filters on (the input checks need these and no others)."""
        columns = [*self.entity.join_keys, self.source.timestamp_field]
        for feature in self.features:
            if feature.column:
                columns.append(feature.column)
            if isinstance(feature, Aggregation) and feature.filter is not None:
                columns.extend(sorted(feature.filter.columns()))
        return list(dict.fromkeys(columns))

    def output_schema(self) -> dict[str, FeatureType]:
        """Served feature name -> type, in declaration order."""
        schema = self.source.schema
        out: dict[str, FeatureType] = {}
        for feature in self.features:
            if isinstance(feature, Attribute):
                out[feature.feature_names[0]] = schema[feature.column]
                continue
            kind = aggregates.output_type(feature.op, schema.get(feature.column) if feature.column else None)
            for name in feature.feature_names:
                out[name] = kind
        return out

    @property
    def max_window(self) -> timedelta:
        lengths = [w.length for a in self.aggregations for w in a.parsed_windows]
        return max(lengths) if lengths else self.tile

    @property
    def vector_features(self) -> dict[str, Vector]:
        """The view's vector features (indexed for nearest-neighbour search), by name."""
        return {name: kind for name, kind in self.output_schema().items() if isinstance(kind, Vector)}

    def __getitem__(self, names: Sequence[str]) -> FeatureRef:
        if isinstance(names, str):
            names = [names]
        missing = [n for n in names if n not in self.feature_names]
        if missing:
            raise UnknownReferenceError(f"feature view `{self.name}`", f"has no feature {', '.join(missing)}",
                                        f"pick from: {', '.join(self.feature_names)}")
        return FeatureRef(self.name, tuple(names), self)


@dataclass(frozen=True)
class FeatureService:
    """The features one model reads, from one or more views; resolved and checked by the repository. With
    `logging`, `featurectl serve` logs a sample of the vectors it serves for this service (see README)."""

    name: str
    features: Sequence[FeatureView | FeatureRef | str]  # on-demand views too (`dsl.on_demand`)
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    logging: FeatureLogging | None = None

    def __post_init__(self) -> None:
        where = f"feature service {backticked(self.name)}"
        check_name(where, "name", self.name)
        if not self.features:
            raise DefinitionError(where, "lists no features", "pass views or view[[\"feature\", ...]] entries")
        if self.logging is not None and not isinstance(self.logging, FeatureLogging):
            raise DefinitionError(where, f"logging must be a FeatureLogging, got {type(self.logging).__name__}",
                                  "write logging=FeatureLogging(sample_rate=0.1)")
        object.__setattr__(self, "features", tuple(self.features))

    def refs(self) -> list[FeatureRef]:
        """Entries as FeatureRefs; a whole view becomes all its features, "view:feature" one feature."""
        from dsl.on_demand import OnDemandView  # it builds on this module

        out: list[FeatureRef] = []
        for entry in self.features:
            if isinstance(entry, (FeatureView, OnDemandView)):
                out.append(FeatureRef(entry.name, tuple(entry.feature_names)))
            elif isinstance(entry, FeatureRef):
                out.append(entry)
            elif isinstance(entry, str) and entry.count(":") == 1:
                view, feature = entry.split(":")
                out.append(FeatureRef(view, (feature,)))
            else:
                raise UnknownReferenceError(f"feature service `{self.name}`", f"entry {entry!r} is not a feature",
                                            "write a view, view[[\"feature\"]] or \"view:feature\"")
        return out

