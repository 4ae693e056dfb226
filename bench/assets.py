"""`featurectl bench assets`: assets/s through the asset pipeline's derivation on Ray (1 and 2 workers) against
a plain Python loop over the same files, in one run.

`featurectl datagen assets`' generator writes the meshes into a scratch folder. Every side derives every asset
(read, hash, decode, mesh features, D2 with the default descriptor) from the same inventory. The loop calls the
same `derive_batch` in this process; the Ray sides run the pipeline's `derive_assets` in one local Ray started as
`featurectl assets process` starts it (before the clock, 4 logical CPUs for `ray_data2` below; a first small run
spawns its workers), with 1 and then 2 workers. The ratio is Ray with 2 workers over the loop. The sides take turns
for `--rounds` rounds and each reports its best, so that a spell of load from other jobs on the host does not fall
on one side only (every round is in `params`).

`ray_data2` is the same derivation as a Ray Data pipeline at 2 workers, the form the pipeline would take if it
kept up (README, "Assets", Throughput): the same blocks (`ray.data.from_blocks`, which computes their metadata in
this process, where `from_arrow` runs a Ray task per block), `map_batches(derive_batch)` as tasks in the same
placement group, with Ray Data allowed twice as many tasks in flight as there are workers, so that the raylet
starts a queued block the moment a worker ends one rather than when Ray Data's scheduling loop next polls (every
0.1 s). Ray Data counts the tasks against the cluster's CPUs, so this Ray gets 2 logical CPUs per worker (4); the
placement group still runs 2 at a time.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import click

from bench._report import emit

def _inventory(folder: Path, n: int):
    from batch.assets.inventory import take_inventory
    from batch.assets.state import AssetRecord
    from dsl.assets import AssetSource
    from feature_repo.sample_meshes import write_assets

    listing = write_assets(n, folder / "assets", int(time.time() * 1000))
    source = AssetSource("bench_meshes", assets=str(listing))
    return source, take_inventory(source, folder, AssetRecord.load(folder, source.name)).todo


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 1)


def _loop_rate(todo, descriptor) -> float:
    from batch.assets.derive import derive_batch

    started = time.perf_counter()
    derived = derive_batch(todo, descriptor).num_rows
    return _rate(derived, time.perf_counter() - started)


def _ray_data_rate(todo, descriptor, workers: int) -> float:
    import ray.data
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from batch.assets.derive import derive_batch
    from batch.assets.pipeline import TASK_RETRIES, blocks, worker_group

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    started = time.perf_counter()
    with worker_group(workers) as group:
        dataset = ray.data.from_blocks(blocks(todo, workers)).map_batches(
            derive_batch, batch_format="pyarrow", batch_size=None, fn_kwargs={"descriptor": descriptor},
            compute=ray.data.TaskPoolStrategy(size=2 * workers), num_cpus=1, max_retries=TASK_RETRIES,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group))
        derived = sum(batch.num_rows for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None))
    return _rate(derived, time.perf_counter() - started)


def _ray_rate(todo, descriptor, workers: int) -> float:
    from batch.assets.pipeline import derive_assets

    started = time.perf_counter()
    derived = sum(batch.num_rows for batch in derive_assets(todo, descriptor, workers))
    return _rate(derived, time.perf_counter() - started)


@click.command()
@click.option("--assets", "n_assets", default=400, show_default=True, help="meshes to derive per side and round")
@click.option("--rounds", default=2, show_default=True, type=click.IntRange(min=1),
              help="rounds of loop, Ray 1, Ray 2, Ray Data 2 in turn; each side's best round is reported")
def command(n_assets: int, rounds: int) -> None:
    """Assets/s: Ray at 1 and 2 workers against a plain Python loop, same files."""
    from batch.assets.pipeline import derive_assets, ray_session

    rates: dict[str, list[float]] = {"loop": [], "ray1": [], "ray2": [], "ray_data2": []}
    with tempfile.TemporaryDirectory(prefix="bench-assets-") as scratch, ray_session(None, 4) as start_ray:
        source, todo = _inventory(Path(scratch), n_assets)
        descriptor = source.embedding
        start_ray()
        for _ in derive_assets(todo.slice(0, 16), descriptor, 2):  # spawns the workers
            pass
        _ray_data_rate(todo.slice(0, 16), descriptor, 2)  # Ray Data's own start-up: imports, its helper actors
        for _ in range(rounds):
            rates["loop"].append(_loop_rate(todo, descriptor))
            rates["ray1"].append(_ray_rate(todo, descriptor, 1))
            rates["ray2"].append(_ray_rate(todo, descriptor, 2))
            rates["ray_data2"].append(_ray_data_rate(todo, descriptor, 2))
            click.echo(", ".join(f"{side}: {values[-1]} assets/s" for side, values in rates.items()))
    emit("assets", {"assets_per_s": max(rates["ray2"]), "ray1_assets_per_s": max(rates["ray1"]),
                    "ray_data2_assets_per_s": max(rates["ray_data2"])},
         {"assets_per_s": max(rates["loop"])},
         {"assets": n_assets, "rounds": rates,
          "ray_data2_over_loop": round(max(rates["ray_data2"]) / max(rates["loop"]), 3),
          "descriptor": "d2", "bins": descriptor.bins, "pairs": descriptor.pairs})
