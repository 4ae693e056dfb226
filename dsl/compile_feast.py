"""DSL -> Feast objects (Entity, the event sources, FeatureView with its output schema and sources, FeatureService).

Each view's Feast source is a PushSource over the view's offline feature table (Parquet written by the
backfill), so Feast's own `push` and `get_historical_features` work on our views unchanged. Feast's `offline`
flag means "also write materialized and pushed rows back to the offline store"; our offline table is owned by
the backfill, so that flag stays off and the DSL's `offline` is kept as the tag `featurectl.offline`. A DSL entity with
several join keys becomes one Feast entity per key (`{entity}__{key}`): Feast entities carry one join key each.

Each event source is registered for what it is: a KafkaSource (topic, bootstrap servers, JSON with the source's
columns, watermark delay) whose batch source is a FileSource over the Parquet history (`{source}_history`), or
that FileSource alone for a source without a topic. Feast's registry lineage (the graph of its UI,
`feast.lineage`) draws an edge from a data source into a FeatureView only from the view's own batch source (a
StreamFeatureView adds its stream source), and a view must keep the push source above as its own source (Feast's
push finds views by it); so a view names its event source, topic, history and tile query in tags (`featurectl.*`,
shown on its page in Feast's UI), and the path itself is stated as OpenLineage (`dsl.compile_lineage`).

A service with `logging` gets Feast's `LoggingConfig` with a `FileLoggingDestination` at `feature_log_path`, which
`featurectl serve` writes hive-partitioned by `__log_date` (Feast's file offline store reads that layout; its own
writer's `partition_by` makes `YYYY-MM-DD/` folders its reader cannot read back, so `partition_by` stays unset).

An on-demand view becomes an `OnDemandFeatureView` in Feast's "python" mode whose function is our `OnDemandUdf`
(`dsl.transform`), registered as text that rebuilds it, so Feast's SDK runs the same code as ours; its outputs are
the declared schema, not what Feast infers from a call on made-up inputs (`dsl.feast_transformation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from common.storage import Storage, as_storage
from dsl.compile_flink import CompiledView, SourceSettings, source_location
from dsl.entity import Entity
from dsl.errors import DefinitionError, DuplicateNameError
from dsl.feature_view import FeatureService, FeatureView
from dsl.on_demand import OnDemandView, RequestFields
from dsl.repo import Repository
from dsl.source import EventSource
from dsl.sql import quote_ident
from dsl.types import FeatureType, Vector

EVENT_TIMESTAMP = "event_timestamp"


@dataclass
class FeastObjects:
    entities: list
    data_sources: list
    feature_views: list
    feature_services: list
    on_demand_views: list = field(default_factory=list)

    def all(self) -> list:
        return [*self.entities, *self.data_sources, *self.feature_views, *self.on_demand_views,
                *self.feature_services]


def offline_table_location(data_dir: Path | Storage, view: FeatureView | str) -> Storage:
    """Where the backfill writes a view's offline feature table (one folder of Parquet files), in a local data
    folder or shared storage; `view` may be a name (a view known only from the registry)."""
    return as_storage(data_dir).child("offline", view if isinstance(view, str) else view.name)


def offline_table_path(data_dir: Path, view: FeatureView | str) -> Path:
    """The local folder of a view's offline table, for what rewrites it as local files."""
    return data_dir / "offline" / (view if isinstance(view, str) else view.name)


def file_source_location(location: Storage) -> dict[str, str]:
    """A Feast `FileSource`'s `path` (and S3 endpoint, for an S3-compatible server) of a folder."""
    if location.scheme in ("s3", "s3a") and location.s3 is not None and location.s3.endpoint:
        return {"path": "s3://" + location.uri.split("://", 1)[1], "s3_endpoint_override": location.s3.endpoint}
    return {"path": location.display}


def push_source_name(view: FeatureView) -> str:
    """The name of the Feast push source registered for a view (what Feast's `store.push` and `POST /push` take)."""
    return f"{view.name}_push"


def history_source_name(source: EventSource) -> str:
    """The Feast name of a source's Parquet history."""
    return f"{source.name}_history"


def feast_entity_names(entity: Entity) -> list[str]:
    """The Feast entities of a DSL entity: itself, or one per join key (`{entity}__{key}`)."""
    if len(entity.join_keys) == 1:
        return [entity.name]
    return [f"{entity.name}__{key}" for key in entity.join_keys]


def feature_log_path(data_dir: Path | Storage, service: str) -> Path:
    """Where `featurectl serve` logs the vectors it serves for a feature service with logging: a folder of the
    local data folder, since the server writes local files."""
    location = as_storage(data_dir)
    if not location.is_local:
        raise DefinitionError(f"feature service `{service}`", f"logs its served vectors, but the data is in "
                              f"{location.uri}, not a local folder", "feature logs are written as local files: "
                              "drop `logging` from the service or keep platform.data_storage unset")
    return Path(location.display) / "feature_logs" / service


def _logging_config(service: FeatureService, data_dir: Path | Storage):
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
    return [FeastEntity(name=name, join_keys=[key], value_type=kind.feast_value_type(),
                        description=f"{entity.description} (join key {key} of {entity.name})".strip(),
                        tags={**entity.tags, "featurectl.entity": entity.name})
            for name, (key, kind) in zip(feast_entity_names(entity), keys)]


