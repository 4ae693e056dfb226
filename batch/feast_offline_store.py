"""Feast's file offline store (its Dask store, `type: file`) as featurectl repos configure it, with one difference:
Feast's own `push` of rows into a view's offline table is refused with a message saying what to do.

A view's offline table belongs to the backfill, which replaces whole date partitions: a row appended by a push
would be dropped by the next backfill of its date, and Feast's own check fails first anyway, on the `date=...`
folders that Feast reads as a column (`missing_expected_columns: ['date']`). So that column, the partition folder
of the offline tables, is not reported as one of theirs, and the write itself is refused. Everything else (point-in-
time joins, feature-logging reads) is Feast's.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Literal, Optional, Tuple

from feast.infra.offline_stores.dask import DaskOfflineStore, DaskOfflineStoreConfig

from batch.offline_table import PARTITION
from common.errors import FeaturectlError

STORE_TYPE = "batch.feast_offline_store.FeaturectlOfflineStore"


class OfflinePushRefused(FeaturectlError, ValueError):
    """Feast's `push` with an offline part, to a featurectl view; the message says what to push instead."""


class FeaturectlOfflineStoreConfig(DaskOfflineStoreConfig):
    """`offline_store: {type: batch.feast_offline_store.FeaturectlOfflineStore}` in feature_store.yaml."""

    type: Literal["batch.feast_offline_store.FeaturectlOfflineStore"] = STORE_TYPE  # type: ignore[assignment]


def _is_offline_table(data_source: Any) -> bool:
    return data_source.name.endswith("_offline")


class FeaturectlOfflineStore(DaskOfflineStore):
    def get_table_column_names_and_types_from_data_source(self, config: Any,
                                                          data_source: Any) -> Iterable[Tuple[str, str]]:
        columns = super().get_table_column_names_and_types_from_data_source(config, data_source)
        if _is_offline_table(data_source):
            return [(name, kind) for name, kind in columns if name != PARTITION]
        return columns

    @staticmethod
    def offline_write_batch(config: Any, feature_view: Any, table: Any,
                            progress: Optional[Callable[[int], Any]]) -> None:
        source = feature_view.batch_source
        raise OfflinePushRefused(
            f"feature view `{feature_view.name}`: its offline table {getattr(source, 'path', '')} is written by "
            "`featurectl backfill` only (a pushed row would be dropped by the next backfill of its date), so "
            "Feast's push with an offline part is refused (an online part, with ONLINE_AND_OFFLINE, is written "
            "first); push the events to the view's source with `featurectl`'s `POST /push` or "
            "`client.push(source, rows, to=\"online_and_offline\")`, then backfill")
