"""On-demand views: features computed at request time from request fields and from stored features of views.

    prompt = RequestFields("prompt_request", {"prompt": String, "target_volume": Float64})

    @on_demand(sources=[asset_activity[["likes_24h", "views_24h"]], prompt], schema={"like_rate": Float64})
    def prompt_fit(inputs):
        return {"like_rate": inputs["likes_24h"] / np.maximum(inputs["views_24h"], 1) * inputs["target_volume"]}

The transformation's inputs are named by their short names (request fields and features alike), so they must be
unique across its sources. How it runs (modes, missing values, outputs) is `dsl.transform`'s; the function is
checked here, when the view is built: its source must travel (`dsl.portable`), and it runs once on a sample row
and once on a row whose stored inputs are missing (a new entity), returning every declared output.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from common.errors import shown
from dsl.errors import DefinitionError, DuplicateNameError, TypeMismatchError, UnknownReferenceError, backticked
from dsl.feature_view import FeatureRef, FeatureView
from dsl.names import check_name
from dsl.portable import check_plain_function, portable_source
from dsl.source import RESERVED_COLUMNS
from dsl.transform import INPUT_TYPES, MODES, OUTPUT_TYPES, OnDemandUdf, TransformationError, load_udf
from dsl.types import ValueType

REQUEST_TYPES = (ValueType.STRING, ValueType.INT64, ValueType.FLOAT64, ValueType.BOOL)
_REBUILD_HINT = "define it and what it reads at the top level of a repo file, as plain Python"
_SAMPLES = {ValueType.STRING: "a", ValueType.INT32: 1, ValueType.INT64: 1, ValueType.FLOAT32: 1.0,
            ValueType.FLOAT64: 1.0, ValueType.BOOL: True}


def _type_names(kinds: Sequence[ValueType]) -> str:
    return ", ".join(kind.value for kind in kinds)


def _check_field(where: str, what: str, name: object, kind: object, allowed: Sequence[ValueType]) -> None:
    check_name(where, what, name)
    if name in RESERVED_COLUMNS:  # the entity rows' time and the offline table's columns
        raise DefinitionError(where, f"{what} `{name}` is reserved", "give it another name")
    if not isinstance(kind, ValueType) or kind not in allowed:
        raise TypeMismatchError(where, f"{what} `{name}` has type {getattr(kind, 'value', kind)!r}",
                                f"use one of: {_type_names(allowed)}")


@dataclass(frozen=True)
class RequestFields:
    """Typed fields each request must carry for the on-demand views that read them: extra columns of the entity
    rows, online and in training sets (Feast's `RequestSource`). A missing one is a bad request."""

    name: str
    schema: Mapping[str, ValueType]
    description: str = ""

    def __post_init__(self) -> None:
        where = f"request fields {backticked(self.name)}"
        check_name(where, "name", self.name)
        if not isinstance(self.schema, Mapping) or not self.schema:
            raise DefinitionError(where, "declare no fields", "pass schema={\"prompt\": String, ...}")
        for name, kind in self.schema.items():
            _check_field(where, "field", name, kind, REQUEST_TYPES)
        object.__setattr__(self, "schema", dict(self.schema))


Source = RequestFields | FeatureRef | FeatureView


@dataclass(frozen=True)
class OnDemandView:
    """Features computed per request by `transformation` from `sources`; `schema` types its outputs.

    `mode="numpy"` (default) calls it once per request with a numpy array per input; `mode="python"` once per row
    with a dict of values (`dsl.transform` has the rules). Registered in Feast as an `OnDemandFeatureView`.
    """

    name: str
    sources: Sequence[Source]
    schema: Mapping[str, ValueType]
    transformation: Callable
    mode: str = "numpy"
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    udf: OnDemandUdf = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"on-demand view {backticked(self.name)}"
        check_name(where, "name", self.name)
        if self.mode not in MODES:
            raise DefinitionError(where, f"unknown mode {backticked(self.mode)}", f"use one of: {', '.join(MODES)}")
        if isinstance(self.sources, (str, FeatureRef, FeatureView, RequestFields)) or not self.sources:
            raise DefinitionError(where, "sources must be a non-empty list",
                                  "e.g. sources=[asset_activity[[\"likes_24h\"]], RequestFields(...)]")
        object.__setattr__(self, "sources", tuple(self._source(s, where) for s in self.sources))
        object.__setattr__(self, "tags", dict(self.tags))
        inputs = self._inputs(where)
        self._check_schema(where, inputs)
        check_plain_function(self.transformation, where)
        self._check_signature(where)
        text = portable_source(self.transformation, where)
        try:
            udf = load_udf(text, self.transformation.__name__, self.mode, {n: k.value for n, k in inputs.items()},
                           {n: k.value for n, k in self.schema.items()}, self.name)
        except Exception as exc:  # what another process would meet when it rebuilds the function
            raise DefinitionError(where, f"the transformation's source does not run on its own "
                                         f"({type(exc).__name__}: {exc})", _REBUILD_HINT) from None
        object.__setattr__(self, "udf", udf)
        self._try(where)

    @staticmethod
    def _source(source: object, where: str) -> Source:
        if isinstance(source, FeatureView):
            return source[source.feature_names]
        if isinstance(source, FeatureRef) and isinstance(source.of, FeatureView):
            return source
        if isinstance(source, RequestFields):
            return source
        raise DefinitionError(where, f"source {shown(source)} is not a view, view[[\"feature\", ...]] or RequestFields",
                              "name stored inputs through the view object, e.g. asset_activity[[\"likes_24h\"]], so "
                              "their types are known")

    def _inputs(self, where: str) -> dict[str, ValueType]:
        inputs: dict[str, ValueType] = {}
        origin: dict[str, str] = {}
        for source in self.sources:
            if isinstance(source, RequestFields):
                pairs, label = list(source.schema.items()), f"request fields `{source.name}`"
            else:
                types = source.of.output_schema()
                pairs, label = [(f, types[f]) for f in source.features], f"feature view `{source.view}`"
                for name, kind in pairs:
                    if kind not in INPUT_TYPES:
                        raise TypeMismatchError(where, f"input `{source.view}:{name}` has type {kind.value}",
                                                f"on-demand inputs are {_type_names(INPUT_TYPES)}")
            for name, kind in pairs:
                if name in origin:
                    raise DuplicateNameError(where, f"input `{name}` comes from both {origin[name]} and {label}",
                                             "inputs are named by their short names: rename one of them")
                inputs[name], origin[name] = kind, label
        if not inputs:
            raise DefinitionError(where, "reads no inputs", "list the features and request fields it reads")
        keys = self.join_keys
        clash = [name for name in inputs if name in keys and origin[name].startswith("request")]
        if clash:
            raise DuplicateNameError(where, f"request field `{clash[0]}` is a join key of an input view",
                                     "entity rows carry join keys and request fields side by side: rename it")
        return inputs

    def _check_schema(self, where: str, inputs: Mapping[str, ValueType]) -> None:
        if not isinstance(self.schema, Mapping) or not self.schema:
            raise DefinitionError(where, "declares no outputs", "pass schema={\"like_rate\": Float64, ...}")
        for name, kind in self.schema.items():
            _check_field(where, "output", name, kind, OUTPUT_TYPES)
            if name in inputs or name in self.join_keys:
                raise DuplicateNameError(where, f"output `{name}` has the name of an input or join key",
                                         "give the output another name")
        object.__setattr__(self, "schema", dict(self.schema))

    def _check_signature(self, where: str) -> None:
        try:
            inspect.signature(self.transformation).bind(object())
        except TypeError:
            what = "a dict of input arrays" if self.mode == "numpy" else "a dict of one row's values"
            raise DefinitionError(where, f"transformation `{self.transformation.__name__}` cannot be called with one "
                                         f"argument ({what})", "define it as `def name(inputs): ...`") from None

    def _try(self, where: str) -> None:
        """Run the transformation on a sample row, and on one whose stored inputs are missing."""
        sample = {name: [_SAMPLES[kind]] for name, kind in self.udf.inputs.items()}
        stored = {name for ref in self.stored_inputs for name in ref.features}
        for case, columns in (("a sample row", sample),
                              ("a row whose stored inputs are missing (a new entity)",
                               {name: [None] if name in stored else values for name, values in sample.items()})):
            try:
                self.udf.run(columns, 1)
            except TransformationError as exc:
                raise DefinitionError(where, f"on {case}: {exc}",
                                      "the transformation must return every output for any row") from None

    @property
    def feature_names(self) -> list[str]:
        return list(self.schema)

    @property
    def stored_inputs(self) -> list[FeatureRef]:
        return [s for s in self.sources if isinstance(s, FeatureRef)]

    @property
    def request_sources(self) -> list[RequestFields]:
        return [s for s in self.sources if isinstance(s, RequestFields)]

    @property
    def request_schema(self) -> dict[str, ValueType]:
        return {name: kind for source in self.request_sources for name, kind in source.schema.items()}

    @property
    def join_keys(self) -> dict[str, ValueType]:
        return {key: kind for ref in self.stored_inputs for key, kind in ref.of.entity.join_keys.items()}

    def __getitem__(self, names: Sequence[str]) -> FeatureRef:
        names = [names] if isinstance(names, str) else list(names)
        missing = [n for n in names if n not in self.schema]
        if missing:
            raise UnknownReferenceError(f"on-demand view `{self.name}`", f"has no feature {', '.join(missing)}",
                                        f"pick from: {', '.join(self.schema)}")
        return FeatureRef(self.name, tuple(names))


def on_demand(*, sources: Sequence[Source], schema: Mapping[str, ValueType], name: Optional[str] = None,
              mode: str = "numpy", description: str = "", owner: str = "",
              tags: Optional[Mapping[str, str]] = None) -> Callable[[Callable], OnDemandView]:
    """`@on_demand(sources=[...], schema={...})` over a function: an OnDemandView named after it (or `name`), its
    docstring the description unless one is given."""
    def wrap(fn: Callable) -> OnDemandView:
        return OnDemandView(name if name is not None else getattr(fn, "__name__", ""), sources, schema, fn, mode,
                            description or inspect.getdoc(fn) or "", owner, tags or {})

    return wrap
