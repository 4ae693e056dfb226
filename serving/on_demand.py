"""On-demand views online: what the catalog keeps of each, what a plan adds for it, and the one call per request
that computes its features over all rows once the Redis replies are decoded.

A view defined with featurectl's DSL carries an `OnDemandUdf` (`dsl.transform`): the function that training sets
and Feast's own SDK run too. A view defined with Feast's API runs as Feast runs it: "pandas" mode gets a DataFrame,
"python" mode a dict of lists (or one row at a time with `singleton`), each holding the join keys, the request
fields and every stored input under both `feature` and `view__feature`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from dsl.transform import OUTPUT_TYPES, OnDemandUdf, TransformationError, output_values
from dsl.types import ValueType
from serving.result import ViewRows

logger = logging.getLogger(__name__)

Runner = Callable[[Mapping[str, list], int], dict[str, list]]


@dataclass(frozen=True)
class OnDemandSpec:
    name: str
    features: dict[str, Optional[ValueType]]  # outputs; None: a Feast type outside the DSL, passed through
    inputs: tuple[tuple[str, str, tuple[str, ...]], ...]  # stored inputs: (view, its name in the view, features)
    request: dict[str, Optional[ValueType]]  # request fields, from the entity rows
    fingerprint: tuple  # mode and registered source: two specs that compare equal compute the same
    run: Runner = field(compare=False, repr=False)
    udf: Optional[OnDemandUdf] = field(default=None, compare=False, repr=False)  # featurectl's: its inputs typed


def on_demand_spec(odfv: Any, value_type: Callable[[Any], Optional[ValueType]]) -> Optional[OnDemandSpec]:
    """The spec of a Feast `OnDemandFeatureView` (its function rebuilt from the registry), or None, logged, when
    it cannot be served."""
    from feast.on_demand_feature_view import OnDemandFeatureView

    try:
        loaded = OnDemandFeatureView.from_proto(odfv.to_proto())  # listed without functions: each rebuilt alone
    except Exception as exc:  # a broken function must not take the other views down
        logger.error("on-demand view `%s` is not served: its transformation cannot be rebuilt (%s)", odfv.name, exc)
        return None
    transformation = loaded.feature_transformation
    if loaded.mode not in ("pandas", "python") or transformation is None:
        logger.error("on-demand view `%s` is not served: mode `%s` (featurectl serves pandas and python)",
                     odfv.name, loaded.mode)
        return None
    outputs = {f.name: value_type(f.dtype) for f in loaded.features}
    inputs = tuple((p.name, p.name_to_use(), tuple(f.name for f in p.features))
                   for p in loaded.source_feature_view_projections.values())
    request = {f.name: value_type(f.dtype) for source in loaded.source_request_sources.values()
               for f in source.schema}
    udf = transformation.udf
    fingerprint = (loaded.mode, loaded.singleton, transformation.udf_string or id(udf))
    if isinstance(udf, OnDemandUdf):
        return OnDemandSpec(loaded.name, outputs, inputs, request, fingerprint, udf.run, udf)
    run = _feast_runner(loaded.name, loaded.mode, loaded.singleton, udf, outputs)
    return OnDemandSpec(loaded.name, outputs, inputs, request, fingerprint, run)


def _feast_runner(view: str, mode: str, singleton: bool, udf: Callable, outputs: dict) -> Runner:
    """A function written for Feast, called the way Feast's SDK calls it."""
    def run(columns: Mapping[str, list], rows: int) -> dict[str, list]:
        try:
            if mode == "pandas":
                import pandas as pd

                result = udf(pd.DataFrame(dict(columns)))
            elif singleton:
                results = [udf({name: values[i] for name, values in columns.items()}) for i in range(rows)]
                result = {name: [r.get(name) for r in results] for name in outputs}
            else:
                result = udf(dict(columns))
            return {name: _column(view, name, result[name], kind, rows) for name, kind in outputs.items()}
        except TransformationError:
            raise
        except Exception as exc:
            raise TransformationError(f"on-demand view `{view}`: the transformation raised {type(exc).__name__}: "
                                      f"{exc}") from exc

    return run


def _column(view: str, name: str, value: Any, kind: Optional[ValueType], rows: int) -> list:
    if kind in OUTPUT_TYPES:
        return output_values(view, name, value, kind, rows)
    value = value.to_numpy() if hasattr(value, "to_numpy") else value
    return value.tolist() if hasattr(value, "tolist") else list(value)


@dataclass
class OnDemandRead:
    """The requested features of one on-demand view, and where its inputs are among the decoded columns. Built
    once per plan: for a featurectl view, which column feeds each input of its function (`sources`) and which
    output answers each requested feature (`picks`), so that a request only looks values up."""

    spec: OnDemandSpec
    names: list[str]  # output names, in the order they were requested
    features: list[str]  # the view's features behind them
    inputs: list[tuple[str, str]]  # (name the function sees, key of decoded values)
    sources: list[tuple[bool, str]] = field(init=False)  # per input of `spec.udf`: (a request field?, its key)
    picks: list[int] = field(init=False)  # per requested feature: its position among `spec.udf`'s outputs

    def __post_init__(self) -> None:
        udf = self.spec.udf
        stored = dict(self.inputs)
        self.sources = [(name not in stored, stored.get(name, name)) for name in udf.inputs] if udf else []
        self.picks = [list(udf.outputs).index(feature) for feature in self.features] if udf else []

    def apply(self, values: dict[str, list], rows_of: dict[str, ViewRows], entities: dict[str, list],
              request: dict[str, list], rows: int) -> None:
        """Compute the features over all rows and add them to `values` (PRESENT, or NULL_VALUE where None)."""
        udf = self.spec.udf
        computed = ViewRows((None,) * rows, [], [])  # no event time: Feast answers the epoch too
        if udf is not None and rows == 1:  # the usual online call: the function on one row's values
            row = udf.run_row([(request if asked else values)[key][0] for asked, key in self.sources])
            for name, pick in zip(self.names, self.picks):
                values[name] = [row[pick]]
                rows_of[name] = computed
            return
        if udf is not None:
            out = udf.run({name: (request if asked else values)[key] for name, (asked, key) in
                           zip(udf.inputs, self.sources)}, rows)
        else:  # a function written for Feast sees every column, as Feast passes them
            columns = {**entities, **request}
            for name, key in self.inputs:
                columns[name] = values[key]
            out = self.spec.run(columns, rows)
        for name, feature in zip(self.names, self.features):
            values[name] = out[feature]
            rows_of[name] = computed
