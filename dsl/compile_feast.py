"""DSL -> Feast objects (Entity, FeatureView with its output schema and sources, FeatureService).

Each view's Feast source is a PushSource over the view's offline feature table (Parquet written by the
backfill), so Feast's own `push` and `get_historical_features` work on our views unchanged. Feast's `offline`
flag means "also write materialized and pushed rows back to the offline store"; our offline table is owned by
the backfill, so that flag stays off and the DSL's `offline` is kept as the tag `featurectl.offline`. A DSL entity with
several join keys becomes one Feast entity per key (`{entity}__{key}`): Feast entities carry one join key each.
A service with `logging` gets Feast's `LoggingConfig` with a `FileLoggingDestination` at `feature_log_path`, which
`featurectl serve` writes hive-partitioned by `__log_date` (Feast's file offline store reads that layout; its own
writer's `partition_by` makes `YYYY-MM-DD/` folders its reader cannot read back, so `partition_by` stays unset).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsl.entity import Entity
from dsl.feature_view import FeatureService, FeatureView
from dsl.repo import Repository

EVENT_TIMESTAMP = "event_timestamp"


@dataclass
class FeastObjects:
    entities: list
    data_sources: list
    feature_views: list
    feature_services: list

    def all(self) -> list:
        return [*self.entities, *self.data_sources, *self.feature_views, *self.feature_services]


def offline_table_path(data_dir: Path, view: FeatureView) -> Path:
    """Where the backfill writes a view's offline feature table (one folder of Parquet files)."""
    return data_dir / "offline" / view.name


def feature_log_path(data_dir: Path, service: str) -> Path:
    """Where `featurectl serve` logs the vectors it serves for a feature service with logging."""
    return data_dir / "feature_logs" / service


def _logging_config(service: FeatureService, data_dir: Path):
    from feast.feature_logging import LoggingConfig
    from feast.infra.offline_stores.file_source import FileLoggingDestination

    if service.logging is None:
        return None
    destination = FileLoggingDestination(path=str(feature_log_path(data_dir, service.name)))
    return LoggingConfig(destination=destination, sample_rate=service.logging.sample_rate)


def feast_entities(entity: Entity) -> list:
    from feast import Entity as FeastEntity

    keys = list(entity.join_keys.items())
    if len(keys) == 1:
        key, kind = keys[0]
        return [FeastEntity(name=entity.name, join_keys=[key], value_type=kind.feast_value_type(),
                            description=entity.description, tags=dict(entity.tags))]
    return [FeastEntity(name=f"{entity.name}__{key}", join_keys=[key], value_type=kind.feast_value_type(),
                        description=f"{entity.description} (join key {key} of {entity.name})".strip(),
                        tags={**entity.tags, "featurectl.entity": entity.name})
            for key, kind in keys]


def _feast_view(view: FeatureView, data_dir: Path):
    from feast import FeatureView as FeastFeatureView, Field, FileSource, PushSource

    batch = FileSource(name=f"{view.name}_offline", path=str(offline_table_path(data_dir, view)),
                       timestamp_field=EVENT_TIMESTAMP,
                       description=f"offline feature table of {view.name}, written by `featurectl backfill`")
    push = PushSource(name=f"{view.name}_push", batch_source=batch)
    schema = [Field(name=k, dtype=t.feast_type()) for k, t in view.entity.join_keys.items()]
    schema += [Field(name=name, dtype=kind.feast_type()) for name, kind in view.output_schema().items()]
    tags = {**view.tags, "featurectl.source": view.source.name, "featurectl.tile": str(view.tile),
            "featurectl.offline": str(view.offline).lower()}
    fv = FeastFeatureView(name=view.name, entities=feast_entities(view.entity), ttl=view.ttl, schema=schema,
                          source=push, online=view.online, offline=False, description=view.description,
                          owner=view.owner, tags=tags)
    return fv, [batch, push]


def compile_feast(repo: Repository, data_dir: Path) -> FeastObjects:
    from feast import FeatureService as FeastFeatureService

    entities = [e for entity in repo.entities for e in feast_entities(entity)]
    views, sources = {}, []
    for view in repo.views:
        views[view.name], view_sources = _feast_view(view, data_dir)
        sources.extend(view_sources)
    services = []
    for service in repo.services:
        projections = [views[ref.view][list(ref.features)] for ref in repo.resolve_service(service)]
        services.append(FeastFeatureService(name=service.name, features=projections, description=service.description,
                                            owner=service.owner, tags=dict(service.tags),
                                            logging_config=_logging_config(service, data_dir)))
    return FeastObjects(entities, sources, list(views.values()), services)
