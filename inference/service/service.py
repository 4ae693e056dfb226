"""The generation service: a bounded queue, dynamic batching into the engine's buckets, deadlines, stage stats.

    service = GenerationService(ServiceConfig.from_name("v0.1", text_encoder="clip-vit-large-patch14"),
                                make_client=lambda: OnlineClient.from_repo("feature_repo"))
    result = service.generate(GenerationRequest("a wooden chair", asset_id="asset_000042"))   # .glb bytes

One worker thread owns the GPU. It takes the oldest request, waits up to `max_batch_wait_ms` for more that can
share the engine call (same token choice), up to the largest batch bucket, and runs the batch: one feature fetch,
one text encoding, one `Engine.generate`, one coarse-to-fine pass for the batch's occupancy grids together. On a
CUDA device marching cubes follows on the worker (a few ms per object) and the GLB bytes are written in a thread;
on the host path both run in a worker process (`meshing.MeshPool`). Either way the worker goes on with the next
object or batch. A full queue is refused at once (`QueueFullError`, HTTP 429). A request still queued
`job_timeout_s` after it arrived is dropped before it costs GPU time (`JobExpiredError`): a service that far
behind is overloaded, and the caller may be long gone. That deadline is the service's, not the caller's:
`timeout_s` of a request only says how long an HTTP caller waits before it gets a job id instead (`http_app`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from common.errors import shown
from inference.errors import Cube3DError
from inference.service.conditioning import AssetFeatureFetcher
from inference.service.config import ServiceConfig
from inference.service.meshing import MeshOutput, MeshPool
from inference.service.metrics import ServiceStats
from inference.service.pipeline import GenerationRequest, GenerationResult, GridJob, Pipeline, export_glb, result_of

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 1000
# One batch at a time on the device per process: the services of several model versions (a rollout's champion,
# challenger, and a version warming up) take turns, so a CUDA graph capture never overlaps another's kernels.
DEVICE_TURN = threading.Lock()


class GenerationServiceError(Cube3DError):
    """Base of the service's request errors; `status` is the HTTP status they map to."""

    status = 500
    code = "generation_failed"


class BadRequestError(GenerationServiceError, ValueError):
    status, code = 400, "bad_request"


class QueueFullError(GenerationServiceError):
    status, code = 429, "queue_full"


class JobExpiredError(GenerationServiceError):
    """Dropped unrun after `job_timeout_s` in the queue: overload, so 503 with Retry-After (a poll of the job: 410)."""

    status, code = 503, "expired"  # not a TimeoutError: HTTP reads that as its own wait passing (a 202)


class ServiceClosedError(GenerationServiceError):
    status, code = 503, "closed"


def check_request(request: GenerationRequest, max_timeout_s: float) -> None:
    """Raise `BadRequestError` naming the field and the fix; the HTTP layer and the CLI both call this."""
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise BadRequestError("`prompt` must be a non-empty string, e.g. \"a wooden chair\"")
    if len(request.prompt) > MAX_PROMPT_CHARS:
        raise BadRequestError(f"`prompt` has {len(request.prompt)} characters; at most {MAX_PROMPT_CHARS}")
    if request.asset_id is not None and (not isinstance(request.asset_id, str) or not request.asset_id):
        raise BadRequestError("`asset_id` must be a non-empty string (or left out)")
    if type(request.seed) is not int or not 0 <= request.seed < 2 ** 31:
        raise BadRequestError(f"`seed` must be an integer in [0, 2^31), got {shown(request.seed)}")
    if request.top_p is not None and (type(request.top_p) not in (int, float) or not 0 < request.top_p <= 1):
        raise BadRequestError(f"`top_p` must be in (0, 1] (or left out for greedy decoding), "
                              f"got {shown(request.top_p)}")
    t = request.timeout_s
    if t is not None and (type(t) not in (int, float) or not 0 < t <= max_timeout_s):
        raise BadRequestError(f"`timeout_s` must be in (0, {max_timeout_s:g}], got {shown(t)}")


