"""The Parquet history checked against the sources before any Flink job reads it.

Flink's Parquet reader does not say when a file does not match its source: it reads a missing column as NULL (a
`sum` over it is 0 for ever), takes the raw numbers of a timestamp column whatever their unit, and fails deep in
a job, with a Java stack trace, on a file that is not Parquet or a column of another physical type. So every file
a job would read is checked first, cheaply: its footer (the schema) and the row-group statistics it carries
(min, max, null count), reading a column only for a row group written without them. Problems that would make
the job wrong or fail are errors, all of them in one message; data that the job reads but drops or cannot place
in time (NULL keys or event times, times in seconds) are warnings with counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import FeaturectlError
from common.storage import Storage, StorageError, as_storage
from dsl.compile_flink import source_location
from dsl.feature_view import FeatureView
from dsl.source import EventSource
from dsl.types import ValueType

SECONDS_BELOW_MS = 100_000_000_000  # 1973-03-03 in ms; 3170 in seconds: an event time below it is in seconds
MICROS_FROM_MS = 100_000_000_000_000  # year 5138 in ms; 1973 in microseconds: one at or above it is in µs or ns
MAX_LISTED = 12  # problems listed in one error; the rest are counted


class InputSchemaError(FeaturectlError, ValueError):
    """The Parquet history does not match its sources; the message lists each file, column and fix."""


@dataclass(frozen=True)
class SourceNeeds:
    """What a job reads of one source: each column with the views reading it, and the join keys among them with the
    views keyed by each (a view that only reads a column another view is keyed by still counts its NULLs)."""

    source: EventSource
    readers: Mapping[str, tuple[str, ...]]
    keyed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.keyed)

    @classmethod
    def of_views(cls, views: Sequence[FeatureView]) -> list["SourceNeeds"]:
        """One per source of `views`: the columns their compiled tile queries read (join keys, event time,
        aggregated and attribute columns, filter columns), no other; Flink never reads the rest."""
        readers: dict[str, dict[str, list[str]]] = {}
        sources: dict[str, EventSource] = {}
        keyed: dict[str, dict[str, list[str]]] = {}
        for view in views:
            sources[view.source.name] = view.source
            for column in view.columns_read:
                readers.setdefault(view.source.name, {}).setdefault(column, []).append(view.name)
            for key in view.entity.join_keys:
                keyed.setdefault(view.source.name, {}).setdefault(key, []).append(view.name)
        return [cls(sources[name], {c: tuple(v) for c, v in columns.items()},
                    {k: tuple(v) for k, v in keyed[name].items()}) for name, columns in readers.items()]

    @classmethod
    def event_time(cls, source: EventSource) -> "SourceNeeds":
        """Only the source's event time: what finding where its history ends reads."""
        return cls(source, {source.timestamp_field: ()})


@dataclass(frozen=True)
class HistoryCheck:
    """What the check found: the rows of each source's history (all its files), its greatest event time (None
    without one) and the warnings to show."""

    rows: Mapping[str, int]
    latest_ms: Mapping[str, Optional[int]]
    warnings: tuple[str, ...]


@dataclass
class _Tally:
    """One source's files: rows, files without rows or with problems, and rows worth a warning (`counts`: NULL
    event times, times in seconds or in microseconds, a NULL per join key), each with the first file holding one."""

    files: int = 0
    bad_files: int = 0
    rows: int = 0
    latest_ms: Optional[int] = None
    empty: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    example: dict[str, str] = field(default_factory=dict)

    def add(self, what: str, count: int, path: str) -> None:
        if count:
            self.counts[what] += count
            self.example.setdefault(what, path)


def history_files(folder: Path | Storage) -> list[str]:
    """Every file Flink's filesystem source reads under `folder` (paths relative to it): all of them,
    recursively, but those whose name or a folder's on the way starts with `.` or `_` (Arrow's datasets skip the
    same ones)."""
    return as_storage(folder).readable_files()


