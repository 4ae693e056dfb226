"""`POST /retrieve-online-documents` bodies, in Feast's request shape (its feature server's
`GetOnlineDocumentsRequest`): `features` (`view:feature`, one of them a vector feature: the one searched),
`query` (the vector), `top_k`, `api_version`, and Feast's `filters`: a comparison `{"key", "type": "eq" | "in",
"value"}` or an `{"type": "and", "filters": [...]}` of them. Turned into the arguments of `client.search`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dsl.types import Vector
from serving.catalog import Catalog
from serving.json_body import load_object
from serving.search import split_reference
from serving.vector_common import VectorSearchError

FIELDS = ("features", "feature_service", "query", "query_string", "top_k", "api_version", "distance_metric",
          "filters", "full_feature_names", "include_feature_view_version_metadata")
DEFAULT_TOP_K = 10


@dataclass(frozen=True)
class DocumentsRequest:
    reference: str  # the vector feature searched, `view:feature`
    vector: list
    k: int
    filters: dict[str, Any]
    features: tuple[str, ...]  # the other requested features of the view


def parse_documents_request(body: bytes, catalog: Catalog) -> DocumentsRequest:
    data = load_object(body, FIELDS, "`features`, `query` and `top_k`", "a search", VectorSearchError,
                       VectorSearchError)
    if data.get("feature_service") is not None or data.get("query_string") is not None:
        raise VectorSearchError("search by `features` and a `query` vector: feature services and text queries are "
                                "not searched here")
    features = data.get("features")
    if not isinstance(features, list) or not features or not all(isinstance(f, str) for f in features):
        raise VectorSearchError("`features` must be a non-empty list of `view:feature` references, a vector "
                                "feature among them")
    top_k = data.get("top_k")
    reference = _vector_reference(features, catalog)
    view = split_reference(reference)[0]
    others = []
    for ref in features:
        name, feature = split_reference(ref)
        if name != view:
            raise VectorSearchError(f"`{ref}` is not of view `{view}`: a search reads the features of one view")
        if ref != reference:
            others.append(feature)
    return DocumentsRequest(reference, data.get("query"), DEFAULT_TOP_K if top_k is None else top_k,
                            feast_filters(data.get("filters")), tuple(others))


def _vector_reference(features: list[str], catalog: Catalog) -> str:
    vectors = []
    for ref in features:
        view, feature = split_reference(ref)
        spec = catalog.views.get(view)
        if spec is not None and feature in spec.features and isinstance(spec.features[feature].kind, Vector):
            vectors.append(ref)
    if len(vectors) != 1:
        raise VectorSearchError(f"`features` must hold exactly one vector feature (the one searched); it holds "
                                f"{len(vectors)}")
    return vectors[0]


def feast_filters(filters: Optional[Any]) -> dict[str, Any]:
    """Feast's filter objects as `{feature: value | [values]}`: `eq` and `in` comparisons, joined by `and`."""
    if filters is None:
        return {}
    if not isinstance(filters, dict):
        raise VectorSearchError("`filters` must be a Feast filter object")
    if filters.get("type") == "and" and isinstance(filters.get("filters"), list):
        out: dict[str, Any] = {}
        for part in filters["filters"]:
            out.update(feast_filters(part))
        return out
    if filters.get("type") in ("eq", "in") and isinstance(filters.get("key"), str) and "value" in filters:
        return {filters["key"]: filters["value"]}
    raise VectorSearchError(f"unsupported filter {str(filters)[:200]}: use `eq` or `in` comparisons "
                            "({\"key\", \"type\", \"value\"}), joined by {\"type\": \"and\", \"filters\": [...]}")
