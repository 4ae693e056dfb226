"""Tiles -> window values at the boundaries where they change: the rows of a view's offline feature table.

Semantics are those of `dsl.aggregates`: the value of window W at boundary b covers the tiles starting in
[b - W, b - tile]. For each entity there is a row at every boundary b in [start, end) where a tile enters a
window (b = tile_start + tile) or leaves one (b = tile_start + tile + W), holding all the view's values as of b;
plus, for every entity, a row at its last such boundary at or before the range's first boundary (usually before
`start`), when that is within the ttl at `start`: so a range stands alone (an as-of lookup after its first
boundary never needs an earlier range) and its lookups age from the entity's real last change, exactly as with
the range backfilled from further back. Between two rows nothing changes.
Attributes are `last` over a window of the view's ttl: the latest value, gone once older than the ttl.

Everything is vectorized per chunk of entities: tiles sorted by (entity, tile), one int64 key per tile
(`code * span + tile index`), binary searches for each window's first and last tile; then for count/sum/mean
int64 prefix sums (exact) and a pairwise tree of float sums (a window adds only its own tiles), a sparse
table of arg-extremes for min/max, the last non-null tile for last, and `batch.hll_windows` for approx_distinct.
Python loops run over features, windows and sparse-table and tree levels only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from batch.hll_windows import TileSketches
from dsl.compile_feast import EVENT_TIMESTAMP
from dsl.compile_flink import TILE_START, CompiledView, WindowSpec

OFFLINE_TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")


def offline_schema(compiled: CompiledView) -> pa.Schema:
    """Join keys, `event_timestamp` (ms, UTC), then the output features: the offline table's columns."""
    fields = [pa.field(k, t.arrow_type()) for k, t in zip(compiled.key_columns, compiled.key_types)]
    fields.append(pa.field(EVENT_TIMESTAMP, OFFLINE_TIMESTAMP_TYPE))
    fields += [pa.field(w.name, w.kind.arrow_type()) for w in compiled.windows]
    return pa.schema(fields)


