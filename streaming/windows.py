"""Tiles -> window values for one view, incrementally: the streaming side of `dsl.aggregates`' window semantics.

The clock is the view's latest tile: the tile of the greatest event time seen on its source (`current`). The
served value of a window of W tiles is its value at boundary (current + 1) * tile, i.e. over the tiles
[current - W + 1, current]: the still-open tile counts, and once it closes the value is the boundary value.
When the clock moves to a later tile, tiles leave windows for every entity that has them, whether or not that
entity has new events; tiles older than the longest window are dropped.

Per entity and window length the writer keeps one accumulator per tile column: integer sums move by deltas,
min/max/last/HLL only grow while the window's tiles do (a tile update always carries more events than the one it
replaces, see `apply`) and are rebuilt from the remaining tiles when a tile leaves. Float sums are re-added with
`math.fsum` (exact, in any order). Final values come from `dsl.aggregates.finalize`, as in every other runtime.

Each entity is written with the boundary of its last change as `_ts` (`_Entity.changed`): the boundary at which a
tile of it entered its windows (the tile's end) or left one, whichever is later by the clock, which is where the
backfill puts the entity's latest row. It is the greatest such boundary over every tile seen, so it does not
depend on the order tile updates come in: a restart, which reads the history tiles and the tile topics again,
writes each entity with the `_ts` the running stream gave it, and a start from history ages an entity from its
last change, as a training row does. (An entity forgotten once its tiles left every window and seen again may get a
change before the `_ts` it was last written with: Redis refuses that write, and the writer sends it again at the
`_ts` Redis holds, which is then still the entity's last change.)

A stream with history starts from the batch side's tiles of the same compiled query (`load_history`): the tiles
before its source's cutover. The tile holding the cutover, when it does not start there, has events on both
sides: its batch part (events before the cutover) is kept as a base that the stream's updates of that tile are
combined with, so the tile counts every event once.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from dsl import aggregates, sketch
from dsl.compile_flink import CLOCK_COLUMN, EVENTS_COLUMN, CompiledView
from dsl.types import ValueType
from streaming.hll import HllUnion, estimates

SUM_INT, SUM_FLOAT, MIN, MAX, LAST, HLL, BOOKKEEPING = range(7)
_MERGES = {"min": MIN, "max": MAX, "last": LAST, "hll": HLL}


@dataclass(frozen=True)
class FeatureSlot:
    """One served feature: `op` over the window in `slot`, reading tile columns (by partial suffix -> index)."""

    name: str
    op: str
    kind: ValueType
    slot: int
    columns: dict[str, int]


class ViewLayout:
    """What the writer needs to know about a view: tile size, window lengths, features, tile column merges; all
    from its compiled form."""

    def __init__(self, compiled: CompiledView):
        self.name = compiled.view
        self.tile_ms = compiled.tile_ms
        self.key_columns = compiled.key_columns
        self.join_keys = dict(zip(compiled.key_columns, compiled.key_types))
        self.column_names = [c.name for c in compiled.tile_columns]
        index = {name: j for j, name in enumerate(self.column_names)}
        self.events_column, self.clock_column = index[EVENTS_COLUMN], index[CLOCK_COLUMN]
        self.merges = [self._merge(c) for c in compiled.tile_columns]
        self.hll_columns = [j for j, m in enumerate(self.merges) if m == HLL]
        self.lengths = sorted({w.tiles for w in compiled.windows})
        self.specs = [FeatureSlot(w.name, w.op, w.kind, self.lengths.index(w.tiles),
                                  {suffix: index[column] for suffix, column in w.partials.items()})
                      for w in compiled.windows]
        self.slot_columns = [sorted({j for s in self.specs if s.slot == k for j in s.columns.values()})
                             for k in range(len(self.lengths))]
        self.longest = self.lengths[-1]

    @staticmethod
    def _merge(column) -> int:
        if column.name in (EVENTS_COLUMN, CLOCK_COLUMN):
            return BOOKKEEPING
        if column.partial.merge == "sum":
            return SUM_INT if column.sql_type in ("BIGINT", "INT") else SUM_FLOAT
        return _MERGES[column.partial.merge]

    @property
    def feature_names(self) -> list[str]:
        return [s.name for s in self.specs]

    def combine(self, base: tuple, part: tuple) -> tuple:
        """One tile from its two parts: `base` (events before the cutover) and `part` (events at or after it)."""
        out = []
        for j, (a, b) in enumerate(zip(base, part)):
            merge = self.merges[j]
            if a is None or b is None:
                out.append(b if a is None else a)
            elif merge in (SUM_INT, SUM_FLOAT) or j == self.events_column:
                out.append(a + b)
            elif merge == MIN:
                out.append(min(a, b))
            elif merge == HLL:
                out.append(sketch.merge_sketches([a, b]))
            else:  # MAX, the clock, and LAST: every event of `part` is later than every event of `base`
                out.append(b if merge == LAST else max(a, b))
        return tuple(out)


class _Entity:
    __slots__ = ("tiles", "acc", "changed")

    def __init__(self, layout: ViewLayout):
        self.tiles: dict[int, tuple] = {}  # tile index (start // tile) -> tile column values
        self.acc: list[list[Any]] = [_empty_accumulators(layout, k) for k in range(len(layout.lengths))]
        self.changed = 0  # ms: the boundary of its last change, the `_ts` it is written with (module docstring)


def _empty_accumulators(layout: ViewLayout, slot: int) -> list[Any]:
    acc: list[Any] = [None] * len(layout.merges)
    for j in layout.slot_columns[slot]:
        if layout.merges[j] == SUM_INT:
            acc[j] = 0
    return acc


class WindowState:
    """All entities of one view; `apply` tile updates, then `take_dirty` the rows whose values changed."""

    def __init__(self, layout: ViewLayout):
        self.layout = layout
        self.entities: dict[tuple, _Entity] = {}
        self.index: dict[int, set[tuple]] = {}  # tile index -> entities holding that tile
        self.current: Optional[int] = None
        self.head_ms: Optional[int] = None  # greatest event time seen
        self.dirty: set[tuple] = set()
        self.bases: dict[tuple[tuple, int], tuple] = {}  # (entity, tile) -> batch part of the cutover's tile
        self.refused: list[tuple[int, tuple]] = []  # heap of (Redis's `_ts`, entity) whose write it refused
        self.retried: dict[tuple, int] = {}  # refused entities due again -> the `_ts` Redis held
        # Per feature: op, window slot, (partial suffix, tile column) pairs, and a reused input of `finalize`.
        self._plan = [(s.op, s.slot, tuple(s.columns.items()), {}) for s in layout.specs]

    def load_history(self, rows: Iterable[tuple[tuple, int, tuple]], cutover_ms: int) -> int:
        """Seed the windows with the batch side's tiles (key, tile start, values) of events before `cutover_ms`,
        before any stream update; returns the entities seeded, every one of them then to be written. The clock
        starts at the greatest event time of the history. Tiles older than every window still date an entity's
        last change (where they left a window); an entity with no tile left in a window is written once with
        empty windows, as a stream running since the cutover would have written it when its last tile left."""
        layout = self.layout
        straddled = cutover_ms // layout.tile_ms if cutover_ms % layout.tile_ms else None
        by_entity: dict[tuple, dict[int, tuple]] = {}
        head = self.head_ms
        for key, tile_start, values in rows:
            tile = tile_start // layout.tile_ms
            by_entity.setdefault(key, {})[tile] = values
            clock = values[layout.clock_column]
            if clock is not None and (head is None or clock > head):
                head = clock
            if tile == straddled:
                self.bases[(key, tile)] = values
        if head is None:
            return 0
        self.head_ms = head
        self.advance(head // layout.tile_ms)
        first = self.current - layout.longest + 1
        for key, tiles in by_entity.items():
            kept = {t: v for t, v in tiles.items() if first <= t <= self.current}
            entity = self.entities[key] = _Entity(layout)  # none kept: written once, empty, at where they left
            entity.tiles = kept
            entity.changed = max(self._changed_by(t) for t in tiles if t <= self.current)
            for t in kept:
                self.index.setdefault(t, set()).add(key)
            for slot in range(len(layout.lengths)):
                self._rebuild(entity, slot, sums=True)
            self.dirty.add(key)
        return len(self.dirty)

    def apply(self, key: tuple, tile_start: int, values: tuple) -> int:
        """Take one tile update; returns the events it adds, 0 when it is stale (no more events than the version
        held) or outside every window. A replay after a restart re-sends older versions of tiles: they carry fewer
        events and are skipped, so values never move back."""
        layout = self.layout
        tile = tile_start // layout.tile_ms
        clock = values[layout.clock_column]
        if clock is not None and (self.head_ms is None or clock > self.head_ms):
            self.head_ms = clock
        if self.current is None or tile > self.current:
            self.advance(tile)
        entity = self.entities.get(key)
        if tile <= self.current - layout.longest:
            # a tile that left every window before it came (a replay's, or events behind the clock from a trailing
            # partition): where it left still dates its entity, and an entity known by it alone is written once
            # with empty windows, as it would have been had the tile come in time
            changed = self._changed_by(tile)
            if entity is None:
                entity = self.entities[key] = _Entity(layout)
            if changed > entity.changed:
                entity.changed = changed
                self.dirty.add(key)
            return 0
        if entity is None:
            entity = self.entities[key] = _Entity(layout)
        if self.bases:
            base = self.bases.get((key, tile))
            if base is not None:
                values = layout.combine(base, values)
        old = entity.tiles.get(tile)
        events = layout.events_column
        if old is not None and values[events] <= old[events]:
            return 0
        entity.tiles[tile] = values
        self.index.setdefault(tile, set()).add(key)
        deltas = {j: sketch.raised_entries(values[j], old[j] if old is not None else None)
                  for j in layout.hll_columns if values[j]}
        for slot, length in enumerate(layout.lengths):
            if tile > self.current - length:
                self._add(entity.acc[slot], slot, tile, values, old, entity, deltas)
        entity.changed = max(entity.changed, self._changed_by(tile))
        self.dirty.add(key)
        return values[events] - (old[events] if old is not None else 0)

    def _changed_by(self, tile: int) -> int:
        """The boundary of the last change a tile made to its entity's windows by the clock's tile: where it
        entered them (its end), or where it left the longest window it has left."""
        gone = [length for length in self.layout.lengths if tile + length <= self.current]
        return (tile + 1 + (max(gone) if gone else 0)) * self.layout.tile_ms

    def _add(self, acc: list, slot: int, tile: int, new: tuple, old: Optional[tuple], entity: _Entity,
             deltas: dict) -> None:
        merges = self.layout.merges
        for j in self.layout.slot_columns[slot]:
            value, merge = new[j], merges[j]
            if merge == SUM_INT:
                acc[j] += (value or 0) - ((old[j] or 0) if old is not None else 0)
            elif value is None:
                continue
            elif merge == MAX:
                if acc[j] is None or value > acc[j]:
                    acc[j] = value
            elif merge == MIN:
                if acc[j] is None or value < acc[j]:
                    acc[j] = value
            elif merge == LAST:
                if acc[j] is None or tile >= acc[j][0]:
                    acc[j] = (tile, value)
            elif merge == HLL:
                if acc[j] is None:
                    acc[j] = HllUnion()
                acc[j].add_entries(*deltas[j])
            elif merge == SUM_FLOAT:
                acc[j] = self._fsum(entity, slot, j)

    def _window_tiles(self, entity: _Entity, slot: int) -> list[tuple[int, tuple]]:
        """The entity's tiles inside the window of `slot`, in time order."""
        first = self.current - self.layout.lengths[slot] + 1
        return sorted((t, v) for t, v in entity.tiles.items() if t >= first)

    def _fsum(self, entity: _Entity, slot: int, j: int) -> Optional[float]:
        values = [v[j] for _, v in self._window_tiles(entity, slot) if v[j] is not None]
        return math.fsum(values) if values else None

    def follow(self, head_ms: Optional[int]) -> None:
        """Take the view's clock from the other window writers (each holds the tiles of its own entities): every
        entity here slides as it would had their tiles come through this writer."""
        if head_ms is not None and (self.head_ms is None or head_ms > self.head_ms):
            self.head_ms = head_ms
            self.advance(head_ms // self.layout.tile_ms)

    def advance(self, tile: int) -> None:
        """Move the clock to `tile`: tiles leave the windows they no longer belong to, for every entity."""
        previous = self.current
        if previous is not None and tile <= previous:
            return
        self.current = tile
        if previous is None:
            return
        touched: dict[tuple, set[int]] = {}
        for slot, length in enumerate(self.layout.lengths):
            first_gone, last_gone = previous - length + 1, tile - length
            for t in [t for t in self.index if first_gone <= t <= last_gone]:
                gone_ms = (t + length + 1) * self.layout.tile_ms
                for key in self.index[t]:
                    entity = self.entities[key]
                    self._subtract(entity.acc[slot], slot, entity.tiles[t])
                    entity.changed = max(entity.changed, gone_ms)
                    touched.setdefault(key, set()).add(slot)
        for t in [t for t in self.index if t <= tile - self.layout.longest]:
            for key in self.index.pop(t):
                del self.entities[key].tiles[t]
                self.bases.pop((key, t), None)
        for key, slots in touched.items():
            entity = self.entities[key]
            for slot in slots:
                self._rebuild(entity, slot)
            self.dirty.add(key)

    def _subtract(self, acc: list, slot: int, values: tuple) -> None:
        for j in self.layout.slot_columns[slot]:
            if self.layout.merges[j] == SUM_INT:
                acc[j] -= values[j] or 0

    def _rebuild(self, entity: _Entity, slot: int, sums: bool = False) -> None:
        """Recompute the accumulators that cannot subtract (all but integer sums, unless `sums`) from the window's
        tiles."""
        acc = entity.acc[slot]
        tiles = self._window_tiles(entity, slot)
        for j in self.layout.slot_columns[slot]:
            merge = self.layout.merges[j]
            if merge == SUM_INT:
                if sums:
                    acc[j] = sum(values[j] or 0 for _, values in tiles)
                continue
            if merge == SUM_FLOAT:
                acc[j] = self._fsum(entity, slot, j)
                continue
            present = [(t, values[j]) for t, values in tiles if values[j] is not None]
            if not present:
                acc[j] = None
            elif merge == MAX:
                acc[j] = max(value for _, value in present)
            elif merge == MIN:
                acc[j] = min(value for _, value in present)
            elif merge == LAST:
                acc[j] = present[-1]  # tiles come in time order
            else:  # HLL
                acc[j] = HllUnion()
                acc[j].add_many(value for _, value in present)

    def write_again_at(self, key: tuple, stored_ms: int) -> None:
        """Redis refused this entity's values: it holds a later `_ts` (`stored_ms`), from materialization ahead of
        the clock. Write them again at that `_ts` once the served boundary reaches it, so it does not keep those
        values when its own change before that instant is the last it has."""
        heapq.heappush(self.refused, (stored_ms, key))

    @property
    def served_ms(self) -> Optional[int]:
        """The boundary the served values are at: the end of the clock's tile."""
        return None if self.current is None else (self.current + 1) * self.layout.tile_ms

    def take_dirty(self) -> list[tuple[tuple, list[Any], int]]:
        """(key, feature values, `_ts` in ms) of every entity whose values may have changed since the last call,
        or whose refused write is due again; entities left without tiles are written once (empty windows) and
        forgotten. The `_ts` is the boundary of the entity's last change, or the later `_ts` Redis held when it
        refused the entity's write (`write_again_at`) and the served boundary has reached it."""
        served = self.served_ms
        while self.refused and served is not None and self.refused[0][0] <= served:
            stored, key = heapq.heappop(self.refused)
            self.dirty.add(key)
            self.retried[key] = max(stored, self.retried.get(key, stored))
        rows: list[tuple[tuple, list[Any], int]] = []
        pending: list[tuple[list[Any], int, HllUnion]] = []
        for key in self.dirty:
            entity = self.entities.get(key)
            if entity is None:
                continue
            values = self._values(entity, pending)
            rows.append((key, values, max(entity.changed, self.retried.get(key, 0))))
            if not entity.tiles:
                del self.entities[key]
        for (values, i, _), estimate in zip(pending, estimates([u for _, _, u in pending])):
            values[i] = estimate
        self.dirty = set()
        self.retried = {}
        return rows

    def _values(self, entity: _Entity, pending: list) -> list[Any]:
        out: list[Any] = []
        acc = entity.acc
        for op, slot, columns, merged in self._plan:
            if op == "approx_distinct":
                union = acc[slot][columns[0][1]]
                if union is not None:
                    pending.append((out, len(out), union))
                out.append(0)  # an empty window counts 0 distinct values
                continue
            window = acc[slot]
            for suffix, j in columns:
                value = window[j]
                merged[suffix] = value[1] if type(value) is tuple else value  # a `last` is (tile, value)
            out.append(aggregates.finalize(op, merged))
        return out

    def tiles_held(self) -> int:
        return sum(len(keys) for keys in self.index.values())


