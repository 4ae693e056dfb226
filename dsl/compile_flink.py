"""DSL -> Flink SQL: source DDL for each mode and ONE tile query that serves both.

The tile query groups events per entity per tile (the view's `tile`, aligned to the epoch: `tile_start` is
`event_time - MOD(event_time, tile_ms)`) and emits the partial aggregates of `dsl.aggregates`; window values are
combinations of tiles, made by the runtimes. It is a plain GROUP BY rather than a window function, so in
streaming mode it updates a tile continuously (with mini-batches) instead of once the tile closes: that is what
keeps online values fresh within seconds, while batch mode computes the same rows at once.

The query reads the relation named after the source. In batch mode that is the Parquet folder. In streaming
mode it is the view of the source's valid, on-time events that `dsl.compile_stream_source` builds (the only
place where the two modes differ); `featurectl stream` runs that very relation, with its dead-letter query.
Every tile also carries two bookkeeping partials, in both modes: its number of events (`__events__count`, the
tile's version: an update with no more events than the one held is a replay) and its greatest event time
(`__clock__max`, the streaming clock), so that batch tiles can seed a stream.

The compiled view also carries the window specs both runtimes turn tiles into values with (`WindowSpec`), so
neither rebuilds them from DSL objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from common.storage import Storage, as_storage
from dsl import aggregates, sql_functions
from dsl.errors import DefinitionError
from dsl.aggregates import Partial
from dsl.compile_stream_source import KafkaRead, SourceRelation, lateness_ms, source_relation
from dsl.duration import milliseconds, sql_interval
from dsl.feature_view import FeatureView
from dsl.features import Aggregation, Attribute
from dsl.source import ROWTIME, EventSource
from dsl.sql import create_table, quote_ident, quote_string
from dsl.types import ValueType

TILE_START = "tile_start"
EVENTS_COLUMN = "__events__count"
CLOCK_COLUMN = "__clock__max"
# Where a streaming job without a checkpoint (or committed offsets) starts reading its topics.
FROM_COMMITTED_OR_EARLIEST = {"scan.startup.mode": "group-offsets", "properties.auto.offset.reset": "earliest"}


@dataclass(frozen=True)
class SourceSettings:
    """Where sources live in this deployment; the only non-DSL input of the compiler. `cutovers` (source name
    -> epoch ms) is where a stream's Kafka events start to count: the history before it comes from Parquet."""

    bootstrap_servers: str
    data_dir: Path | Storage  # the sources' histories and the offline tables: a local folder or shared storage
    consumer_group: str = "featurectl"  # the Kafka consumer group of the streaming source
    startup: Mapping[str, str] = field(default_factory=lambda: dict(FROM_COMMITTED_OR_EARLIEST))
    cutovers: Mapping[str, int] = field(default_factory=dict)

    @property
    def kafka_read(self) -> KafkaRead:
        return KafkaRead(self.bootstrap_servers, self.consumer_group, self.startup)


@dataclass(frozen=True)
class TileColumn:
    """One partial-aggregate column of the tile table: feature `base` (aggregation name), its op, its partial."""

    name: str
    sql_type: str
    base: str
    op: str
    partial: Partial


@dataclass(frozen=True)
class WindowSpec:
    """One served feature as both runtimes compute it: `op` over the last `tiles` tiles (an Attribute is `last`
    over the ttl), from the tile columns in `partials` (partial suffix -> column name), served as `kind`."""

    name: str
    op: str
    kind: ValueType
    tiles: int
    partials: Mapping[str, str]


@dataclass(frozen=True)
class CompiledView:
    view: str
    source: str
    key_columns: tuple[str, ...]
    key_types: tuple[ValueType, ...]
    tile_columns: tuple[TileColumn, ...]
    windows: tuple[WindowSpec, ...]  # the view's features in declaration order
    tile_ms: int
    ttl_ms: int
    lateness_ms: int  # the source's watermark delay + allowed lateness
    streaming_source: SourceRelation
    batch_source_ddl: str
    function_ddl: tuple[str, ...]
    tile_query: str

    @property
    def longest_tiles(self) -> int:
        """The longest window in tiles (an attribute's window is the ttl)."""
        return max(w.tiles for w in self.windows)

    @property
    def longest_ms(self) -> int:
        return self.longest_tiles * self.tile_ms

    @property
    def lookback_ms(self) -> int:
        """How far behind the newest event an event can still count: the longest window, the tile in progress and
        the source's lateness (what a stream reads back to fill its windows, what a tile topic must keep)."""
        return self.longest_ms + self.tile_ms + self.lateness_ms

    def statements(self, mode: str) -> list[str]:
        """DDL then the query, for `streaming` or `batch`."""
        if mode not in ("streaming", "batch"):
            raise ValueError(f"mode must be `streaming` or `batch`, got `{mode}`")
        ddl = list(self.streaming_source.ddl) if mode == "streaming" else [self.batch_source_ddl]
        return [*self.function_ddl, *ddl, self.tile_query]

    def tile_query_with_state_ttl(self, ttl_ms: int) -> str:
        """The tile query whose tiles' state expires `ttl_ms` after its last update (a streaming job's state):
        a hint on this query alone, so the source's running maximum, read for every event, carries no TTL."""
        hint = f"STATE_TTL({quote_string(self.source)} = {quote_string(f'{ttl_ms} ms')})"
        return f"SELECT /*+ {hint} */\n" + self.tile_query.removeprefix("SELECT\n")


