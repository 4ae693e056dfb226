"""Where a push goes: a push source name resolved against the repo's definitions and the registry.

- An event source of the DSL, by its name: the rows are events. They go to its Kafka topic, where the running
  stream counts them like any other event, so every window stays exact, and/or to its Parquet history.
- `{view}_push`, the Feast push source `featurectl apply` registers for each view: taken for a view of attributes
  only (no windows), whose rows are the values themselves, written online in Feast's layout. A windowed view's
  values are windows over events, which no pushed row can keep exact (the stream's next write would replace it),
  so its push source is refused with the name of the source to push the events to.

Source names are looked up first: a source named like a view's push source takes the push.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Union

from common.errors import shown
from dsl.compile_feast import EVENT_TIMESTAMP, push_source_name
from dsl.compile_stream_source import source_keys
from dsl.feature_view import FeatureView
from dsl.repo import Repository
from dsl.source import EventSource
from dsl.types import FeatureType, ValueType
from serving.catalog import Catalog, ViewSpec
from serving.errors import RequestError


class UnknownPushSourceError(RequestError):
    code = "unknown_push_source"


class PushRefusedError(RequestError):
    """The push source exists but cannot take this push (a windowed view, a mode it has no place for, a view not
    applied); the message says what to push where instead."""

    code = "push_refused"


@dataclass(frozen=True)
class EventTarget:
    """Events of a source; every view of the repo that reads the source needs its join keys in each event."""

    source: EventSource
    key_columns: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def schema(self) -> dict[str, FeatureType]:
        return dict(self.source.schema)

    @property
    def columns_needed(self) -> tuple[str, ...]:
        """None: an event leaves out a column it has no value for."""
        return ()

    @property
    def required(self) -> dict[str, str]:
        """Column -> why every event needs a value in it, as the stream's parser does (`missing_field`)."""
        out = {key: "a join key of the views reading it" for key in self.key_columns}
        out[self.source.timestamp_field] = "its event time, epoch milliseconds"
        return out


@dataclass(frozen=True)
class ViewTarget:
    """Values of an attribute view, as Feast pushes them: join keys, every feature, `event_timestamp`."""

    name: str
    view: FeatureView
    spec: ViewSpec  # the registry's: storage name, hash fields and `_ts` field as readers see them

    @property
    def schema(self) -> dict[str, FeatureType]:
        return {**self.view.entity.join_keys, **self.view.output_schema(), EVENT_TIMESTAMP: ValueType.TIMESTAMP}

    @property
    def columns_needed(self) -> tuple[str, ...]:
        """Every feature, null where there is no value: a row replaces all of the entity's values at once."""
        return tuple(self.view.feature_names)

    @property
    def required(self) -> dict[str, str]:
        out = {key: "a join key of the view" for key in self.view.entity.join_keys}
        out[EVENT_TIMESTAMP] = "when the values became true, epoch milliseconds or ISO 8601"
        return out


PushTarget = Union[EventTarget, ViewTarget]


class PushTargets:
    """The push sources of one repo: its event sources and its views' push sources."""

    def __init__(self, repo: Repository):
        self.sources = {s.name: EventTarget(s, source_keys(s, repo.views)) for s in repo.sources}
        self.views = {push_source_name(v): v for v in repo.views}

    def resolve(self, name: str, catalog: Catalog) -> PushTarget:
        if name in self.sources:
            return self.sources[name]
        view = self.views.get(name)
        if view is None:
            raise UnknownPushSourceError(self._unknown(name))
        if view.aggregations:
            raise PushRefusedError(f"`{name}` is the push source of `{view.name}`, whose features are windows over "
                                   f"the events of source `{view.source.name}`: a pushed value is no window of them "
                                   f"and the stream's next write would replace it. Push the events to "
                                   f"`{view.source.name}` instead (its columns: {', '.join(view.source.schema)})")
        spec = catalog.views.get(view.name)
        if spec is None or set(spec.features) != set(view.feature_names):
            state = "is not in the registry" if spec is None else "has other features in the registry than here"
            raise PushRefusedError(f"feature view `{view.name}` {state}: run `featurectl apply`, then push again")
        return ViewTarget(name, view, spec)

    def _unknown(self, name: str) -> str:
        attributes = [n for n, v in self.views.items() if not v.aggregations]
        close = difflib.get_close_matches(name, [*self.sources, *self.views], 1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return (f"no push source {shown(name)}{hint}. Push events to an event source "
                f"({', '.join(f'`{s}`' for s in self.sources) or 'none'}) or values of an attribute view to its push "
                f"source ({', '.join(f'`{v}`' for v in attributes) or 'none'})")
