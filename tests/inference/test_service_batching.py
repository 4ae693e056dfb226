"""Batches under closed-loop clients, and the mesh buffers' copy that the worker no longer waits for."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from inference.mesh import SurfaceCopy, device_surface, host_mesh
from inference.service.service import batch_deadline

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_surface_copy_gives_the_blocking_copys_buffers(device):
    grid = torch.randn(33, 33, 33, generator=torch.Generator().manual_seed(5)).to(device)
    verts, faces = device_surface(grid, 1.05)
    copies = [SurfaceCopy(verts, faces) for _ in range(3)]       # several in flight, as a batch's objects are
    expected = host_mesh(verts, faces)
    del verts, faces                                             # the copies must hold what they still read
    for copy in copies:
        got = copy.wait()
        assert got[0].dtype == np.float32 and got[1].dtype == np.int32
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
        assert copy.wait()[0] is got[0]                          # waiting twice is harmless


def test_batch_deadline_waits_for_objects_still_being_finished_then_for_their_callers():
    until, tail_until, wait = 10.002, 10.1, 0.002
    assert batch_deadline(until, tail_until, 2, float("-inf"), wait) == tail_until      # meshes in flight
    assert batch_deadline(until, tail_until, 0, 10.05, wait) == pytest.approx(10.052)   # their callers' turn
    assert batch_deadline(until, tail_until, 0, 10.099, wait) == tail_until             # never past the bound
    assert batch_deadline(until, tail_until, 0, 9.0, wait) == until                     # one caller at a time
    assert batch_deadline(until, until, 3, 10.001, wait) == until                       # tail_wait_ms = 0


def test_closed_loop_clients_fill_every_batch_and_get_what_they_get_alone(tail_wait_ms=10_000.0):
    from inference.service import GenerationRequest, GenerationService, ServiceConfig
    from inference.service.service import GenerationServiceError

    # the device path on the CPU: the GLB threads and `SurfaceCopy`, as on CUDA
    cfg = ServiceConfig.from_name("tiny", mesh_on_device=True, max_batch_wait_ms=20.0, tail_wait_ms=tail_wait_ms)
    service = GenerationService(cfg)
    try:
        clients, rounds = max(cfg.batch_buckets), 3
        alone = {c: service.generate(GenerationRequest(f"a chair {c}", seed=c)).glb for c in range(clients)}
        service.stats.batch_sizes.clear()
        results: dict[int, list[bytes]] = {c: [] for c in range(clients)}

        def client(c: int) -> None:
            for _ in range(rounds):
                results[c].append(service.generate(GenerationRequest(f"a chair {c}", seed=c)).glb)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert service.stats.batch_sizes == {clients: rounds}
        assert all(glb == alone[c] for c in range(clients) for glb in results[c])

        service._glb_threads.shutdown()          # the mesh's hand-over fails: that request fails, nothing hangs
        with pytest.raises(GenerationServiceError, match="meshing failed"):
            service.submit(GenerationRequest("a chair", seed=1)).result(timeout=120)
        assert service._finishing == 0           # counted out, so later batches do not wait for it
    finally:
        service.close()
