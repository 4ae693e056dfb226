"""Push: rows written to a push source, from the SDK (`client.push`) or `POST /push` (Feast's request shape).

- an event source `S`, `online`: the events into S's Kafka topic, where the running stream counts them (windows
  stay exact); `offline`: the events appended to S's Parquet history (`serving.push_history`).
- `{view}_push` of an attribute view, `online`: the values into Redis in Feast's layout, event-time guarded, with
  `key_ttl_seconds`; `offline` is refused, the view's offline table being the backfill's.
- `{view}_push` of a windowed view: refused, naming the source to push the events to (`serving.push_targets`).
- a view with a vector feature: once Redis holds the rows, they are indexed for search too (`serving.vector_index`).

Every row is checked first (`serving.push_rows`), and a push with a bad row writes nothing. Then, for events, the
history file is written before Kafka is asked, so a failure there sends nothing; Kafka's answer comes per event
(`common.event_producer`): when it takes none of them, the history file just written is removed again, so the push
can simply be repeated. `Pusher` does everything but the Redis round trip, which the sync and async clients make
on their own connections, as for reads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from common.event_producer import EventDeliveryError, EventProducer
from common.instants import InstantError, parse_instant
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.compile_flink import source_path
from redis_store import freshness, guarded, layout
from serving.catalog import Catalog
from serving.errors import PushUnavailableError
from serving.push_history import append_events
from serving.push_request import check_source_and_mode
from serving.push_rows import PushRowError, PushRows, check_columns, check_event_times, columns_of, epoch_ms
from serving.push_targets import EventTarget, PushRefusedError, PushTarget, PushTargets, ViewTarget

DELIVERY_TIMEOUT_S = 10.0  # how long Kafka may take to acknowledge pushed events before the push fails


@dataclass
class PushResult:
    """What a push wrote: events taken by Kafka, the history file, rows applied online and rows Redis already held
    something newer for."""

    push_source_name: str
    to: str
    rows: int
    events_sent: int = 0
    history_file: Optional[str] = None
    online_written: int = 0
    online_older_skipped: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"status": "ok", **asdict(self)}


@dataclass
class PreparedPush:
    """A checked push: its events (an event source) or its Redis commands (an attribute view): one per row, then
    `records` (0 or 1) raising the view's newest event time (`redis_store.freshness`)."""

    target: PushTarget
    to: str
    rows: int
    events: list[dict] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    commands: list[bytes] = field(default_factory=list)
    records: int = 0
    vectors: Optional[tuple[dict[str, list], list[int]]] = None  # (columns, event ms) to index after Redis

    def finish(self, replies: Sequence[list], sent: int, history: Optional[Path]) -> PushResult:
        """The result, from the guarded writes' replies (a refused row comes back as [position, Redis's _ts])."""
        replies = replies[:len(replies) - self.records]
        skipped = sum(1 for reply in replies if reply)
        return PushResult(self.target.name, self.to, self.rows, sent, history.name if history else None,
                          len(replies) - skipped, skipped)


