"""Nearest-neighbour search over a vector feature: ids, distances and requested features in one call.

    client.search("asset_shape:embedding", vector, k=10, filters={"category": "chair"}, features=["category"])

A search is planned against the catalog (the view, its vector type, the query's dimension, the filters), run
in the vector index (`serving.vector_common.open_index`: keys and distances only), and its hits joined back to their
features in Redis by one `get_features` read: the hits' primary keys are Feast's serialized entity keys, which
with the project name are their Redis keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from dsl.types import FLOAT32_MAX, Vector
from redis_store.layout import KeyEncoder
from serving.catalog import Catalog, ViewSpec
from serving.vector_common import Filters, VectorSearchError, filter_values

MAX_K = 1000
DISTANCE = "distance"


@dataclass(frozen=True)
class SearchPlan:
    view: ViewSpec
    feature: str
    kind: Vector
    collection: str  # the view's collection (Milvus) or table (pgvector) in Feast's layout
    vector: list[float]
    k: int
    filters: Filters
    features: tuple[str, ...]  # of the view, read from Redis for each hit


@dataclass
class SearchResult:
    """Hits nearest first: `ids` (join key -> value per hit), `distances`, and each requested feature's values;
    `join_keys` names the id columns (also when there is no hit)."""

    ids: list[dict[str, Any]]
    distances: list[float]
    features: dict[str, list]
    join_keys: tuple[str, ...]

    def to_dict(self) -> dict[str, list]:
        """Columns: the join keys, the requested features, then `distance`."""
        keys = {name: [row[name] for row in self.ids] for name in self.join_keys}
        return {**keys, **self.features, DISTANCE: self.distances}

    def to_feast_response(self) -> dict[str, Any]:
        """Feast's feature server's answer to POST /retrieve-online-documents: one result per column."""
        columns = self.to_dict()
        results = [{"values": values, "statuses": ["PRESENT" if v is not None else "NOT_FOUND" for v in values]}
                   for values in columns.values()]
        return {"metadata": {"feature_names": list(columns)}, "results": results}


def split_reference(reference: str) -> tuple[str, str]:
    view, _, feature = reference.partition(":") if isinstance(reference, str) else ("", "", "")
    if not view or not feature:
        raise VectorSearchError(f"`{reference}` is no `view:feature` reference of a vector feature")
    return view, feature


def plan_search(catalog: Catalog, reference: str, vector: Any, k: int,
                filters: Optional[Mapping[str, Any]] = None, features: Optional[Sequence[str]] = None) -> SearchPlan:
    """Check a search against the catalog; VectorSearchError (a 400) says what is wrong and what to give."""
    view_name, feature = split_reference(reference)
    view = catalog.views.get(view_name)
    if view is None or feature not in view.features:
        raise VectorSearchError(f"no feature `{reference}` in the registry: name a vector feature as `view:feature`")
    kind = view.features[feature].kind
    if not isinstance(kind, Vector):
        raise VectorSearchError(f"`{reference}` is not a vector feature: search a feature declared as Vector(dim)")
    if type(k) is not int or not 1 <= k <= MAX_K:
        raise VectorSearchError(f"k {k!r} is not an int from 1 to {MAX_K}")
    wanted = tuple(features or ())
    unknown = [name for name in wanted if name not in view.features]
    if unknown:
        raise VectorSearchError(f"feature view `{view_name}` has no feature {', '.join(map(repr, unknown))}; "
                                f"pick from: {', '.join(view.features)}")
    scalars = [name for name, spec in view.features.items() if not isinstance(spec.kind, Vector)]
    return SearchPlan(view, feature, kind, f"{catalog.project}_{view.storage_name}", query_vector(vector, kind), k,
                      filter_values(filters, scalars), wanted)


def query_vector(vector: Any, kind: Vector) -> list[float]:
    """The query as `kind.dim` finite floats; a query of another dimension is a clear error."""
    values = vector.tolist() if hasattr(vector, "tolist") else vector
    if isinstance(values, (list, tuple)):  # numpy scalars (np.float32, np.int64) as the numbers they hold
        values = [v.item() if isinstance(v, np.generic) else v for v in values]
    if not isinstance(values, (list, tuple)) or not all(type(v) in (int, float) for v in values):
        bad = next((v for v in values if type(v) not in (int, float)), None) if isinstance(values, (list, tuple)) \
            else None
        what = f"a list holding {type(bad).__name__} {bad!r}" if bad is not None else type(vector).__name__
        raise VectorSearchError(f"the query must be a list of {kind.dim} numbers, got {what}")
    if len(values) != kind.dim:
        raise VectorSearchError(f"the query has {len(values)} numbers but the feature is a {kind.value}: "
                                f"give {kind.dim}")
    try:
        floats = [float(v) for v in values]
    except OverflowError:
        floats = [math.inf]
    if not all(math.isfinite(v) for v in floats):
        raise VectorSearchError("the query holds NaN or an infinity: give finite numbers")
    if any(abs(v) > FLOAT32_MAX for v in floats):
        raise VectorSearchError(f"the query holds a number beyond float32's range (+-{FLOAT32_MAX:.4g}), which the "
                                f"index cannot hold: give numbers a {kind.value} can")
    if kind.metric == "COSINE" and not any(floats):
        raise VectorSearchError("the query is all zeros, which has no direction for COSINE: give a nonzero vector")
    return floats


def hit_rows(plan: SearchPlan, project: str, hits: Sequence[tuple[str, float]]) -> list[dict[str, Any]]:
    """The entity rows (join key -> value) of the hits' primary keys: Feast's entity keys, as hex."""
    encoder = KeyEncoder(project, dict(plan.view.join_keys))
    suffix = project.encode()
    rows = []
    for key, _ in hits:
        values = encoder.decode(bytes.fromhex(key) + suffix)
        if values is None:
            raise VectorSearchError(f"the index of `{plan.view.name}` holds key {key!r} of another entity: "
                                    "re-apply and re-materialize the view")
        rows.append(dict(zip(encoder.order, values)))
    return rows


def feature_refs(plan: SearchPlan) -> list[str]:
    return [f"{plan.view.name}:{name}" for name in plan.features]


def result(rows: list[dict[str, Any]], hits: Sequence[tuple[str, float]], plan: SearchPlan,
           values: Optional[Mapping[str, list]]) -> SearchResult:
    features = {name: list(values[name]) for name in plan.features} if values else {n: [] for n in plan.features}
    return SearchResult(rows, [distance for _, distance in hits], features, tuple(sorted(dict(plan.view.join_keys))))
