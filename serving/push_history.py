"""Events pushed `offline`: appended to their source's Parquet history, the folder backfills read and from which a
stream's next generation starts (`<data_dir>/<source path>`).

One file per push, `push-<UTC time>-<random>.parquet`, written under a name starting with a dot (which Arrow,
Flink's file source and the history's input check all skip) and renamed into place, so a reader sees the whole
file or none of it. Every column of the source is written with the exact type the input check demands (strings,
int64 epoch-millisecond event times...), absent values as nulls, so the file never fails a backfill.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

from dsl.source import EventSource


def append_events(folder: Path, source: EventSource, events: Sequence[Mapping[str, Any]]) -> Path:
    """Write `events` (already checked against the source) as one new file of the history; returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({name: pa.array([e.get(name) for e in events], type=kind.arrow_type())
                      for name, kind in source.schema.items()})
    folder.mkdir(parents=True, exist_ok=True)
    name = f"push-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:12]}.parquet"
    staged = folder / f".{name}.tmp"
    try:
        pq.write_table(table, staged)
        os.replace(staged, folder / name)
    finally:
        staged.unlink(missing_ok=True)
    return folder / name
