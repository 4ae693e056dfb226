"""DSL -> Feast objects (Entity, FeatureView with its output schema and sources, FeatureService).

Each view's Feast source is a PushSource over the view's offline feature table (Parquet written by the
backfill), so Feast's own `push` and `get_historical_features` work on our views unchanged. Feast's `offline`
flag means "also write materialized and pushed rows back to the offline store"; our offline table is owned by
the backfill, so that flag stays off and the DSL's `offline` is kept as the tag `featurectl.offline`. A DSL entity with
several join keys becomes one Feast entity per key (`{entity}__{key}`): Feast entities carry one join key each.
An on-demand view becomes an `OnDemandFeatureView` in Feast's "python" mode whose function is our `OnDemandUdf`
(`dsl.transform`), registered as text that rebuilds it, so Feast's SDK runs the same code as ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsl.entity import Entity
from dsl.feature_view import FeatureView
from dsl.on_demand import OnDemandView, RequestFields
from dsl.repo import Repository

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


def offline_table_path(data_dir: Path, view: FeatureView | str) -> Path:
    """Where the backfill writes a view's offline feature table (one folder of Parquet files); `view` may be a
    name (a view known only from the registry)."""
    return data_dir / "offline" / (view if isinstance(view, str) else view.name)


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


def _request_source(fields: RequestFields):
    from feast import Field, RequestSource

    schema = [Field(name=k, dtype=t.feast_type()) for k, t in fields.schema.items()]
    return RequestSource(name=fields.name, schema=schema, description=fields.description)


def _feast_on_demand(odfv: OnDemandView, views: dict, request_sources: dict):
    from feast import Field, OnDemandFeatureView
    from feast.transformation.python_transformation import PythonTransformation

    sources = [views[ref.view][list(ref.features)] for ref in odfv.stored_inputs]
    sources += [request_sources[fields.name] for fields in odfv.request_sources]
    transformation = PythonTransformation(udf=odfv.udf, udf_string=odfv.udf.registered_text())
    return OnDemandFeatureView(name=odfv.name, sources=sources, feature_transformation=transformation, mode="python",
                               schema=[Field(name=k, dtype=t.feast_type()) for k, t in odfv.schema.items()],
                               description=odfv.description, owner=odfv.owner,
                               tags={**odfv.tags, "featurectl.mode": odfv.mode})


def compile_feast(repo: Repository, data_dir: Path) -> FeastObjects:
    from feast import FeatureService as FeastFeatureService

    entities = [e for entity in repo.entities for e in feast_entities(entity)]
    views, sources = {}, []
    for view in repo.views:
        views[view.name], view_sources = _feast_view(view, data_dir)
        sources.extend(view_sources)
    request_sources = {s.name: _request_source(s) for odfv in repo.on_demand for s in odfv.request_sources}
    sources.extend(request_sources.values())
    on_demand = {odfv.name: _feast_on_demand(odfv, views, request_sources) for odfv in repo.on_demand}
    services = []
    for service in repo.services:
        projections = [{**views, **on_demand}[ref.view][list(ref.features)] for ref in repo.resolve_service(service)]
        services.append(FeastFeatureService(name=service.name, features=projections, description=service.description,
                                            owner=service.owner, tags=dict(service.tags)))
    return FeastObjects(entities, sources, list(views.values()), services, list(on_demand.values()))
