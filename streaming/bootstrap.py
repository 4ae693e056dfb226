"""Where a stream starts: its generation (what a restart resumes) and the history its windows start from.

A stream's first start, a start after its state is gone (no checkpoint) and `featurectl stream --reset` begin a
new *generation*: the cutover of each source with history is fixed then (`History.cutovers`), the batch side's
tiles of the events before it are exported once (`History.export`, into `<shared>/history/<fingerprint>/`, where
`shared` is the stream's folder of shared storage, else its home), and the job's SQL, with the cutovers and the
generation in its fingerprint, gets fresh topics, consumer group and checkpoints. `<home>/generation.json` records
it; a restart with a checkpoint of that fingerprint resumes it, with the same cutovers and history tiles, so
nothing is counted twice however often it restarts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional, Protocol, Sequence

from common.storage import Storage
from dsl.compile_flink import TILE_START, CompiledView
from dsl.feature_view import FeatureView
from dsl.source import EventSource

GENERATION_FILE = "generation.json"


class History(Protocol):
    """The batch side of a stream (`batch.history.ParquetHistory`)."""

    def cutovers(self, sources: Sequence[EventSource], now_ms: int) -> dict[str, int]:
        """Per source with history: where its Kafka events start to count."""

    def export(self, views: Sequence[tuple[FeatureView, CompiledView]], cutovers: Mapping[str, int],
               folder: Storage) -> dict[str, Storage]:
        """Each view's tiles of the events before its source's cutover, as Parquet under `folder/<view>/`."""


@dataclass(frozen=True)
class Generation:
    """One run of a stream's state: when it began (part of its SQL's fingerprint) and its sources' cutovers."""

    started_ms: int
    cutovers: Mapping[str, int]
    fingerprint: str = ""

    def save(self, home: Path) -> None:
        path = home / GENERATION_FILE
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps({"started_ms": self.started_ms, "cutovers": dict(self.cutovers),
                                   "fingerprint": self.fingerprint}, indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, home: Path) -> Optional["Generation"]:
        try:
            raw = json.loads((home / GENERATION_FILE).read_text())
            return cls(int(raw["started_ms"]), {k: int(v) for k, v in raw["cutovers"].items()}, raw["fingerprint"])
        except (OSError, ValueError, KeyError, TypeError):
            return None


def history_folder(shared: Storage, fingerprint: str) -> Storage:
    return shared.child("history", fingerprint)


def prune_history(shared: Storage, keep: str) -> None:
    """History tiles of other generations are never read again."""
    for name in {path.split("/", 1)[0] for path in shared.child("history").files() if "/" in path}:
        if name != keep:
            shared.child("history", name).delete()


def read_tiles(folder: Storage, compiled: CompiledView) -> Iterator[tuple[tuple, int, tuple]]:
    """(entity key, tile start, tile column values) of every history tile of one view (none when the folder has
    no files: a view with no event before the cutover)."""
    dataset = folder.dataset()  # Flink's part files (names without a suffix)
    if dataset is None:
        return
    names = [c.name for c in compiled.tile_columns]
    table = dataset.to_table(columns=[*compiled.key_columns, TILE_START, *names])
    for batch in table.to_batches(max_chunksize=100_000):
        columns = [column.to_pylist() for column in batch.columns]
        keys = list(zip(*columns[:len(compiled.key_columns)]))
        starts = columns[len(compiled.key_columns)]
        values = list(zip(*columns[len(compiled.key_columns) + 1:]))
        for key, start, row in zip(keys, starts, values):
            if None not in key:
                yield key, start, row
