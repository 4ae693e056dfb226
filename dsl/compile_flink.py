"""DSL -> Flink SQL: source DDL for each mode and ONE tile query that serves both.

The tile query groups events per entity per tile (the view's `tile`, aligned to the epoch: `tile_start` is
`event_time - MOD(event_time, tile_ms)`) and emits the partial aggregates of `dsl.aggregates`; window values are
combinations of tiles, made by the runtimes. It is a plain GROUP BY rather than a window function, so in
streaming mode it updates a tile continuously (with mini-batches) instead of once the tile closes: that is what
keeps online values fresh within seconds, while batch mode computes the same rows at once.

The query reads the relation named after the source. In batch mode that is the Parquet folder. In streaming
mode it is a view over the Kafka table that drops events later than the source's allowed lateness behind the
watermark (the only place where the two modes differ, because `CURRENT_WATERMARK` exists only in streaming).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsl import aggregates, sql_functions
from dsl.aggregates import Partial
from dsl.duration import sql_interval
from dsl.expr import quote_ident
from dsl.feature_view import FeatureView
from dsl.features import Aggregation, Attribute
from dsl.source import ROWTIME, EventSource

TILE_START = "tile_start"
KAFKA_SUFFIX = "__kafka"


@dataclass(frozen=True)
class SourceSettings:
    """Where sources live in this deployment; the only non-DSL input of the compiler."""

    bootstrap_servers: str
    data_dir: Path
    consumer_group: str = "featurectl"


@dataclass(frozen=True)
class TileColumn:
    """One partial-aggregate column of the tile table: feature `base` (aggregation name), its op, its partial."""

    name: str
    sql_type: str
    base: str
    op: str
    partial: Partial


@dataclass(frozen=True)
class CompiledView:
    view: str
    source: str
    key_columns: tuple[str, ...]
    tile_columns: tuple[TileColumn, ...]
    streaming_source_ddl: tuple[str, ...]
    batch_source_ddl: str
    function_ddl: tuple[str, ...]
    tile_query: str

    def statements(self, mode: str) -> list[str]:
        """DDL then the query, for `streaming` or `batch`."""
        if mode not in ("streaming", "batch"):
            raise ValueError(f"mode must be `streaming` or `batch`, got `{mode}`")
        ddl = list(self.streaming_source_ddl) if mode == "streaming" else [self.batch_source_ddl]
        return [*self.function_ddl, *ddl, self.tile_query]


def _columns_ddl(source: EventSource) -> str:
    lines = [f"  {quote_ident(name)} {kind.flink_sql}" for name, kind in source.schema.items()]
    ts = quote_ident(source.timestamp_field)
    lines.append(f"  {quote_ident(ROWTIME)} AS TO_TIMESTAMP_LTZ({ts}, 3)")
    lines.append(f"  WATERMARK FOR {quote_ident(ROWTIME)} AS {quote_ident(ROWTIME)} - "
                 f"{sql_interval(source.watermark_delay)}")
    return ",\n".join(lines)


def _with(options: dict[str, str]) -> str:
    body = ",\n".join(f"  '{k}' = '{v}'" for k, v in options.items())
    return f"WITH (\n{body}\n)"


def on_time_filter(source: EventSource) -> str:
    """Events no later than the allowed lateness behind the watermark (all of them before the first watermark)."""
    rowtime = quote_ident(ROWTIME)
    return (f"CURRENT_WATERMARK({rowtime}) IS NULL OR "
            f"{rowtime} >= CURRENT_WATERMARK({rowtime}) - {sql_interval(source.allowed_lateness)}")


def streaming_source_ddl(source: EventSource, settings: SourceSettings, job: str) -> tuple[str, str]:
    """The Kafka table (`{source}__kafka`) and the view of its on-time events that the tile query reads."""
    options = {
        "connector": "kafka",
        "topic": source.kafka_topic or source.name,
        "properties.bootstrap.servers": settings.bootstrap_servers,
        "properties.group.id": f"{settings.consumer_group}-{job}",
        "scan.startup.mode": "group-offsets",
        "properties.auto.offset.reset": "earliest",
        "format": "json",
        "json.fail-on-missing-field": "false",
        "json.ignore-parse-errors": "true",
    }
    kafka = quote_ident(source.name + KAFKA_SUFFIX)
    table = f"CREATE TEMPORARY TABLE {kafka} (\n{_columns_ddl(source)}\n) {_with(options)}"
    view = (f"CREATE TEMPORARY VIEW {quote_ident(source.name)} AS\nSELECT * FROM {kafka}\n"
            f"WHERE {on_time_filter(source)}")
    return table, view


def source_path(source: EventSource, data_dir: Path) -> Path:
    path = Path(source.path or source.name)
    return path if path.is_absolute() else data_dir / path


def batch_source_ddl(source: EventSource, settings: SourceSettings) -> str:
    options = {"connector": "filesystem", "path": source_path(source, settings.data_dir).as_uri(),
               "format": "parquet"}
    return f"CREATE TEMPORARY TABLE {quote_ident(source.name)} (\n{_columns_ddl(source)}\n) {_with(options)}"


def _tile_columns(view: FeatureView) -> list[tuple[TileColumn, str]]:
    """Each tile column with its SQL aggregate expression."""
    schema = view.source.schema
    rowtime = quote_ident(ROWTIME)
    out: list[tuple[TileColumn, str]] = []
    for feature in view.features:
        if isinstance(feature, Attribute):
            kind = schema[feature.column]
            column = TileColumn(f"{feature.feature_names[0]}__last", kind.flink_sql, feature.feature_names[0],
                                "last", aggregates.OPS["last"].partials[0])
            out.append((column, f"LAST_BY({quote_ident(feature.column)}, {rowtime})"))
            continue
        out.extend(_aggregation_columns(feature, view))
    return out


def _aggregation_columns(agg: Aggregation, view: FeatureView) -> list[tuple[TileColumn, str]]:
    kind = view.source.schema.get(agg.column) if agg.column else None
    value = aggregates.input_sql(agg.op, quote_ident(agg.column) if agg.column else None, kind)
    if agg.filter is not None:
        value = f"CASE WHEN {agg.filter.to_sql()} THEN {value} END"
    out = []
    for partial in aggregates.OPS[agg.op].partials:
        sql = partial.sql_agg.format(x=value, ts=quote_ident(ROWTIME))
        out.append((TileColumn(f"{agg.base_name}__{partial.suffix}", _partial_type(partial, agg.op, kind),
                               agg.base_name, agg.op, partial), sql))
    return out


def _partial_type(partial: Partial, op: str, kind) -> str:
    if partial.suffix == "count":
        return "BIGINT"
    if partial.suffix == "hll":
        return "BYTES"
    if partial.suffix == "sum":
        return "BIGINT" if kind.is_integer else "DOUBLE"
    return kind.flink_sql


def tile_start_sql(view: FeatureView) -> str:
    ts = quote_ident(view.source.timestamp_field)
    return f"{ts} - MOD({ts}, {tile_ms(view)})"


def tile_ms(view: FeatureView) -> int:
    return int(view.tile.total_seconds() * 1000)


def tile_query(view: FeatureView, columns: list[tuple[TileColumn, str]]) -> str:
    keys = [quote_ident(k) for k in view.entity.join_keys]
    select = [*keys, f"{tile_start_sql(view)} AS {TILE_START}"]
    select += [f"{sql} AS {quote_ident(column.name)}" for column, sql in columns]
    body = ",\n  ".join(select)
    return (f"SELECT\n  {body}\nFROM {quote_ident(view.source.name)}\n"
            f"GROUP BY {', '.join(keys)}, {tile_start_sql(view)}")


def compile_view(view: FeatureView, settings: SourceSettings) -> CompiledView:
    columns = _tile_columns(view)
    return CompiledView(
        view=view.name,
        source=view.source.name,
        key_columns=tuple(view.entity.join_keys),
        tile_columns=tuple(c for c, _ in columns),
        streaming_source_ddl=streaming_source_ddl(view.source, settings, view.name),
        batch_source_ddl=batch_source_ddl(view.source, settings),
        function_ddl=tuple(sql_functions.function_ddl()),
        tile_query=tile_query(view, columns),
    )
