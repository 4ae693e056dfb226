"""One entity row's `get_features` dict written straight from its HMGET replies: the usual SDK call (one row, no
on-demand views) with no columns, `ViewRows` or `OnlineFeatures` on the way. A stored value seen before comes back
by one dict look-up by its bytes, all features at once in C (the column decoders' own tables and remembered strings
cost a call and a list per feature); floats, which rarely repeat, by one `struct` call per float type
(`serving.float_run`); a view's stored event time, for its ttl check, by its bytes too.

The dict equals `PreparedRequest.finish(replies).to_dict()` value for value (tests/serving/test_row_values.py);
plans with on-demand views, and requests of other row counts, take that general path.
"""

from __future__ import annotations

from itertools import repeat
from operator import getitem, itemgetter
from typing import TYPE_CHECKING, Any, Optional, Sequence

from dsl.types import FLOAT_TYPES
from redis_store.decode import ColumnDecoder
from redis_store.layout import NULL
from serving.float_run import float_runs
from serving.result import event_ms

if TYPE_CHECKING:
    from serving.plan import Plan

_UNSEEN = object()  # a look-up's answer for stored bytes not remembered yet
_MAX_REMEMBERED = 20_000  # per decoder, and event times (strings and small integers repeat)
_REMEMBERED_TYPES = {int, float, str, bool, bytes}  # immutable: safe to hand the same object to every caller
# per decoder, the values of stored bytes seen before; a stored null and an absent field are None
_VALUES: dict[ColumnDecoder, dict[Optional[bytes], Any]] = {}
_EVENT_MS: dict[bytes, int] = {}  # a stored `_ts` as epoch milliseconds, for the ttl check


def _nothing() -> dict[Optional[bytes], Any]:
    return {NULL: None, None: None}


def _event_ms(raw: bytes) -> int:
    """`serving.result.event_ms`, remembered by its bytes."""
    ms = _EVENT_MS.get(raw)
    if ms is None:
        ms = event_ms(raw)
        if len(_EVENT_MS) < _MAX_REMEMBERED:
            _EVENT_MS[raw] = ms
    return ms


class RowValues:
    """The dict writer of one plan without on-demand views; built once per plan."""

    def __init__(self, plan: Plan):
        where: dict[str, tuple[int, int, ColumnDecoder]] = {}
        at = {name: i for i, name in enumerate(plan.names)}
        # per view: its group, its `_ts` position, its ttl and where its features lie in the answer
        self.views: list[tuple[int, int, Optional[int], list[int]]] = []
        for g, group in enumerate(plan.groups):
            for read in group.views:
                for batch in read.batches:
                    where.update((name, (g, position, batch.decode))
                                 for position, name in zip(batch.positions, batch.names))
                self.views.append((g, read.ts_pos, read.view.ttl_ms, [at[name] for name in read.names]))
        self.names = plan.names
        fields = [where[name] for name in plan.names]
        self.groups = [g for g, _, _ in fields]
        self.positions = [position for _, position, _ in fields]
        self.decoders = [decode for _, _, decode in fields]
        # one hash (the usual plan) and more than one feature: the row's stored values picked by one C call
        self.pick = itemgetter(*self.positions) if len(plan.groups) == 1 and len(fields) > 1 else None
        # where each feature's decoded values are remembered; None for floats, which come from their runs
        self.learned = [None if plan.kinds[name] in FLOAT_TYPES else _VALUES.setdefault(decode, _nothing())
                        for name, (_, _, decode) in zip(plan.names, fields)]
        # a float's look-up answers only a null or an absent field
        self.remembered = [_nothing() if learned is None else learned for learned in self.learned]
        self.float_runs = float_runs(plan.names, plan.kinds)

    def values(self, entities: dict[str, list], replies: list, now_ms: float) -> dict[str, list]:
        """Join key columns first, then each feature's one-value list in request order; None for a null, and for
        every feature of a view with no row or a row older than its ttl at `now_ms`."""
        pick = self.pick
        raws = pick(replies[0]) if pick else list(map(getitem, map(replies.__getitem__, self.groups), self.positions))
        values = list(map(dict.get, self.remembered, raws, repeat(_UNSEEN)))
        for run in self.float_runs:
            unpacked = run.values(raws)
            if unpacked is not None:
                for at, value in zip(run.at, unpacked):
                    values[at] = value
        if _UNSEEN in values:
            self._decode_new(values, raws)
        for g, ts_pos, ttl_ms, features in self.views:
            raw = replies[g][ts_pos]
            if raw is None or (ttl_ms and _event_ms(raw) < now_ms - ttl_ms):
                for at in features:
                    values[at] = None
        out = dict(entities)
        out.update(zip(self.names, [[value] for value in values]))
        return out

    def _decode_new(self, values: list, raws: Sequence[Optional[bytes]]) -> None:
        """Decode the values not remembered (floats that are no plain run, values seen for the first time) with their
        feature's column decoder, remembering the immutable ones."""
        at = 0
        for _ in range(values.count(_UNSEEN)):
            at = values.index(_UNSEEN, at)
            raw = raws[at]
            value = values[at] = self.decoders[at]((raw,))[0]
            learned = self.learned[at]
            if learned is not None and type(value) in _REMEMBERED_TYPES and len(learned) < _MAX_REMEMBERED:
                learned[raw] = value
