"""Marching cubes and GLB export in worker processes, the grids passed through shared memory.

scikit-image's marching cubes holds the GIL for the whole call (about 150 ms on a busy r = 8 surface, measured
here): in a thread it would stall the GPU thread and every request's Python (feature fetches included) for that
long. In processes it runs truly beside the GPU. The device-to-host copy writes the grid straight into the
shared block, so the hand-over costs no extra copy; the child returns the GLB bytes.
"""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np


@dataclass
class MeshOutput:
    glb: bytes
    vertices: int
    faces: int
    marching_cubes_s: float
    export_s: float


class SharedGrid:
    """Occupancy values (float32) and the surface mask (bool) of one [G, G, G] grid, in one shared block."""

    def __init__(self, size: int, name: str | None = None):
        self.size = size
        n = size ** 3
        self.shm = shared_memory.SharedMemory(name=name, create=name is None, size=5 * n)
        self.values = np.ndarray((size, size, size), np.float32, self.shm.buf, 0)
        self.surface = np.ndarray((size, size, size), np.bool_, self.shm.buf, 4 * n)

    def close(self, unlink: bool = False) -> None:
        del self.values, self.surface                     # views must go before the buffer can close
        self.shm.close()
        if unlink:
            self.shm.unlink()


def _mesh(name: str, size: int, bounds: float) -> MeshOutput:
    """In the child: marching cubes where the surface mask says, then GLB bytes."""
    from inference.errors import MeshError
    from inference.mesh import Mesh, marching_cubes

    grid = SharedGrid(size, name)
    try:
        t0 = time.perf_counter()
        try:
            verts, faces = marching_cubes(grid.values, bounds, mask=grid.surface)
        except RuntimeError as exc:                        # scikit-image: "No surface found at the given iso value"
            raise MeshError(f"the tokens decode to no surface ({exc})") from None
        t1 = time.perf_counter()
        glb = Mesh(verts, faces).glb()
        return MeshOutput(glb, len(verts), len(faces), t1 - t0, time.perf_counter() - t1)
    finally:
        grid.close()


def _warm() -> None:
    """Pay the imports (skimage, the mesh module) when the pool starts, not in the first request."""
    from skimage import measure

    from inference.mesh import Mesh

    Mesh(np.eye(3, dtype=np.float32), np.array([[0, 1, 2]])).glb()
    measure.marching_cubes(np.arange(8, dtype=np.float32).reshape(2, 2, 2) - 3.5, 0.0)


class MeshPool:
    """`workers` processes started with `spawn` (a forked child of a CUDA process is not safe)."""

    def __init__(self, workers: int):
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_warm)
        for future in [self.pool.submit(_warm) for _ in range(workers)]:
            future.result()

    def submit(self, grid: SharedGrid, bounds: float) -> "Future[MeshOutput]":
        """Mesh `grid` in a child; the block is unlinked once the child is done with it."""
        future = self.pool.submit(_mesh, grid.shm.name, grid.size, bounds)
        future.add_done_callback(lambda _: grid.close(unlink=True))
        return future

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
