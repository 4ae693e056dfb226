"""The repo's lineage recorded in Feast's OpenLineage consumer store, where the Lineage page of `feast ui` and
`featurectl ui` draws it (see `dsl.compile_lineage` for what is recorded and why).

On only when feature_store.yaml turns Feast's consumer on (`openlineage: {consumer: {enabled: true}}`); the store
is then tables in the registry database (or the consumer's `connection_string`), as Feast's UI server reads it.
Each `apply` replaces the project's lineage: its namespace purged, then written again, so it is always the
lineage of what is registered; the Kafka topics and Parquet histories only the project's jobs read go with it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Optional

from dsl.compile_flink import SourceSettings
from dsl.compile_lineage import lineage_events
from dsl.compile_repo import CompiledRepo


def consumer_settings(store):
    """Feast's OpenLineage consumer settings of the store's repo, or None when the repo does not turn it on."""
    settings = store.config.openlineage
    consumer = settings.consumer if settings else None
    return consumer if consumer and consumer.enabled else None


def _open(store, consumer):
    from feast.openlineage.store import OpenLineageStore

    ol_store = OpenLineageStore(connection_string=consumer.connection_string or store.config.registry.path)
    ol_store.initialize()
    return ol_store


def _namespace(store) -> str:
    from feast.openlineage.identity import resolve_namespace

    return resolve_namespace(store.config.openlineage.namespace, store.config.project)


def record_lineage(store, compiled: CompiledRepo, settings: SourceSettings) -> Optional[str]:
    """Replace the project's lineage with that of `compiled`; returns its namespace, or None when off."""
    from feast.openlineage.processor import OpenLineageProcessor

    consumer = consumer_settings(store)
    if consumer is None:
        return None
    ol_store, namespace = _open(store, consumer), _namespace(store)
    inputs_before = _input_datasets(ol_store, namespace)
    ol_store.purge_namespace(namespace)
    processor = OpenLineageProcessor(ol_store, consumer.namespace_mapping or {})
    for event in lineage_events(namespace, compiled.repo, compiled.views, settings, datetime.now(timezone.utc)):
        processor.process_event(event)
    _drop_unread(ol_store, inputs_before)
    return namespace


def forget_lineage(store) -> None:
    """Remove the project's lineage (teardown); nothing when the consumer is off."""
    consumer = consumer_settings(store)
    if consumer is not None:
        ol_store, namespace = _open(store, consumer), _namespace(store)
        inputs_before = _input_datasets(ol_store, namespace)
        ol_store.purge_namespace(namespace)
        _drop_unread(ol_store, inputs_before)


def _input_datasets(ol_store, namespace: str) -> set[tuple[str, str]]:
    """Datasets of other namespaces (topics, Parquet folders) that the project's jobs read."""
    return {(e["source_namespace"], e["source_name"]) for e in ol_store.get_all_lineage_edges([namespace])
            if e["source_type"] == "dataset" and e["source_namespace"] != namespace}


def _drop_unread(ol_store, datasets: set[tuple[str, str]]) -> None:
    """Delete those of `datasets` that no edge touches any more: a source the repo no longer has."""
    touched = {(e[f"{end}_namespace"], e[f"{end}_name"]) for e in ol_store.get_all_lineage_edges()
               for end in ("source", "target")}
    for namespace, name in datasets - touched:
        ol_store.delete_dataset(namespace, name)