def _columns(source: EventSource) -> list[str]:
    lines = [f"{quote_ident(name)} {kind.flink_sql}" for name, kind in source.schema.items()]
    ts = quote_ident(source.timestamp_field)
    lines.append(f"{quote_ident(ROWTIME)} AS TO_TIMESTAMP_LTZ({ts}, 3)")
    lines.append(f"WATERMARK FOR {quote_ident(ROWTIME)} AS {quote_ident(ROWTIME)} - "
                 f"{sql_interval(source.watermark_delay)}")
    return lines


def source_location(source: EventSource, data_dir: Path | Storage) -> Storage:
    """The folder of the source's Parquet history: its `path` when that is a URI or an absolute path, else
    that path (or its name) under the data folder, which may be shared storage itself."""
    path = source.path or source.name
    data = as_storage(data_dir)
    if "://" in path:
        return Storage(path, data.s3, data.hdfs)
    if Path(path).is_absolute():
        return Storage.local(Path(path), data.s3, data.hdfs)
    return data.child(*Path(path).parts)


def source_path(source: EventSource, data_dir: Path) -> Path:
    """The local folder of the source's history, for what writes it as local files (a push, a delete)."""
    location = source_location(source, data_dir)
    if not location.is_local:
        raise DefinitionError(f"source `{source.name}`", f"has its history at {location.uri}, not in a local folder",
                              "this command writes local files only: run it where the history is a folder")
    return Path(location.display)


def batch_source_ddl(source: EventSource, settings: SourceSettings) -> str:
    options = {"connector": "filesystem", "path": source_location(source, settings.data_dir).uri,
               "format": "parquet"}
    return create_table(source.name, _columns(source), options)


def _tile_columns(view: FeatureView) -> list[tuple[TileColumn, str]]:
    """Each tile column with its SQL aggregate expression: the features', then the two bookkeeping ones."""
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
    count, maximum = aggregates.OPS["count"].partials[0], aggregates.OPS["max"].partials[0]
    out.append((TileColumn(EVENTS_COLUMN, "BIGINT", "__events", "count", count), "COUNT(*)"))
    out.append((TileColumn(CLOCK_COLUMN, "BIGINT", "__clock", "max", maximum),
                f"MAX({quote_ident(view.source.timestamp_field)})"))
    return out


def window_specs(view: FeatureView, columns: Sequence[TileColumn]) -> tuple[WindowSpec, ...]:
    """The view's features as window specs, in declaration order; an Attribute is `last` over the ttl."""
    partials: dict[str, dict[str, str]] = {}
    for column in columns:
        partials.setdefault(column.base, {})[column.partial.suffix] = column.name
    kinds = view.output_schema()
    out = []
    for feature in view.features:
        if isinstance(feature, Attribute):
            name = feature.feature_names[0]
            out.append(WindowSpec(name, "last", kinds[name], max(1, view.ttl // view.tile), partials[name]))
            continue
        for window in feature.parsed_windows:
            name = feature.feature_name(window)
            out.append(WindowSpec(name, feature.op, kinds[name], window.length // view.tile,
                                  partials[feature.base_name]))
    return tuple(out)


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
    return milliseconds(view.tile)


def tile_query(view: FeatureView, columns: list[tuple[TileColumn, str]]) -> str:
    keys = [quote_ident(k) for k in view.entity.join_keys]
    select = [*keys, f"{tile_start_sql(view)} AS {quote_ident(TILE_START)}"]
    select += [f"{sql} AS {quote_ident(column.name)}" for column, sql in columns]
    body = ",\n  ".join(select)
    return (f"SELECT\n  {body}\nFROM {quote_ident(view.source.name)}\n"
            f"GROUP BY {', '.join(keys)}, {tile_start_sql(view)}")


def compile_view(view: FeatureView, settings: SourceSettings, source_keys: Sequence[str] = ()) -> CompiledView:
    """`source_keys`: the join keys every event of the source must carry to count (those of every view reading
    it, see `dsl.compile_stream_source.source_keys`); the view's own by default."""
    columns = _tile_columns(view)
    tile_columns = tuple(c for c, _ in columns)
    return CompiledView(
        view=view.name,
        source=view.source.name,
        key_columns=tuple(view.entity.join_keys),
        key_types=tuple(view.entity.join_keys.values()),
        tile_columns=tile_columns,
        windows=window_specs(view, tile_columns),
        tile_ms=tile_ms(view),
        ttl_ms=milliseconds(view.ttl),
        lateness_ms=lateness_ms(view.source),
        streaming_source=source_relation(view.source, settings.kafka_read,
                                         source_keys or tuple(view.entity.join_keys),
                                         settings.cutovers.get(view.source.name)),
        batch_source_ddl=batch_source_ddl(view.source, settings),
        function_ddl=tuple(sql_functions.function_ddl()),
        tile_query=tile_query(view, columns),
    )
