"""A compiled repo's lineage as OpenLineage events: the path from events to features that Feast's UI draws.

Feast's registry lineage links a FeatureView to its own batch source only (for our views, the offline table), so
the rest of the path is stated the way Feast takes lineage it does not compute itself: OpenLineage events, kept by
Feast's consumer and drawn on the Lineage page of its UI. Per view, a run of the job `{view}_tile_query`, whose SQL
facet is the view's tile query, reads the source's Kafka topic and Parquet history and writes the view (one query
text: `featurectl stream` runs it on the topic, `featurectl backfill` on the history); per feature service, a run
reads its views. Both are Feast "definition" jobs, which its UI draws as edges from dataset to dataset (a
"transform" job would be a node of its own, and Feast's layout puts those after the views). Datasets carry Feast's
facets naming the registered objects (the source's KafkaSource and `_history` FileSource, the view, the service);
names follow OpenLineage's naming spec (`kafka://host:port` and the topic; for a history, the namespace and name
of its storage: `file` and the absolute path, `s3://bucket` and the key, see `Storage.lineage_id`), so that other
producers' events about the same topic or files meet them. Run ids are derived from the names: one run per definition.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Sequence

from dsl.compile_feast import feast_entity_names, history_source_name
from dsl.compile_flink import CompiledView, SourceSettings, source_location
from dsl.feature_view import FeatureService, FeatureView
from dsl.on_demand import OnDemandView
from dsl.repo import Repository
from dsl.source import EventSource

PRODUCER = "featurectl"
_SCHEMA_URL = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/definitions/"


def tile_query_job_name(view: FeatureView) -> str:
    return f"{view.name}_tile_query"


def lineage_events(namespace: str, repo: Repository, compiled: Sequence[CompiledView], settings: SourceSettings,
                   event_time: datetime) -> list[dict]:
    """A completed run per view (its tile query) and per feature service, in `namespace` (the Feast project's
    OpenLineage namespace); `event_time` is when the definitions were applied."""
    when = event_time.isoformat()
    queries = {c.view: c.tile_query for c in compiled}
    events = [_view_run(namespace, view, queries[view.name], settings, when) for view in repo.views]
    events += [_on_demand_run(namespace, odfv, repo, when) for odfv in repo.on_demand]
    events += [_service_run(namespace, service, repo, when) for service in repo.services]
    return events


def _view_run(namespace: str, view: FeatureView, tile_query: str, settings: SourceSettings, when: str) -> dict:
    about = (f"the tile query of `{view.name}`: `featurectl stream` runs it on the Kafka topic, `featurectl "
             "backfill` on the Parquet history")
    facets = {"sql": {"query": tile_query}, "documentation": {"description": about}}
    return _definition_run(namespace, tile_query_job_name(view), facets, _source_datasets(view.source, settings),
                           [_view_dataset(namespace, view)], when)


def _on_demand_run(namespace: str, odfv: OnDemandView, repo: Repository, when: str) -> dict:
    about = (f"the on-demand view `{odfv.name}`: its function, run at request time by featurectl's SDK and server "
             "and on the rows of training sets")
    inputs = [_view_dataset(namespace, repo.view(ref.view)) for ref in odfv.stored_inputs]
    inputs += [{"namespace": namespace, "name": fields.name,
                "facets": {"feast_dataSource": {"name": fields.name, "source_type": "RequestSource",
                                                "description": fields.description}}}
               for fields in odfv.request_sources]
    return _definition_run(namespace, f"{odfv.name}_transformation", {"documentation": {"description": about}},
                           inputs, [_on_demand_dataset(namespace, odfv)], when)


def _service_run(namespace: str, service: FeatureService, repo: Repository, when: str) -> dict:
    computed = {odfv.name: odfv for odfv in repo.on_demand}
    names = [ref.view for ref in repo.resolve_service(service)]
    output = {"namespace": namespace, "name": service.name,
              "facets": {"feast_featureService": {"name": service.name, "feature_views": names,
                                                  "description": service.description}}}
    inputs = [_on_demand_dataset(namespace, computed[name]) if name in computed
              else _view_dataset(namespace, repo.view(name)) for name in names]
    return _definition_run(namespace, f"feature_service_{service.name}", {}, inputs, [output], when)


def _definition_run(namespace: str, job: str, facets: dict, inputs: list[dict], outputs: list[dict],
                    when: str) -> dict:
    run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"featurectl:{namespace}:{job}")
    return {"eventType": "COMPLETE", "eventTime": when, "producer": PRODUCER, "schemaURL": _SCHEMA_URL + "RunEvent",
            "run": {"runId": str(run_id)},
            "job": {"namespace": namespace, "name": job, "facets": {**facets, "feast_jobKind": {"kind": "definition"}}},
            "inputs": inputs, "outputs": outputs}


def _source_datasets(source: EventSource, settings: SourceSettings) -> list[dict]:
    """The source's Kafka topic (when it has one) and its Parquet history."""
    schema = {"fields": [{"name": name, "type": kind.flink_sql} for name, kind in source.schema.items()]}
    location = source_location(source, settings.data_dir)
    history = location.display
    namespace, name = location.lineage_id
    datasets = [{"namespace": namespace, "name": name,
                 "facets": {"schema": schema, "feast_dataSource": {
                     "name": history_source_name(source), "source_type": "FileSource", "path": history,
                     "timestamp_field": source.timestamp_field, "description": f"Parquet history of {source.name}"}}}]
    if source.kafka_topic:
        broker = settings.bootstrap_servers.split(",")[0].strip()
        datasets.insert(0, {"namespace": f"kafka://{broker}", "name": source.kafka_topic,
                            "facets": {"schema": schema, "feast_dataSource": {
                                "name": source.name, "source_type": "KafkaSource",
                                "timestamp_field": source.timestamp_field, "description": source.description}}})
    return datasets


def _on_demand_dataset(namespace: str, odfv: OnDemandView) -> dict:
    facet = {"name": odfv.name, "features": list(odfv.schema), "entities": [], "description": odfv.description}
    return {"namespace": namespace, "name": odfv.name, "facets": {"feast_featureView": facet}}


def _view_dataset(namespace: str, view: FeatureView) -> dict:
    facet = {"name": view.name, "features": list(view.feature_names), "entities": feast_entity_names(view.entity),
             "description": view.description, "ttl_seconds": int(view.ttl.total_seconds())}
    return {"namespace": namespace, "name": view.name, "facets": {"feast_featureView": facet}}