@dataclass(frozen=True)
class TileGrid:
    """Tile indexes of one backfill: index 0 is `origin_ms`; boundaries `first <= index < stop` are in range.

    The origin lies one tile, the longest window and the ttl before `start_ms`: far enough back to find each
    entity's last change at or before the first boundary (a tile entering a window, or an older tile leaving one)
    whenever that change lies within the ttl, so every event before it can be skipped.
    """

    tile_ms: int
    origin_ms: int
    first: int
    stop: int
    max_window: int
    oldest_ms: int  # start - ttl: a row before the range older than this is past the ttl for every lookup in it

    @classmethod
    def of(cls, compiled: CompiledView, start_ms: int, end_ms: int) -> "TileGrid":
        tile, longest = compiled.tile_ms, compiled.longest_tiles
        lookback = longest + -(-compiled.ttl_ms // tile)
        origin = start_ms // tile * tile - (lookback + 1) * tile
        return cls(tile, origin, -((origin - start_ms) // tile), -((origin - end_ms) // tile), longest,
                   start_ms - compiled.ttl_ms)

    @property
    def span(self) -> int:
        """Greater than any tile or boundary index, so `code * span + index` orders by entity, then time."""
        return self.stop + self.max_window + 2


def offline_rows(compiled: CompiledView, tiles: pa.Table, start_ms: int, end_ms: int,
                 chunk_tiles: int = 1_000_000) -> Iterator[tuple[pa.Table, int]]:
    """The offline rows of boundaries in [start_ms, end_ms) from the view's tiles: (rows, tiles used) per chunk
    of about `chunk_tiles` tiles of whole entities, so memory stays flat.

    `tiles` is the tile query's output (any order) covering at least `TileGrid.of(...).origin_ms` to `end_ms`;
    tiles with a NULL join key are dropped (no lookup can reach them).
    """
    grid = TileGrid.of(compiled, start_ms, end_ms)
    keys = list(compiled.key_columns)
    tiles = _in_grid(tiles, keys, grid, end_ms)
    builder = _RowBuilder(keys, compiled.windows, grid, offline_schema(compiled))
    codes = _entity_codes(tiles.select(keys))
    for lo, hi in _chunks(codes, chunk_tiles):
        yield builder.rows(tiles.slice(lo, hi - lo), codes[lo:hi] - codes[lo]), hi - lo


def _in_grid(tiles: pa.Table, keys: list[str], grid: TileGrid, end_ms: int) -> pa.Table:
    start = pc.field(TILE_START)
    keep = (start >= grid.origin_ms) & (start < end_ms)
    for key in keys:
        keep &= pc.field(key).is_valid()
    tiles = tiles.filter(keep)
    return tiles.sort_by([*((k, "ascending") for k in keys), (TILE_START, "ascending")]).combine_chunks()


def _entity_codes(keys: pa.Table) -> np.ndarray:
    """0, 0, 1, 1, 1, 2, ...: the entity of each row of `keys`, sorted by key."""
    n = keys.num_rows
    changed = np.ones(n, dtype=bool)
    if n > 1:
        changed[1:] = False
        for column in keys.columns:
            array = column.combine_chunks()
            changed[1:] |= pc.not_equal(array.slice(1), array.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return np.cumsum(changed) - 1


def _chunks(codes: np.ndarray, chunk_tiles: int) -> list[tuple[int, int]]:
    """Row ranges of about `chunk_tiles` rows that never split an entity."""
    entity_starts = np.flatnonzero(np.diff(codes, prepend=-1))
    first_at_or_after = np.searchsorted(entity_starts, np.arange(0, len(codes), chunk_tiles))
    cuts = np.unique(entity_starts[first_at_or_after[first_at_or_after < len(entity_starts)]])
    bounds = [*cuts.tolist(), len(codes)]
    return list(zip(bounds[:-1], bounds[1:]))


class _RowBuilder:
    """Builds the offline rows of one chunk of whole entities."""

    def __init__(self, keys: list[str], features: tuple[WindowSpec, ...], grid: TileGrid, schema: pa.Schema):
        self.keys = keys
        self.features = features
        self.grid = grid
        self.schema = schema

    def rows(self, tiles: pa.Table, codes: np.ndarray) -> pa.Table:
        grid = self.grid
        tile_index = (tiles.column(TILE_START).to_numpy() - grid.origin_ms) // grid.tile_ms
        tile_keys = codes * grid.span + tile_index
        boundary_keys = self._boundaries(codes, tile_index)
        boundary_codes, boundary_index = np.divmod(boundary_keys, grid.span)
        first_tile = np.searchsorted(codes, boundary_codes)
        columns = {k: tiles.column(k).take(first_tile) for k in self.keys}
        columns[EVENT_TIMESTAMP] = pa.array(grid.origin_ms + boundary_index * grid.tile_ms).cast(
            OFFLINE_TIMESTAMP_TYPE)
        distinct = self._distinct_counts(tiles, codes, tile_index, tile_keys, boundary_keys)
        windows = {w: _Window(tile_keys, boundary_keys, w) for w in {f.tiles for f in self.features}}
        sums = _WindowSums(tiles)
        for feature in self.features:
            values = distinct.get(feature.name)
            if values is None:
                values = _reduce(feature, tiles, sums, windows[feature.tiles])
            columns[feature.name] = values.cast(feature.kind.arrow_type())
        return pa.table(columns, schema=self.schema)

    def _distinct_counts(self, tiles: pa.Table, codes: np.ndarray, tile_index: np.ndarray, tile_keys: np.ndarray,
                         boundary_keys: np.ndarray) -> dict[str, pa.Array]:
        """approx_distinct features, all windows of one sketch column at once."""
        by_column: dict[str, list[WindowSpec]] = {}
        for feature in self.features:
            if feature.op == "approx_distinct":
                by_column.setdefault(feature.partials["hll"], []).append(feature)
        out = {}
        for column, features in by_column.items():
            sketches = TileSketches(tiles.column(column).combine_chunks(), codes, tile_index)
            estimates = sketches.estimates(boundary_keys, tile_keys, sorted({f.tiles for f in features}))
            out.update({f.name: pa.array(estimates[f.tiles]) for f in features})
        return out

    def _boundaries(self, codes: np.ndarray, tile_index: np.ndarray) -> np.ndarray:
        """Sorted unique `code * span + index` of every boundary in range where a tile enters or leaves one of the
        entity's windows; and for each entity its last such boundary at or before the first one, unless that is
        older than the ttl at `start` (then every lookup from the range on is NULL anyway). That row holds the
        values of the first boundary (nothing changed in between) and its time, so a lookup in the range ages from
        the entity's real change, as it would with the range backfilled from further back."""
        grid = self.grid
        entered = codes * grid.span + tile_index + 1
        lengths = sorted({0, *(f.tiles for f in self.features)})
        candidates = np.unique(np.concatenate([entered + w for w in lengths]))
        index = candidates % grid.span
        before = candidates[index <= grid.first]
        last = before[np.flatnonzero(np.diff(before // grid.span, append=-1))]  # each entity's last one
        fresh = grid.origin_ms + last % grid.span * grid.tile_ms >= grid.oldest_ms
        return np.union1d(candidates[(index >= grid.first) & (index < grid.stop)], last[fresh])


class _Window:
    """Each boundary's tiles of one window: rows [lo, hi) of the chunk (tiles sorted by entity and time)."""

    def __init__(self, tile_keys: np.ndarray, boundary_keys: np.ndarray, window: int):
        self.lo = np.searchsorted(tile_keys, boundary_keys - window)
        self.hi = np.searchsorted(tile_keys, boundary_keys)
        self.window = window


def _reduce(feature: WindowSpec, tiles: pa.Table, sums: "_WindowSums", window: _Window) -> pa.Array:
    partial = feature.partials
    if feature.op in ("count", "sum"):
        return pa.array(sums.over(partial[feature.op], window))
    if feature.op == "mean":
        count = sums.over(partial["count"], window)
        total = sums.over(partial["sum"], window).astype(np.float64)
        return pa.array(total / np.maximum(count, 1), mask=count == 0)
    if feature.op in ("min", "max"):
        return _window_extreme(tiles.column(partial[feature.op]).combine_chunks(), window,
                               largest=feature.op == "max")
    if feature.op == "last":
        return _window_last(tiles.column(partial["last"]).combine_chunks(), window)
    raise ValueError(f"feature `{feature.name}`: no window reduction for op `{feature.op}`; add one to "
                     "batch/windows.py beside its definition in dsl/aggregates.py")


class _WindowSums:
    """Sums of tile columns over windows (NULL counts as 0), each column prepared once. Integers: differences of an
    int64 prefix sum, exact whenever the window's own sum fits (a wrap in between cancels out). Floats: a pairwise
    tree of partial sums in long double (64-bit mantissa on x86), a window's sum added from the at most
    2 log2(rows) tree nodes that lie inside it, so it never touches a value outside the window (a prefix difference
    did: one 1e300 or inf in the chunk wiped out the sums of every entity after it), and its error is that of
    pairwise summation over the window alone (about log2(rows) * 5e-20 of the window's absolute sum, below
    float64's rounding), where a prefix difference's grew with the chunk's running total."""

    def __init__(self, tiles: pa.Table):
        self.tiles = tiles
        self.prepared: dict[str, np.ndarray] = {}

    def over(self, column: str, window: _Window) -> np.ndarray:
        values = self.tiles.column(column)
        exact = pa.types.is_integer(values.type)
        if column not in self.prepared:
            array = pc.fill_null(values, 0).to_numpy()
            self.prepared[column] = _prefix(array) if exact else _sum_tree(array)
        prepared = self.prepared[column]
        if exact:
            return prepared[window.hi] - prepared[window.lo]
        return _tree_sums(prepared, window.lo, window.hi).astype(np.float64)


def _prefix(array: np.ndarray) -> np.ndarray:
    prefix = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(array, dtype=np.int64, out=prefix[1:])
    return prefix


def _sum_tree(array: np.ndarray) -> np.ndarray:
    """A perfect binary tree over `array` (leaves at [n, 2n), n a power of two): node i = node 2i + node 2i + 1;
    one zero past the leaves, which `_tree_sums` reads (and drops) for a range ending at the last leaf."""
    n = 1 << max(0, len(array) - 1).bit_length()
    tree = np.zeros(2 * n + 1, dtype=np.longdouble)
    tree[n:n + len(array)] = array
    size = n
    while size > 1:
        tree[size // 2:size] = tree[size:2 * size:2] + tree[size + 1:2 * size:2]
        size //= 2
    return tree


def _tree_sums(tree: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The sum of leaves [lo, hi) for each pair, climbing from both ends at once (a range of m leaves takes about
    log2(m) + 1 steps)."""
    n = len(tree) // 2
    out = np.zeros(len(lo), dtype=np.longdouble)
    left, right = lo + n, hi + n
    while True:
        active = left < right
        if not active.any():
            return out
        odd = active & (left & 1 == 1)
        out += np.where(odd, tree[left], 0.0)
        left = left + odd
        odd = active & (right & 1 == 1)
        right = right - odd
        out += np.where(odd, tree[right], 0.0)
        left, right = left >> 1, right >> 1


def _window_extreme(values: pa.Array, window: _Window, largest: bool) -> pa.Array:
    """MIN or MAX over each window, NULL when the window has no non-NULL tile; any orderable type."""
    rank = pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64)
    score = rank if largest else rank.max(initial=0) + 1 - rank
    score[~values.is_valid().to_numpy(zero_copy_only=False)] = 0
    best = _arg_max_in_ranges(score, window.lo, window.hi, window.window)
    found = (window.hi > window.lo) & (score[best] > 0)
    return values.take(pa.array(best, mask=~found))


def _arg_max_in_ranges(score: np.ndarray, lo: np.ndarray, hi: np.ndarray, longest: int) -> np.ndarray:
    """A position of the greatest score in each [lo, hi) of at most `longest` rows (a sparse table: level j holds
    the arg-max of the 2**j rows from each position); an empty range gives some position, to be masked."""
    n = len(score)
    levels = [np.arange(n)]
    while 2 ** len(levels) <= longest:
        prev = levels[-1]
        other = prev[np.minimum(np.arange(n) + 2 ** (len(levels) - 1), n - 1)]
        levels.append(np.where(score[other] > score[prev], other, prev))
    table = np.stack(levels)
    length = np.maximum(hi - lo, 1)
    level = np.frexp(length)[1] - 1  # floor(log2(length))
    a = table[level, np.minimum(lo, n - 1)]
    b = table[level, np.clip(hi - 2 ** level, 0, n - 1)]
    return np.where(score[b] > score[a], b, a)


def _window_last(values: pa.Array, window: _Window) -> pa.Array:
    """The value of the latest tile with a non-NULL value in each window, NULL when there is none."""
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    latest = np.maximum.accumulate(np.where(valid, np.arange(len(values)), -1))
    at = latest[np.maximum(window.hi - 1, 0)]
    found = (window.hi > window.lo) & (at >= window.lo)
    return values.take(pa.array(np.maximum(at, 0), mask=~found))
