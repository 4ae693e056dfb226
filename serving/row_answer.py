"""One entity row's HTTP answer written straight from its HMGET replies: Feast's JSON bytes with no columns, no
dicts or lists per feature, and no decoding of a stored value seen before (its JSON text is remembered by its
bytes, as the column decoders remember values) nor of a stored event time seen before (`_Stamp`). Floats, which
rarely repeat, are unpacked and printed together, one call each per float type of the plan (`serving.float_run`).

The usual online request asks for one row; building its `OnlineFeatures` and then Feast's response dict costs
more than reading it from Redis (20 features: 10.5 us to decode, 12 us to answer, warm). The bytes are exactly
those of `orjson.dumps(PreparedRequest.finish(replies).to_feast_response())` (tests/serving/test_row_answer.py);
plans with on-demand views take that general path.
"""

from __future__ import annotations

import math
from operator import add, getitem, itemgetter
from typing import TYPE_CHECKING, Any, Optional

import orjson

from dsl.types import FLOAT_TYPES
from redis_store.decode import ColumnDecoder
from serving.float_run import FloatRun, float_runs
from serving.result import EPOCH, NOT_FOUND, OUTSIDE_MAX_AGE, event_ms, rfc3339
from serving.served_rows import RowOutcome

if TYPE_CHECKING:
    from serving.plan import Plan

_ENTITY_RESULT = b'{"values":[%s],"statuses":["PRESENT"],"event_timestamps":["' + EPOCH.encode() + b'"]}'
_OPEN = b'{"values":['
_NULL = _OPEN + b"null"
_END = b'],"statuses":["%s"],"event_timestamps":["%s"]}'
_NON_FINITE = {"nan": b'"NaN"', "inf": b'"Infinity"', "-inf": b'"-Infinity"'}
_MAX_TEXTS = 20_000  # remembered fragments per decoder, and event times (strings and small integers repeat)
_NULL_TEXT = b""  # a stored null's remembered fragment: the feature's result is then the view's null result
_PRESENT, _MISSING, _STALE = 0, 1, 2  # a view's status in a `RowOutcome`
# per decoder, a stored value's opened result (`{"values":[` and its JSON text), by its stored bytes
_TEXTS: dict[ColumnDecoder, dict[Optional[bytes], bytes]] = {}


class _Stamp:
    """What one stored event time means to a one-row answer, worked out once and remembered by its bytes: the ends
    of a present and a null result of its view (`],"statuses":["PRESENT"],...`, the whole null result), the event
    time in ms for the ttl check and the view's status when within it; `stale` gives the ends for a row too old,
    made on first use (rare)."""

    __slots__ = ("raw", "stamp", "ends", "ms", "status", "too_old")

    def __init__(self, raw: Optional[bytes]):
        self.raw, self.stamp, self.too_old = raw, rfc3339(raw).encode(), None
        if raw is None:  # the entity has no row in this view: its refusal whatever the ttl
            self.ends = (None, _NULL + _END % (NOT_FOUND.encode(), self.stamp))
            self.ms = math.inf
            self.status = _MISSING
            return
        self.ends = (_END % (b"PRESENT", self.stamp), _NULL + _END % (b"NULL_VALUE", self.stamp))
        self.ms = event_ms(raw)
        self.status = _PRESENT

    def stale(self) -> tuple[None, bytes]:
        """The ends of a view whose row is older than its ttl."""
        if self.too_old is None:
            self.too_old = (None, _NULL + _END % (OUTSIDE_MAX_AGE.encode(), self.stamp))
        return self.too_old


# per stored event time (None: no row), what it means to an answer; shared by all plans, as its view's ttl is not in it
_STAMPS: dict[Optional[bytes], _Stamp] = {None: _Stamp(None)}


def value_json(value: Any, floating: bool) -> bytes:
    """A decoded value as Feast's answer holds it: NaN and infinities as protobuf's JSON strings for floats."""
    if value is None:
        return b"null"
    if floating and type(value) is float and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    return orjson.dumps(value)


