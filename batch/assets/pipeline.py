"""`featurectl assets process` on Ray: list -> (read, hash, decode mesh, features, D2) in one task per block ->
offline tables.

The changed assets (`batch.assets.inventory`) are cut into blocks, each derived by `derive_batch` in one Ray task
(file paths travel to the task, never file bytes). Every block is submitted at once into a placement group of
`workers` one-CPU bundles: at most `workers` tasks run at a time on any cluster, and a worker starts its next block
the moment it ends one, without waiting for the driver. The blocks shrink towards the end (`block_sizes`) so the
workers finish together. The driver only collects the derived rows as tasks end (a progress callback per block) and
writes them (`batch.assets.offline`). Ray Data's streaming executor is not used here: it refills a finished task's
slot only when its scheduling loop next polls (every 0.1 s), which left a worker idle about 80 ms per block on this
2-core host, and its driver threads and helper actors took CPU from the two workers.

A Ray worker that dies mid-task (killed, out of memory) has its task run again (`TASK_RETRIES`): a task is a pure
function of its block, and its rows are taken only once it succeeded, so every asset comes back exactly once; the
writes that follow replace rows by (asset, version), so running the whole pipeline again is harmless too. A file
that cannot be derived is a FAILED row, not an exception: one corrupt mesh never stops a run.

Ray runs locally by default: started by `ray_session` with `num_cpus=workers`, bound to 127.0.0.1, without its
dashboard, stopped at the end; or the pipeline joins an existing cluster by address (its nodes must see the files
and the data folder, and have this package installed).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc

from batch.assets.derive import FAILED, OK, UNCHANGED, derive_batch, output_schema
from batch.assets.inventory import take_inventory
from batch.assets.offline import write_history, write_views
from batch.assets.state import FAILURE_SCHEMA, STATE_SCHEMA, AssetRecord
from batch.backfill import BackfillTarget
from common.errors import FeaturectlError
from common.storage import as_storage
from dsl.assets import AssetSource, ShapeDescriptor
from dsl.compile_feast import offline_table_path
from dsl.feature_view import FeatureView

log = logging.getLogger(__name__)
TASK_RETRIES = 3
MAX_BLOCK_ASSETS = 64  # a retry redoes little, and progress comes often
MIN_BLOCK_ASSETS = 4  # a task costs about a millisecond of scheduling: blocks of a few meshes still pay for it
GROUP_TIMEOUT_S = 30.0
OBJECT_STORE_BYTES = 256 * 1024**2
REACH_TIMEOUT_S = 5.0


@dataclass
class DeriveResult:
    """What one run derived: new versions, unchanged files, and failures with their reasons."""

    listed: int = 0
    same: int = 0  # left alone: the file is the version derived last (a stat said so)
    still_failed: int = 0  # left alone: the file is the one that failed
    derived: list[pa.Table] = field(default_factory=list)
    unchanged: list[pa.Table] = field(default_factory=list)
    failed: list[pa.Table] = field(default_factory=list)
    seconds: float = 0.0

    def table(self, name: str, schema: pa.Schema) -> pa.Table:
        parts = getattr(self, name)
        return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


class AssetPipelineError(FeaturectlError, RuntimeError):
    """The pipeline cannot run as asked; the message says why and what to do."""


@contextlib.contextmanager
def ray_session(address: Optional[str], workers: int) -> Iterator[Callable[[], None]]:
    """Yields `start`, which the first step that needs Ray calls (a run with nothing to derive starts none): it
    uses the Ray already initialized in this process, joins the cluster at `address`, or starts a local Ray of
    `workers` CPUs on 127.0.0.1 (no dashboard); a Ray started here is stopped at the end."""
    import ray

    started = False

    def start() -> None:
        nonlocal started
        if ray.is_initialized():
            return
        _init_ray(address, workers)
        started = True

    try:
        yield start
    finally:
        if started:
            ray.shutdown()


def _init_ray(address: Optional[str], workers: int) -> None:
    import ray

    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, ValueError) as exc:
            raise AssetPipelineError(f"cannot join the Ray cluster at {address} ({exc}): check the address, or "
                                     "leave out --address for a local Ray") from None
        return
    root = str(Path(__file__).resolve().parents[2])  # workers import this package from the same checkout
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=OBJECT_STORE_BYTES, logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": path}})


def _check_reachable(address: str) -> None:
    """Fail at once on a `host:port` nobody listens at (Ray itself would wait for minutes)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return  # `auto`, `ray://...`: Ray resolves those itself
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise AssetPipelineError(f"nothing answers at the Ray address {address} ({exc.strerror or exc}): start the "
                                 "cluster (`ray start --head`) or leave out --address for a local Ray") from None


def block_sizes(n: int, workers: int) -> list[int]:
    """Sizes of consecutive blocks of `n` assets: a share of what is left per worker (guided scheduling), at most
    MAX_BLOCK_ASSETS, at least MIN_BLOCK_ASSETS, so the last blocks are small and the workers end together."""
    sizes = []
    while n > 0:
        size = min(n, MAX_BLOCK_ASSETS, max(MIN_BLOCK_ASSETS, -(-n // (2 * workers))))
        sizes.append(size)
        n -= size
    return sizes


def blocks(todo: pa.Table, workers: int) -> list[pa.Table]:
    """`todo` cut into consecutive blocks of `block_sizes`."""
    lows = itertools.accumulate(block_sizes(todo.num_rows, workers), initial=0)
    return [todo.slice(lo, hi - lo) for lo, hi in itertools.pairwise(lows)]


@contextlib.contextmanager
def worker_group(workers: int) -> Iterator[Any]:
    """A placement group of `workers` one-CPU bundles, placed before it is handed over, removed at the end."""
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}] * workers)
    try:
        if not group.wait(GROUP_TIMEOUT_S):
            raise AssetPipelineError(f"the Ray cluster did not free {workers} CPUs for the workers within "
                                     f"{GROUP_TIMEOUT_S:.0f} s: ask for fewer --workers, or wait for its other jobs")
        yield group
    finally:
        remove_placement_group(group)