def check_history(needs: Sequence[SourceNeeds], data_dir: Path | Storage, *,
                  require_rows: bool = True) -> HistoryCheck:
    """Check every file of each source against what is read of it; raise `InputSchemaError` listing every
    problem, else return the rows per source and the warnings. `require_rows`: a source without rows (no
    folder, no files, only empty files) is an error, as for a backfill; else it counts 0 rows."""
    problems: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    latest: dict[str, Optional[int]] = {}
    warnings: list[str] = []
    for need in needs:
        folder = source_location(need.source, data_dir)
        tally = _Tally()
        for relative in history_files(folder):
            tally.files += 1
            path = folder.child(relative).display
            found = _check_file(folder, relative, need, tally)
            tally.bad_files += bool(found)
            for problem in found:
                problems.setdefault(problem, []).append(path)
        rows[need.source.name], latest[need.source.name] = tally.rows, tally.latest_ms
        if require_rows and not tally.files:
            problems.setdefault(f"source `{need.source.name}` has no history at {folder}: write Parquet files there "
                                "(e.g. `featurectl datagen history`) or set the source's `path`", [])
        elif require_rows and not tally.rows and not tally.bad_files:
            files = f"{tally.files} Parquet file{'s' if tally.files > 1 else ''}"
            problems.setdefault(f"source `{need.source.name}` has no events: the {files} at {folder} hold no "
                                "rows; write its history there", [])
        warnings.extend(_warnings(need, tally))
    if problems:
        raise InputSchemaError(_message(problems))
    return HistoryCheck(rows, latest, tuple(warnings))


def _message(problems: dict[str, list[str]]) -> str:
    def also(n: int) -> str:
        return f" (and {n} more file{'s' if n > 1 else ''})" if n else ""

    lines = [f"{paths[0]}{also(len(paths) - 1)}: {problem}" if paths else problem
             for problem, paths in problems.items()]
    if len(lines) == 1:
        return lines[0]
    more = f"\n  ... and {len(lines) - MAX_LISTED} more" if len(lines) > MAX_LISTED else ""
    return (f"the Parquet history does not match its sources ({len(lines)} problems); fix the files or the "
            "sources' schemas, then run again:\n  " + "\n  ".join(lines[:MAX_LISTED]) + more)


