"""What every vector engine (`serving.vector_index`: Milvus, `serving.pgvector_index`: pgvector) shares: the
search error, the check of a search's filters, and the one-vector-type rule of an indexed view. `open_index`
picks the engine `platform.vectors.engine` names."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from common.config import ProjectConfig
from dsl.feature_view import FeatureView
from dsl.types import Vector
from serving.errors import RequestError

Filters = Mapping[str, tuple[str, ...]]  # feature -> the texts it may equal (any of them); features ANDed


PGVECTOR_HNSW_MAX_DIM = 2_000  # pgvector's ceiling for an HNSW index over `vector` (its hnsw.h)


class VectorSearchError(RequestError):
    """A search that cannot be run as asked: no such vector feature, a query of another dimension, a bad filter."""

    code = "bad_search"


def filter_values(filters: Optional[Mapping[str, Any]], allowed: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """`{feature: value}` (equal) or `{feature: [values]}` (any of them) checked against the view's other features,
    each value as the text Feast's stores compare (`feast_text`)."""
    checked = {}
    for name, wanted in (filters or {}).items():
        if name not in allowed:
            raise VectorSearchError(f"cannot filter on `{name}`: filter on one of the view's other features "
                                    f"({', '.join(f'`{a}`' for a in allowed) or 'none'})")
        values = wanted if isinstance(wanted, (list, tuple)) else [wanted]
        if not values or any(v is None or isinstance(v, (dict, list, tuple)) for v in values):
            raise VectorSearchError(f"filter `{name}`: give a value or a non-empty list of values, not {wanted!r}")
        checked[name] = tuple(feast_text(v) for v in values)
    return checked


def feast_text(value: Any) -> str:
    """The string Feast's stores keep beside a scalar feature value (Milvus's field, PostgreSQL's `value_text`):
    `str()` of the Python value, empty for NULL."""
    return "" if value is None else str(value)


def vector_kind(view: FeatureView) -> Vector:
    """The vector type of a view's index: its one vector feature's (`FeatureView` refuses a second, as Feast does)."""
    kinds = list(view.vector_features.values())
    if not kinds:
        raise VectorSearchError(f"feature view `{view.name}` has no Vector feature to index")
    return kinds[0]


def check_indexable(config: ProjectConfig, views: Sequence[FeatureView]) -> None:
    """Refuse, before anything is registered or written, a vector feature the project's engine cannot index: one
    wider than pgvector's HNSW index takes."""
    for view in views:
        if not view.vector_features:
            continue
        kind = vector_kind(view)
        if config.platform.vectors.engine == "pgvector" and kind.dim > PGVECTOR_HNSW_MAX_DIM:
            raise VectorSearchError(f"feature view `{view.name}`: {kind.value} has more dimensions than pgvector's "
                                    f"HNSW index takes ({PGVECTOR_HNSW_MAX_DIM}): set `platform.vectors.engine: "
                                    "milvus` in feature_store.yaml, or give the vector fewer dimensions")


class VectorEngine:
    """What both engines' indexes share: the project's config and Feast's definitions of its views, and the bulk
    write of an Arrow table through the engine's own `write`."""

    def __init__(self, config: ProjectConfig):
        self.config = config
        self.settings = config.platform.vectors
        self._feast_views: dict[str, Any] = {}

    def write(self, view: FeatureView, columns: Mapping[str, Sequence[Any]], event_ms: Sequence[int],
              bulk: bool = False) -> int:
        raise NotImplementedError

    def _feast_view(self, name: str):
        view = self._feast_views.get(name)
        if view is None:
            from feast import FeatureStore

            store = FeatureStore(config=self.config.feast_repo_config())
            view = self._feast_views[name] = store.get_feature_view(name)
        return view

    def write_table(self, view: FeatureView, table: Any) -> int:
        """`write` for an Arrow table of the view's rows (join keys, `event_timestamp`, features), as
        materialization reads them from the offline table."""
        import pyarrow as pa

        from dsl.compile_feast import EVENT_TIMESTAMP

        millis = table.column(EVENT_TIMESTAMP).cast(pa.timestamp("ms", "UTC")).cast(pa.int64()).to_pylist()
        names = [*view.entity.join_keys, *view.feature_names]
        return self.write(view, {name: _pylist(table.column(name)) for name in names}, millis, bulk=True)


def _pylist(column: Any) -> list:
    """A column's values as Python lists; a vector column without nulls through numpy, several times faster than
    Arrow's `to_pylist` of a fixed-size list."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_fixed_size_list(column.type) and column.null_count == 0 and len(column):
        flat = column.combine_chunks().flatten()
        if flat.null_count == 0:
            return np.asarray(flat).reshape(len(column), column.type.list_size).tolist()
    return column.to_pylist()


def open_index(config: ProjectConfig) -> VectorEngine:
    """The project's vector index on the engine `platform.vectors.engine` names (Milvus or pgvector): both answer
    `write`, `write_table`, `seal`, `search`, `drop` and `feast_repo_config` alike."""
    if config.platform.vectors.engine == "pgvector":
        from serving.pgvector_index import PgVectorIndex

        return PgVectorIndex(config)
    from serving.vector_index import VectorIndex

    return VectorIndex(config)
