"""One entity row's HTTP answer written straight from its HMGET replies: Feast's JSON bytes with no columns, no
dicts or lists per feature, and no decoding of a stored value seen before (its JSON text is remembered by its
bytes, as the column decoders remember values).

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

from dsl.types import ValueType
from redis_store.decode import ColumnDecoder
from serving.result import EPOCH, NOT_FOUND, OUTSIDE_MAX_AGE, ViewRows, view_row

if TYPE_CHECKING:
    from serving.plan import Plan

_FLOATS = (ValueType.FLOAT32, ValueType.FLOAT64)
_ENTITY_RESULT = b'{"values":[%s],"statuses":["PRESENT"],"event_timestamps":["' + EPOCH.encode() + b'"]}'
_OPEN = b'{"values":['
_NULL = _OPEN + b"null"
_END = b'],"statuses":["%s"],"event_timestamps":["%s"]}'
_NON_FINITE = {"nan": b'"NaN"', "inf": b'"Infinity"', "-inf": b'"-Infinity"'}
_MAX_TEXTS = 20_000  # remembered fragments per decoder (strings and small integers repeat; floats rarely do)
_NULL_TEXT = b""  # a stored null's remembered fragment: the feature's result is then the view's null result
# per decoder, a stored value's opened result (`{"values":[` and its JSON text), by its stored bytes
_TEXTS: dict[ColumnDecoder, dict[Optional[bytes], bytes]] = {}
# per stored event time, the ends of a present and a null result of its view: (`],"statuses":["PRESENT"],...`,
# the whole null result)
_ENDS: dict[bytes, tuple[bytes, bytes]] = {}


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
        self.views: list[tuple[int, int, Optional[int], str]] = []  # group, `_ts` position, ttl, view name
        where: dict[str, tuple[int, int, ColumnDecoder, int]] = {}
        for g, group in enumerate(plan.groups):
            for read in group.views:
                for batch in read.batches:
                    for position, name in zip(batch.positions, batch.names):
                        where[name] = (g, position, batch.decode, len(self.views))
                self.views.append((g, read.ts_pos, read.view.ttl_ms, read.view.name))
        # per output feature: group, field position, decoder, view, floating, remembered texts (None: floats)
        self.fields = []
        for name in plan.names:
            g, position, decode, view = where[name]
            floating = plan.kinds[name] in _FLOATS
            texts = None if floating else _TEXTS.setdefault(decode, {})
            self.fields.append((g, position, decode, view, floating, texts))
        # the same per feature as columns, for the look-ups done in C (`map`) over all features at once; a float's
        # texts are an empty dict, never filled, so its look-up always misses
        self.groups, self.positions, self.field_views = (tuple(column) for column in zip(*(
            (g, position, view) for g, position, _, view, _, _ in self.fields))) if self.fields else ((), (), ())
        self.texts = [{} if texts is None else texts for _, _, _, _, _, texts in self.fields]

    def sources(self) -> list[tuple[str, int, int, ColumnDecoder]]:
        """Per output feature, in request order: its view, where its value lies in the replies (group, field) and
        its decoder; what the drift sample decodes, in the background, from the replies it kept."""
        return [(self.views[view][3], g, position, decode) for g, position, decode, view, _, _ in self.fields]

    def encode(self, entities: dict[str, list], replies: list, now_ms: float) -> tuple[bytes, dict[str, ViewRows]]:
        """The answer's bytes and each view's row (the served-rows counts) for one entity row: per feature, its
        value's opened result (remembered by its stored bytes, except floats) and its view's end (remembered by the
        view's stored event time) joined. The look-ups and the joining run in C over all features at once; only a
        value not remembered yet (floats always) is written in Python, and a row with a null or a missing or stale
        view is joined feature by feature."""
        views, ends, refused = {}, [], False
        for g, ts_pos, ttl_ms, name in self.views:
            raw = replies[g][ts_pos]
            rows = views[name] = view_row(raw, ttl_ms, now_ms)
            if rows.missing or rows.stale:  # every feature of the view is its refusal: (None, the null result)
                stamp = rows.timestamps()[0].encode()
                ends.append((None, _NULL + _END % (NOT_FOUND.encode() if rows.missing else OUTSIDE_MAX_AGE.encode(),
                                                   stamp)))
                refused = True
                continue
            end = _ENDS.get(raw)
            if end is None:
                stamp = rows.timestamps()[0].encode()
                end = (_END % (b"PRESENT", stamp), _NULL + _END % (b"NULL_VALUE", stamp))
                if len(_ENDS) < _MAX_TEXTS:
                    _ENDS[raw] = end
            ends.append(end)
        raws = list(map(getitem, map(replies.__getitem__, self.groups), self.positions))
        opened = list(map(dict.get, self.texts, raws))
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
        return self.head + b",".join(parts) + b"]}", views

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