class Pusher:
    """The push sources of one repo and the means to write to them, but Redis; built on a client's first push."""

    def __init__(self, repo_path: Path):
        from common.config import load_config
        from dsl.repo import load_repo

        config = load_config(repo_path)
        self.config = config
        self._index: Optional[Any] = None
        self.targets = PushTargets(load_repo(config.repo_path))
        self.key_ttl_s = config.key_ttl_seconds
        self.bootstrap_servers = config.platform.kafka.bootstrap_servers
        self.delivery_timeout_s = DELIVERY_TIMEOUT_S
        self._producer: Optional[EventProducer] = None
        self._lock = threading.Lock()

    def prepare(self, catalog: Catalog, name: Any, rows: PushRows, to: str = "online") -> PreparedPush:
        """Resolve and check everything; nothing is written yet."""
        check_source_and_mode(name, to)
        target = self.targets.resolve(name, catalog)
        columns = columns_of(rows)
        if isinstance(target, ViewTarget):
            return self._prepare_values(catalog, target, columns, to)
        count = check_columns(columns, target.schema, target.required, f"source `{target.name}`")
        check_event_times(target.source.timestamp_field, columns[target.source.timestamp_field], _now_ms())
        if to != "offline" and not target.source.kafka_topic:
            raise PushRefusedError(f"source `{target.name}` has no kafka_topic, so no stream reads it: push with "
                                   "`to: offline` to append the events to its history, or give it a kafka_topic")
        names = list(columns)
        events = [dict(zip(names, values)) for values in zip(*columns.values())]
        return PreparedPush(target, to, count, events=events)

    def _prepare_values(self, catalog: Catalog, target: ViewTarget, columns: dict[str, list],
                        to: str) -> PreparedPush:
        if to != "online":
            raise PushRefusedError(
                f"`{target.name}` takes `to: online` only: the offline table of `{target.view.name}` is the "
                "backfill's (`featurectl backfill` replaces its date partitions), so a pushed row would be lost or "
                f"break it. To keep history, push the events to source `{target.view.source.name}` with "
                "`to: online_and_offline` and run `featurectl backfill`")
        if EVENT_TIMESTAMP in columns:
            columns[EVENT_TIMESTAMP] = [_instant_ms(i, v) for i, v in enumerate(columns[EVENT_TIMESTAMP])]
        count = check_columns(columns, target.schema, target.required, f"push source `{target.name}`",
                              target.columns_needed)
        times = columns[EVENT_TIMESTAMP]
        check_event_times(EVENT_TIMESTAMP, times, _now_ms())
        spec = target.spec
        encoder = layout.KeyEncoder(catalog.project, dict(spec.join_keys))
        keys = encoder.keys([columns[k] for k in encoder.order])
        names = list(spec.features)
        fields = [spec.features[n].field for n in names]
        kinds = [target.schema[n] for n in names]
        commands = []
        for row, key in enumerate(keys):
            values = [layout.encode_value(columns[n][row], kind) for n, kind in zip(names, kinds)]
            commands += guarded.commands([key], times[row], spec.ts_field, fields, [values], self.key_ttl_s,
                                         inline=True)
        if not keys:
            return PreparedPush(target, to, count)
        keys.append(freshness.record_key(catalog.project))
        commands.append(freshness.record_command(catalog.project, {spec.name: max(times)}))
        vectors = (columns, times) if target.view.vector_features else None
        return PreparedPush(target, to, count, keys=keys, commands=commands, records=1, vectors=vectors)

    def write_events(self, prepared: PreparedPush) -> tuple[int, Optional[Path]]:
        """Blocking: the history file (offline), then Kafka (online); returns (events Kafka took, the file). For
        a view's values (already in Redis): their vectors into the index, when the view has any."""
        target = prepared.target
        if not isinstance(target, EventTarget):
            if prepared.vectors is not None:
                self.vector_index().write(target.view, *prepared.vectors)
            return 0, None
        history = None
        if prepared.to != "online":
            data_dir = self.config.local_data_dir("a push to a source's history")
            history = append_events(source_path(target.source, data_dir), target.source, prepared.events)
        if prepared.to == "offline":
            return 0, history
        try:
            return self.producer().deliver(target.source.kafka_topic, prepared.events, target.key_columns), history
        except EventDeliveryError as exc:
            raise PushUnavailableError(_not_taken(exc, history)) from exc

    def vector_index(self):
        """The project's vector index (`serving.vector_common.open_index`), opened on the first push of a vector
        view."""
        with self._lock:
            if self._index is None:
                from serving.vector_common import open_index

                self._index = open_index(self.config)
            return self._index

    def producer(self) -> EventProducer:
        with self._lock:
            if self._producer is None:
                self._producer = EventProducer(self.bootstrap_servers, self.delivery_timeout_s)
            return self._producer

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.delivery_timeout_s)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _instant_ms(row: int, value: Any) -> Any:
    """`event_timestamp` as Feast's clients send it: epoch ms, or ISO 8601 text (UTC unless it has an offset)."""
    if not isinstance(value, str):
        return value
    try:
        return epoch_ms(parse_instant(value, EVENT_TIMESTAMP))
    except InstantError as exc:
        raise PushRowError(f"row {row}, column `{EVENT_TIMESTAMP}`: {exc.reason}") from None


def _not_taken(exc: EventDeliveryError, history: Optional[Path]) -> str:
    """What a failed delivery left behind, and whether pushing again is safe."""
    if exc.delivered == 0:
        if history is not None:
            history.unlink(missing_ok=True)
        return f"{exc}; nothing was written: push the same rows again once Kafka is back"
    rows = ", ".join(map(str, exc.failed[:20])) + (" ..." if len(exc.failed) > 20 else "")
    kept = f"; the history file {history.name} holds all of them" if history is not None else ""
    return (f"{exc}; {exc.delivered} were taken{kept}. Push again only the rows not taken (rows {rows}) with "
            "`to: online`, or the stream counts the others twice")