def feast_event_source(source: EventSource, settings: SourceSettings) -> list:
    """The source's Parquet history as a FileSource and, when it has a topic, the KafkaSource over both."""
    from feast import FileSource, KafkaSource
    from feast.data_format import JsonFormat, ParquetFormat

    location = file_source_location(source_location(source, settings.data_dir))
    history = FileSource(name=history_source_name(source), **location, file_format=ParquetFormat(),
                         timestamp_field=source.timestamp_field,
                         description=f"Parquet history of {source.name} (event time in epoch ms): what "
                                     "`featurectl backfill` and a stream's start read")
    if not source.kafka_topic:
        return [history]
    columns = ", ".join(f"{quote_ident(name)} {kind.flink_sql}" for name, kind in source.schema.items())
    kafka = KafkaSource(name=source.name, timestamp_field=source.timestamp_field, message_format=JsonFormat(columns),
                        kafka_bootstrap_servers=settings.bootstrap_servers, topic=source.kafka_topic,
                        batch_source=history, watermark_delay_threshold=source.watermark_delay,
                        description=source.description,
                        tags={"featurectl.allowed_lateness": str(source.allowed_lateness)})
    return [kafka, history]


def _view_tags(view: FeatureView, compiled: CompiledView, settings: SourceSettings) -> dict[str, str]:
    """What feeds the view and how, for Feast's UI: the event source (its Feast data source of the same name),
    its topic and history, and the tile query that both engines run."""
    source = view.source
    tags = {**view.tags, "featurectl.source": source.name, "featurectl.tile": str(view.tile),
            "featurectl.offline": str(view.offline).lower(),
            "featurectl.history": source_location(source, settings.data_dir).display,
            "featurectl.tile_query": compiled.tile_query}
    if source.kafka_topic:
        tags["featurectl.kafka_topic"] = source.kafka_topic
    return tags


def _feast_view(view: FeatureView, compiled: CompiledView, settings: SourceSettings):
    from feast import FeatureView as FeastFeatureView, Field, FileSource, PushSource

    location = file_source_location(offline_table_location(settings.data_dir, view))
    batch = FileSource(name=f"{view.name}_offline", **location, timestamp_field=EVENT_TIMESTAMP,
                       description=f"offline feature table of {view.name}: its tile query over "
                                   f"{history_source_name(view.source)}, written by `featurectl backfill`")
    push = PushSource(name=push_source_name(view), batch_source=batch)
    schema = [Field(name=k, dtype=t.feast_type()) for k, t in view.entity.join_keys.items()]
    schema += [feast_field(name, kind) for name, kind in view.output_schema().items()]
    fv = FeastFeatureView(name=view.name, entities=feast_entities(view.entity), ttl=view.ttl, schema=schema,
                          source=push, online=view.online, offline=False, description=view.description,
                          owner=view.owner, tags=_view_tags(view, compiled, settings))
    return fv, [batch, push]


def feast_field(name: str, kind: FeatureType):
    """A feature's Feast field; a vector carries the index flags Feast's vector stores read (length, metric)."""
    from feast import Field

    if isinstance(kind, Vector):
        return Field(name=name, dtype=kind.feast_type(), vector_index=True, vector_length=kind.dim,
                     vector_search_metric=kind.metric)
    return Field(name=name, dtype=kind.feast_type())


def _check_source_names(sources: list) -> None:
    """Feast keeps one data source per name; the names made here from different objects must not meet."""
    seen: set[str] = set()
    for source in sources:
        if source.name in seen:
            raise DuplicateNameError(f"Feast data source `{source.name}`",
                                     "is the name of an event source (or its `_history`) and of a view's "
                                     "`_offline` or `_push` source",
                                     "rename the source or the view")
        seen.add(source.name)


def _request_source(fields: RequestFields):
    from feast import Field, RequestSource

    schema = [Field(name=k, dtype=t.feast_type()) for k, t in fields.schema.items()]
    return RequestSource(name=fields.name, schema=schema, description=fields.description)


def _feast_on_demand(odfv: OnDemandView, views: dict, request_sources: dict):
    from feast import Field, OnDemandFeatureView

    from dsl.feast_transformation import DeclaredOutputsTransformation

    sources = [views[ref.view][list(ref.features)] for ref in odfv.stored_inputs]
    sources += [request_sources[fields.name] for fields in odfv.request_sources]
    transformation = DeclaredOutputsTransformation(udf=odfv.udf, udf_string=odfv.udf.registered_text())
    return OnDemandFeatureView(name=odfv.name, sources=sources, feature_transformation=transformation, mode="python",
                               schema=[Field(name=k, dtype=t.feast_type()) for k, t in odfv.schema.items()],
                               description=odfv.description, owner=odfv.owner,
                               tags={**odfv.tags, "featurectl.mode": odfv.mode})


def compile_feast(repo: Repository, settings: SourceSettings, compiled: Sequence[CompiledView]) -> FeastObjects:
    """Feast objects for `repo`; `compiled` holds each view's Flink SQL (`dsl.compile_flink.compile_view`)."""
    from feast import FeatureService as FeastFeatureService

    entities = [e for entity in repo.entities for e in feast_entities(entity)]
    sources = [s for source in repo.sources for s in feast_event_source(source, settings)]
    queries = {c.view: c for c in compiled}
    views = {}
    for view in repo.views:
        views[view.name], view_sources = _feast_view(view, queries[view.name], settings)
        sources.extend(view_sources)
    request_sources = {s.name: _request_source(s) for odfv in repo.on_demand for s in odfv.request_sources}
    sources.extend(request_sources.values())
    _check_source_names(sources)
    on_demand = {odfv.name: _feast_on_demand(odfv, views, request_sources) for odfv in repo.on_demand}
    services = []
    for service in repo.services:
        projections = [{**views, **on_demand}[ref.view][list(ref.features)] for ref in repo.resolve_service(service)]
        services.append(FeastFeatureService(name=service.name, features=projections, description=service.description,
                                            owner=service.owner, tags=dict(service.tags),
                                            logging_config=_logging_config(service, settings.data_dir)))
    return FeastObjects(entities, sources, list(views.values()), services, list(on_demand.values()))
