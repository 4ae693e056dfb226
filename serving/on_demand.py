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
    run = udf.run if isinstance(udf, OnDemandUdf) else _feast_runner(loaded.name, loaded.mode, loaded.singleton,
                                                                      udf, outputs)
    fingerprint = (loaded.mode, loaded.singleton, transformation.udf_string or id(udf))
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
    """The requested features of one on-demand view, and where its inputs are among the decoded columns."""

    spec: OnDemandSpec
    names: list[str]  # output names, in the order they were requested
    features: list[str]  # the view's features behind them
    inputs: list[tuple[str, str]] = field(default_factory=list)  # (name the function sees, key of decoded values)

    def apply(self, values: dict[str, list], rows_of: dict[str, ViewRows], entities: dict[str, list],
              request: dict[str, list], rows: int) -> None:
        """Compute the features over all rows and add them to `values` (PRESENT, or NULL_VALUE where None)."""
        columns = {**entities, **request}
        for name, key in self.inputs:
            columns[name] = values[key]
        out = self.spec.run(columns, rows)
        computed = ViewRows((None,) * rows, [], [])  # no event time: Feast answers the epoch too
        for name, feature in zip(self.names, self.features):
            values[name] = out[feature]
            rows_of[name] = computed