def _check_file(folder: Storage, relative: str, need: SourceNeeds, tally: _Tally) -> list[str]:
    """The file's problems; when it has none, its rows and statistics are added to `tally`."""
    where = f"source `{need.source.name}`"
    try:
        with folder.open_input(relative) as file:
            if file.size() == 0:
                return [f"empty (0 bytes), not a Parquet file: delete it or write it again ({where} reads every "
                        "file in its folder)"]
            with pq.ParquetFile(file) as parquet:
                problems = [p for c in need.readers if (p := _column_problem(need, c, parquet.schema_arrow))]
                if not problems:
                    _count(parquet, need, folder.child(relative).display, tally)
                return problems
    except (pa.ArrowException, OSError, StorageError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return [f"not a readable Parquet file ({reason}): write it again, or move it out of the folder of {where} "
                "(Flink reads every file there whose name does not start with `.` or `_`)"]


def _column_problem(need: SourceNeeds, column: str, schema: pa.Schema) -> Optional[str]:
    source, kind = need.source, need.source.schema[column]
    found = schema.get_all_field_indices(column)
    if not found:
        readers = need.readers[column]
        read_by = f"view{'s' if len(readers) > 1 else ''} {', '.join(f'`{v}`' for v in readers)}"
        return (f"no column `{column}` ({kind.value}), which source `{source.name}` declares and "
                f"{read_by or 'the job'} read{'' if len(readers) > 1 else 's'} (Flink would read it as NULL): "
                "add it to the file, or take it out of the source and the views")
    if len(found) > 1:
        return f"column `{column}` appears {len(found)} times: write it once"
    actual = schema.field(found[0]).type
    if _fits(actual, kind):
        return None
    if pa.types.is_timestamp(actual) and column == source.timestamp_field:
        return (f"event time `{column}` is {actual}, but source `{source.name}` declares epoch milliseconds "
                "(int64; Flink would read the raw numbers, whatever their unit): write int64 milliseconds, e.g. "
                "`table[col].cast(pa.timestamp(\"ms\")).cast(pa.int64())`")
    arrow = str(kind.arrow_type())
    declared = kind.value if arrow == kind.value else f"{kind.value} ({arrow})"
    return (f"column `{column}` is {actual}, but source `{source.name}` declares {declared}: write it as {arrow}, "
            "or declare the type the files hold")


def _fits(actual: pa.DataType, kind: ValueType) -> bool:
    """Whether Flink reads `actual` as `kind` (its Parquet reader takes only the exact physical type; strings
    may be large or dictionary-encoded, as any column may)."""
    if pa.types.is_dictionary(actual):
        actual = actual.value_type
    if kind is ValueType.STRING:
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    return actual == kind.arrow_type()


def _count(parquet: pq.ParquetFile, need: SourceNeeds, path: str, tally: _Tally) -> None:
    """Rows, NULL keys and event times, event times in other units and the greatest, from each row group's
    statistics; a row group without them has those columns read (only them, only that group)."""
    metadata = parquet.metadata
    if metadata.num_rows == 0:
        tally.empty.append(path)
        return
    tally.rows += metadata.num_rows
    leaf = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
    time = need.source.timestamp_field
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        counts = {c: _stats_counts(group.column(leaf[c]).statistics, group.num_rows, c == time)
                  for c in (time, *need.keys)}
        unread = [c for c, known in counts.items() if known is None]
        stats = group.column(leaf[time]).statistics
        greatest = stats.max if stats is not None and stats.has_min_max else None
        if unread:
            table = parquet.read_row_group(i, columns=unread)
            counts.update({c: _data_counts(table.column(c), c == time) for c in unread})
            if time in unread:
                greatest = pc.max(table.column(time)).as_py()
        if greatest is not None and (tally.latest_ms is None or greatest > tally.latest_ms):
            tally.latest_ms = int(greatest)
        for what, count in zip(("null_time", "seconds", "micros"), counts[time]):
            tally.add(what, count, path)
        for key in need.keys:
            tally.add(f"null:{key}", counts[key][0], path)


def _stats_counts(stats, rows: int, is_time: bool) -> Optional[tuple[int, int, int]]:
    """(NULLs, values below SECONDS_BELOW_MS, values from MICROS_FROM_MS) of a row group from its statistics;
    None when they do not tell."""
    if stats is None or not stats.has_null_count:
        return None
    valid = rows - stats.null_count
    if not is_time or valid == 0:
        return stats.null_count, 0, 0
    if not stats.has_min_max:
        return None
    below = valid if stats.max < SECONDS_BELOW_MS else 0 if stats.min >= SECONDS_BELOW_MS else None
    above = valid if stats.min >= MICROS_FROM_MS else 0 if stats.max < MICROS_FROM_MS else None
    return None if below is None or above is None else (stats.null_count, below, above)


def _data_counts(column: pa.ChunkedArray, is_time: bool) -> tuple[int, int, int]:
    if not is_time:
        return column.null_count, 0, 0
    below = pc.sum(pc.less(column, SECONDS_BELOW_MS)).as_py() or 0
    above = pc.sum(pc.greater_equal(column, MICROS_FROM_MS)).as_py() or 0
    return column.null_count, below, above


def _warnings(need: SourceNeeds, tally: _Tally) -> list[str]:
    where, time, counts = f"source `{need.source.name}`", need.source.timestamp_field, tally.counts

    def some(what: str) -> str:
        return f"{counts[what]:,} of {tally.rows:,} events"

    out = []
    if tally.empty and tally.rows:
        out.append(f"{where}: {len(tally.empty)} of its {tally.files} Parquet files hold no rows "
                   f"(e.g. {tally.empty[0]}); they add nothing")
    if counts["null_time"]:
        out.append(f"{where}: {some('null_time')} have no event time (`{time}` is NULL, e.g. in "
                   f"{tally.example['null_time']}): every view skips them")
    if counts["seconds"]:
        out.append(f"{where}: {some('seconds')} have event times before 1973-03-03 (`{time}` below 1e11 ms, e.g. "
                   f"in {tally.example['seconds']}): timestamps look like seconds: multiply by 1000")
    if counts["micros"]:
        out.append(f"{where}: {some('micros')} have event times after the year 5138 (`{time}` at or above 1e14 ms, "
                   f"e.g. in {tally.example['micros']}): timestamps look like microseconds or nanoseconds: divide "
                   "by 1,000 or 1,000,000")
    for key in need.keys:
        if counts[f"null:{key}"]:
            views = ", ".join(f"`{v}`" for v in need.keyed[key])
            out.append(f"{where}: {some(f'null:{key}')} have a NULL join key `{key}` (e.g. in "
                       f"{tally.example[f'null:{key}']}): the views keyed by it ({views}) skip them")
    return out