def batch_deadline(until: float, tail_until: float, finishing: int, finished_at: float, wait_s: float) -> float:
    """When a batch that is not full stops waiting for company: `until` is its first request's own wait
    (`max_batch_wait_ms`), `tail_until` the bound of `tail_wait_ms`, `finishing` how many objects of earlier batches
    are still being finished on the host and `finished_at` when the last one was. Their callers are the likeliest
    company: a closed-loop client sends its next request when its mesh arrives, and a batch of 6 taken 2 ms before
    the last two meshes are done costs those two a whole batch cycle. So while such objects exist, wait for them (at
    most until `tail_until`), then `wait_s` for their callers. With nothing in flight (one caller at a time), or
    `tail_until` not past `until`, this is `until`."""
    if finishing:
        return max(until, tail_until)
    return max(until, min(tail_until, finished_at + wait_s))


class GenerationService:
    """Owns the pipeline, the queue, the GPU worker and the mesh threads. `submit` is safe from any thread."""

    def __init__(self, cfg: ServiceConfig, make_client: Callable[[], Any] | None = None,
                 pipeline: Pipeline | None = None):
        self.cfg = cfg
        self.fetcher = AssetFeatureFetcher(make_client, cfg.feature_service)
        self.fetcher.connect()                                  # reads the registry now, not in a request
        self.pipeline = pipeline or Pipeline(cfg, self.fetcher)
        self.pipeline.fetcher = self.fetcher
        self.stats = ServiceStats()
        self.stats.fallbacks = self.fetcher.fallbacks
        self.shadow_stats = ServiceStats()                      # shadow copies (`request.shadow`), kept apart
        self.max_batch = max(cfg.batch_buckets)
        self._queue: collections.deque[tuple[GenerationRequest, Future]] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._finishing = 0                                     # objects emitted whose results are not set yet
        self._finished_at = float("-inf")                       # when the last of them was set
        self._mesh_pool = None if cfg.meshes_on_device else MeshPool(cfg.mesh_workers)
        self._glb_threads = ThreadPoolExecutor(cfg.mesh_workers, thread_name_prefix="cube3d-glb")
        self._worker = threading.Thread(target=self._run, name="cube3d-gpu", daemon=True)
        self._worker.start()

    # ---- callers ---------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, bounded: bool = True) -> "Future[GenerationResult]":
        """Queue a request; raises `BadRequestError` or `QueueFullError` at once, never blocks. `bounded` False: the
        warm-up's batches, which fill the largest bucket whatever `queue_size` is."""
        check_request(request, 10 * self.cfg.timeout_s)
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise ServiceClosedError("the generation service is shutting down; retry on another instance")
            if bounded and len(self._queue) >= self.cfg.queue_size:
                self.stats_of(request).count("rejected")
                raise QueueFullError(f"the generation queue is full ({self.cfg.queue_size} requests waiting); "
                                     "retry in a few seconds, or start the service with a larger `queue_size`")
            self._queue.append((request, future))
            self.stats.queue_depth = len(self._queue)
            self._cv.notify()
        return future

    def tokens_for(self, request: GenerationRequest) -> int:
        """Shape tokens a mesh decodes (a fixed count for the model, whatever the request): what an API key's
        token budget is charged."""
        return self.pipeline.engine.cfg.n_generated

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and wait for the outcome (the CLI's and the benchmark's path): the mesh, or the error that ended
        it (`JobExpiredError` if it was still queued after `job_timeout_s`); `request.timeout_s` is HTTP's."""
        return self.submit(request).result()

    def warm_up(self) -> None:
        """Capture every bucket's graphs and touch every stage once, so the first requests pay nothing extra."""
        t0 = time.perf_counter()
        for bucket in self.cfg.batch_buckets:
            # one request names an asset, so the feature fetch path is warm too (it is not expected to exist)
            requests = [GenerationRequest("warm up", seed=i, asset_id="warm-up" if i == 0 else None)
                        for i in range(bucket)]
            for future in [self.submit(r, bounded=False) for r in requests]:
                future.result()
        self.stats, self.shadow_stats = ServiceStats(), ServiceStats()
        self.fetcher.fallbacks.update(dict.fromkeys(self.fetcher.fallbacks, 0))
        self.stats.fallbacks = self.fetcher.fallbacks
        log.info("warmed up in %.1fs", time.perf_counter() - t0)

    def stats_of(self, request: GenerationRequest) -> ServiceStats:
        """Where a request's outcome and stage times go: shadow copies apart from the traffic callers see."""
        return self.shadow_stats if request.shadow else self.stats

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for _, future in pending:
            future.set_exception(ServiceClosedError("the generation service shut down before this request ran"))
        self._worker.join(timeout=60)
        if self._mesh_pool is not None:
            self._mesh_pool.shutdown()
        self._glb_threads.shutdown(wait=True)
        self.fetcher.close()

    # ---- the worker --------------------------------------------------------------------------------
    def _take_batch(self) -> list[tuple[GenerationRequest, Future]]:
        """The oldest request plus up to `max_batch - 1` compatible ones, waiting `max_batch_wait_ms` for them."""
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait()
            if self._closed:
                return []
            batch = [self._queue.popleft()]
            key = batch[0][0].batch_key
            start = time.perf_counter()
            until, tail_until = start + self.cfg.max_batch_wait_ms / 1e3, start + self.cfg.tail_wait_ms / 1e3
            while len(batch) < self.max_batch:
                same = [item for item in self._queue if item[0].batch_key == key][: self.max_batch - len(batch)]
                for item in same:
                    self._queue.remove(item)
                batch += same
                left = self._batch_deadline(until, tail_until) - time.perf_counter()
                if len(batch) >= self.max_batch or left <= 0:
                    break
                self._cv.wait(left)
            self.stats.queue_depth = len(self._queue)
        return batch

    def _batch_deadline(self, until: float, tail_until: float) -> float:
        return batch_deadline(until, tail_until, self._finishing, self._finished_at, self.cfg.max_batch_wait_ms / 1e3)

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            now = time.perf_counter()
            live = []
            for request, future in batch:
                waited = now - request.arrived
                if waited > self.cfg.job_timeout_s:
                    self.stats_of(request).count("timeout")
                    future.set_exception(JobExpiredError(
                        f"request `{request.id}` waited {waited:.1f}s in the queue, past the service's "
                        f"{self.cfg.job_timeout_s:g}s `job_timeout_s`, and was dropped unrun: the service is "
                        "overloaded; submit it again later"))
                elif future.set_running_or_notify_cancel():
                    live.append((request, future))
            if live:
                self._run_batch(live, now)

    def _run_batch(self, batch: list[tuple[GenerationRequest, Future]], started: float) -> None:
        futures = {request.id: future for request, future in batch}
        requests = [request for request, _ in batch]
        self.stats.batch(len(requests))

        def emit(job: GridJob) -> None:
            job.stages["queue"] = started - job.request.arrived
            with self._cv:
                self._finishing += 1
            future = futures.pop(job.request.id)
            try:
                if job.error is not None:                       # meshing on the device found no surface
                    raise job.error
                if job.grid is None:                            # meshed on the device: the GLB bytes remain
                    done = self._glb_threads.submit(export_glb, job)
                else:
                    done = self._mesh_pool.submit(job.grid, self.pipeline.shapes.cfg.bounds)
            except Exception as exc:  # no surface, or the mesh workers are gone: this request fails, the rest go on
                failed: Future = Future()
                failed.set_exception(exc if isinstance(exc, Cube3DError)
                                     else GenerationServiceError(f"meshing failed: {exc}"))
                self._finish(job, failed, future)
                return
            done.add_done_callback(lambda finished: self._finish(job, finished, future))

        try:
            with DEVICE_TURN:
                self.pipeline.run_batch(requests, emit)
        except Exception as exc:  # one bad batch must not stop the worker: its requests fail, the next run
            log.exception("generation batch of %d failed", len(requests))
            for request in requests:
                if request.id in futures:
                    self.stats_of(request).count("failed")
                    futures[request.id].set_exception(exc if isinstance(exc, Cube3DError)
                                                      else GenerationServiceError(f"generation failed: {exc}"))

    def _finish(self, job: GridJob, done: "Future[MeshOutput]", future: Future) -> None:
        try:
            self._set_outcome(job, done, future)
        finally:
            with self._cv:
                self._finishing -= 1
                self._finished_at = time.perf_counter()
                self._cv.notify_all()

    def _set_outcome(self, job: GridJob, done: "Future[MeshOutput]", future: Future) -> None:
        exc = done.exception()
        if exc is not None:  # e.g. MeshError: the tokens decode to an empty volume
            self.stats_of(job.request).count("failed")
            future.set_exception(exc)
            return
        result = result_of(job, done.result())
        result.stages["total"] = time.perf_counter() - job.request.arrived
        self.stats_of(job.request).record(result.stages, len(result.tokens))
        future.set_result(result)
