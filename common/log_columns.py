"""The columns of a feature service's log as Feast's `FeatureServiceLoggingSource` derives them, named by role: the
server writes them (`serving.feature_log_writer`) and training sets read them (`batch.training_log`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LOG_TIMESTAMP, LOG_DATE, REQUEST_ID = "__log_timestamp", "__log_date", "__request_id"  # feast.feature_logging's


@dataclass(frozen=True)
class LogColumns:
    schema: Any  # pyarrow.Schema
    join_keys: tuple[str, ...]  # of the service's feature views (an on-demand view's sources add none)
    request_fields: tuple[str, ...]  # request data of its on-demand views, logged as the request sent it
    features: tuple[str, ...]  # `view__feature` of each served feature, in the service's order


def log_columns(service: Any, registry: Any, project: str) -> LogColumns:
    """The log columns of Feast feature service `service`; raises what Feast raises when it cannot derive them."""
    from feast.feature_logging import FeatureServiceLoggingSource
    from feast.feature_view_utils import get_feature_view_from_registry

    schema = FeatureServiceLoggingSource(service, project).get_schema(registry)
    request_fields: dict[str, None] = {}
    for projection in service.feature_view_projections:
        view = get_feature_view_from_registry(registry, projection.name, project)
        for source in getattr(view, "source_request_sources", {}).values():
            request_fields.update(dict.fromkeys(f.name for f in source.schema))
    features = tuple(f"{p.name_to_use()}__{f.name}" for p in service.feature_view_projections for f in p.features)
    derived = {f"{name}{suffix}" for name in features for suffix in ("", "__timestamp", "__status")}
    keys = tuple(n for n in schema.names if n not in derived and n not in request_fields and not n.startswith("__"))
    return LogColumns(schema, keys, tuple(n for n in schema.names if n in request_fields), features)