def derive_assets(todo: pa.Table, descriptor: ShapeDescriptor, workers: int,
                  on_assets: Optional[Callable[[int], None]] = None) -> Iterator[pa.Table]:
    """Derived rows of every asset of `todo` (INPUT_SCHEMA), in blocks as Ray tasks finish them."""
    import ray
    import ray.exceptions
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    with worker_group(workers) as group:
        pending: list = []
        try:
            task = _derive_task().options(scheduling_strategy=PlacementGroupSchedulingStrategy(group))
            pending = [task.remote(block, descriptor) for block in blocks(todo, workers)]
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                batch = ray.get(done[0])
                if on_assets:
                    on_assets(batch.num_rows)
                yield batch
        except ray.exceptions.RayError as exc:  # a task failed past its retries: nothing is written, nothing is lost
            raise AssetPipelineError(f"a Ray task failed {TASK_RETRIES + 1} times ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0]}); nothing was written: run it again") from exc
        finally:
            for ref in pending:
                ray.cancel(ref)


@functools.cache
def _derive_task():
    """`derive_batch` as a Ray task of one CPU, run again when its worker dies."""
    import ray

    return ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(derive_batch)


def run_derivation(source: AssetSource, data_dir: Path, record: AssetRecord, workers: int,
                   on_total: Optional[Callable[[int], None]] = None, on_assets: Optional[Callable[[int], None]] = None,
                   start_ray: Callable[[], None] = lambda: None) -> DeriveResult:
    """Derive the source's changed assets (calling `start_ray` first when there are some; by default Ray is
    already initialized) and sort the rows by outcome."""
    started = time.perf_counter()
    inventory = take_inventory(source, data_dir, record)
    result = DeriveResult(listed=inventory.listed, same=inventory.same, still_failed=inventory.still_failed)
    if inventory.missing.num_rows:
        result.failed.append(_failure_rows(_missing_failures(inventory.missing)))
    if on_total:
        on_total(inventory.todo.num_rows)
    if inventory.todo.num_rows:
        start_ray()
        for batch in derive_assets(inventory.todo, source.embedding, workers, on_assets):
            status = batch.column("status")
            for name, outcome in (("derived", OK), ("unchanged", UNCHANGED), ("failed", FAILED)):
                part = batch.filter(pc.equal(status, outcome))
                if part.num_rows:
                    getattr(result, name).append(_failure_rows(part) if outcome == FAILED else part)
    result.seconds = time.perf_counter() - started
    return result


def _missing_failures(missing: pa.Table) -> pa.Table:
    n = missing.num_rows
    return pa.table({**{c: missing.column(c) for c in missing.column_names},
                     "updated_at": pa.nulls(n, pa.int64()), "size": pa.nulls(n, pa.int64()),
                     "mtime_ns": pa.nulls(n, pa.int64()),
                     "reason": pa.array([_missing_reason(path) for path in missing.column("path").to_pylist()])})


def _missing_reason(path: Optional[str]) -> str:
    return "the asset list gives it no path" if path is None else "the file does not exist"


def _failure_rows(failed: pa.Table) -> pa.Table:
    now = pa.scalar(int(time.time() * 1000), pa.int64()).cast(pa.timestamp("ms", "UTC"))
    columns = {name: failed.column(name) for name in FAILURE_SCHEMA.names if name in failed.column_names}
    columns["failed_at"] = pa.array([now.as_py()] * failed.num_rows, pa.timestamp("ms", "UTC"))
    return pa.table(columns).cast(FAILURE_SCHEMA)


@dataclass
class ProcessSummary:
    result: DeriveResult
    written: dict[str, tuple[int, int]]  # view -> (first, last) event time written, ms
    history: Optional[Path]
    failures: pa.Table  # every recorded failure of the source, this run's included


def process_assets(source: AssetSource, views: list[FeatureView], target: BackfillTarget, workers: int,
                   on_total: Optional[Callable[[int], None]] = None,
                   on_assets: Optional[Callable[[int], None]] = None,
                   start_ray: Callable[[], None] = lambda: None) -> ProcessSummary:
    """Derive the changed assets of `source` (`start_ray` as in `run_derivation`), write the history and the
    offline tables of `views`, then replace the source's record. A record whose views' offline tables are gone
    (deleted by hand, or a data folder copied without them) no longer describes them: every asset is derived
    again, rather than none and a view left without a table."""
    record = AssetRecord.load(target.data_dir, source.name)
    gone = [v.name for v in views if as_storage(offline_table_path(target.data_dir, v)).dataset() is None]
    if gone and record.derived.num_rows:
        log.warning("the offline table of %s is gone but the record of asset source `%s` lists %d derived assets: "
                    "deriving every asset again", ", ".join(f"`{name}`" for name in gone), source.name,
                    record.derived.num_rows)
        record = AssetRecord(record.folder, STATE_SCHEMA.empty_table(), record.failures)
    result = run_derivation(source, target.data_dir, record, workers, on_total, on_assets, start_ray)
    derived = result.table("derived", output_schema(source.embedding))
    history = write_history(source, target.data_dir, derived)
    written = write_views(views, derived, target)
    record.update(pa.concat_tables([derived, result.table("unchanged", derived.schema)]),
                  result.table("failed", FAILURE_SCHEMA))
    record.save()
    return ProcessSummary(result, written, history, record.failures)