class RowAnswer:
    """The answer writer of one plan without on-demand views; built once per plan."""

    def __init__(self, plan: Plan):
        self.head = b'{"metadata":{"feature_names":%s},"results":[' % orjson.dumps([*plan.join_keys, *plan.names])
        # group, `_ts` position, ttl and weight (3 ** its index: its status's place in an outcome's number) per view
        self.views: list[tuple[int, int, Optional[int], int]] = []
        self.names: list[str] = []  # of the views
        self.outcomes: dict[int, RowOutcome] = {}  # by number: the sum of each view's status times its weight
        where: dict[str, tuple[int, int, ColumnDecoder, int]] = {}
        for g, group in enumerate(plan.groups):
            for read in group.views:
                for batch in read.batches:
                    for position, name in zip(batch.positions, batch.names):
                        where[name] = (g, position, batch.decode, len(self.views))
                self.views.append((g, read.ts_pos, read.view.ttl_ms, 3 ** len(self.views)))
                self.names.append(read.view.name)
        # per output feature: group, field position, decoder, view, floating, remembered texts (None: floats)
        self.fields = []
        for name in plan.names:
            g, position, decode, view = where[name]
            floating = plan.kinds[name] in FLOAT_TYPES
            texts = None if floating else _TEXTS.setdefault(decode, {})
            self.fields.append((g, position, decode, view, floating, texts))
        # the same per feature as columns, for the look-ups done in C (`map`) over all features at once; a float's
        # texts are an empty dict, never filled, so its look-up always misses
        self.groups, self.positions, self.field_views = (tuple(column) for column in zip(*(
            (g, position, view) for g, position, _, view, _, _ in self.fields))) if self.fields else ((), (), ())
        self.texts = [{} if texts is None else texts for _, _, _, _, _, texts in self.fields]
        self.float_runs = float_runs(plan.names, plan.kinds)

    def sources(self) -> list[tuple[str, int, int, ColumnDecoder]]:
        """Per output feature, in request order: its view, where its value lies in the replies (group, field) and
        its decoder; what the drift sample decodes, in the background, from the replies it kept."""
        return [(self.names[view], g, position, decode) for g, position, decode, view, _, _ in self.fields]

    def encode(self, entities: dict[str, list], replies: list, now_ms: float) -> tuple[bytes, RowOutcome]:
        """The answer's bytes and its outcome (each view's status: the served-rows counts, a constant of the plan)
        for one entity row: per feature, its value's opened result (remembered by its stored bytes, except floats)
        and its view's end (remembered by the view's stored event time) joined. The look-ups and the joining run in
        C over all features at once; only a value not remembered yet (floats always) is written in Python, and a
        row with a null or a missing or stale view is joined feature by feature."""
        ends, refused, number = [], False, 0
        for g, ts_pos, ttl_ms, weight in self.views:
            raw = replies[g][ts_pos]
            stamp = _STAMPS.get(raw)
            if stamp is None:
                stamp = _Stamp(raw)
                if len(_STAMPS) < _MAX_TEXTS:
                    _STAMPS[raw] = stamp
            if ttl_ms and stamp.ms < now_ms - ttl_ms:
                end = stamp.stale()
                number += _STALE * weight
            else:
                end = stamp.ends
                number += stamp.status * weight
            ends.append(end)
            if end[0] is None:  # every feature of the view is its refusal: (None, the null result)
                refused = True
        raws = list(map(getitem, map(replies.__getitem__, self.groups), self.positions))
        opened = list(map(dict.get, self.texts, raws))
        for run in self.float_runs:
            _write_floats(run, opened, raws)
        if None in opened:
            self._write_new(opened, raws, ends)
        dumps = orjson.dumps
        parts = [_ENTITY_RESULT % dumps(values[0]) for values in entities.values()]
        field_ends = list(map(ends.__getitem__, self.field_views))
        if refused or _NULL_TEXT in opened:
            parts += [value + end[0] if value and end[0] is not None else end[1]
                      for value, end in zip(opened, field_ends)]
        else:
            parts += map(add, opened, map(itemgetter(0), field_ends))
        outcome = self.outcomes.get(number)
        if outcome is None:
            outcome = self.outcomes[number] = tuple((name, number // 3 ** v % 3) for v, name in enumerate(self.names))
        return self.head + b",".join(parts) + b"]}", outcome

    def _write_new(self, opened: list, raws: list, ends: list) -> None:
        """Fill in the opened results of the values not remembered (every float, a value seen for the first time),
        remembering those that are no floats; a feature of a missing or stale view is left to its view's refusal."""
        at = 0
        for _ in range(opened.count(None)):
            at = opened.index(None, at)
            _, _, decode, view, floating, texts = self.fields[at]
            if ends[view][0] is None:
                opened[at] = _NULL_TEXT
                continue
            raw = raws[at]
            text = value_json(decode((raw,))[0], floating)
            opened[at] = _NULL_TEXT if text == b"null" else _OPEN + text
            if texts is not None and len(texts) < _MAX_TEXTS:
                texts[raw] = opened[at]


def _write_floats(run: FloatRun, opened: list, raws: list) -> None:
    """Fill in the opened results of a float run's features in `opened`, when every value is plain and finite (NaN
    and infinities are written one by one, as protobuf's JSON strings, by `RowAnswer._write_new`)."""
    values = run.values(raws)
    if values is None:
        return
    texts = orjson.dumps(values)[1:-1].split(b",")
    if b"null" in texts:  # orjson writes NaN and infinities as null
        return
    for at, text in zip(run.at, texts):
        opened[at] = _OPEN + text
