"""The generation service over HTTP, as a plain ASGI app (the feature server's style: no framework, orjson).

- `POST /generate` `{"prompt": ..., "asset_id"?: ..., "seed"?: 0, "top_p"?: 0.9, "timeout_s"?: 60, "async"?: false}`
  answers the mesh (`model/gltf-binary`) with `Server-Timing` per stage, or with `"async": true` a job id at once
  (202) to poll at `GET /jobs/{id}`: 202 while queued or running, then the mesh (200) or the error.
- `GET /health`, `GET /ready` (models loaded), `GET /metrics` (Prometheus: per-stage histograms and P50/P99,
  outcomes, fallbacks, batch sizes, queue depth), `GET /stats` (the same percentiles as JSON).
- 400 for a bad body (the message names the field), 429 with `Retry-After` when the queue is full, 504 past the
  request's deadline, 503 while the models load.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import Future
from typing import Awaitable, Callable, Optional

import orjson

from inference.errors import Cube3DError, MeshError
from inference.service.pipeline import GenerationRequest, GenerationResult
from inference.service.service import BadRequestError, GenerationService, RequestTimeoutError, ServiceError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 10
MAX_JOBS = 1024
JSON, GLB = b"application/json", b"model/gltf-binary"
Reply = tuple[int, bytes, bytes, list]  # status, body, content type, extra headers


def _error(status: int, message: str, code: str, headers: Optional[list] = None) -> Reply:
    return status, orjson.dumps({"error": message, "code": code}), JSON, headers or []


def _failure(exc: BaseException) -> Reply:
    if isinstance(exc, ServiceError):
        retry = [(b"retry-after", b"2")] if exc.status == 429 else []
        return _error(exc.status, str(exc), exc.code, retry)
    if isinstance(exc, MeshError):
        return _error(422, f"{exc}; try another prompt or seed", "empty_mesh")
    if isinstance(exc, Cube3DError):
        return _error(500, str(exc), "generation_failed")
    log.error("unexpected failure: %r", exc)
    return _error(500, f"generation failed: {type(exc).__name__}", "internal")


def _mesh(result: GenerationResult) -> Reply:
    timing = ", ".join(f"{k};dur={v * 1e3:.3f}" for k, v in result.stages.items())
    headers = [(b"x-request-id", result.request_id.encode()), (b"server-timing", timing.encode()),
               (b"x-batch-size", b"%d" % result.batch_size)]
    if result.fallback:
        headers.append((b"x-feature-fallback", result.fallback.encode()))
    return 200, result.glb, GLB, headers


def parse_body(body: bytes) -> tuple[GenerationRequest, bool]:
    """The request and whether the caller wants a job id instead of waiting for the mesh."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequestError('the body must be a JSON object such as {"prompt": "a wooden chair"}')
    known = {"prompt", "asset_id", "seed", "top_p", "timeout_s", "async"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadRequestError(f"unknown field(s) {', '.join(f'`{k}`' for k in unknown)}; "
                              f"valid: {', '.join(sorted(known))}")
    wants_job = data.get("async", False)
    if not isinstance(wants_job, bool):
        raise BadRequestError("`async` must be true or false")
    request = GenerationRequest(prompt=data.get("prompt"), asset_id=data.get("asset_id"), seed=data.get("seed", 0),
                                top_p=data.get("top_p"), timeout_s=data.get("timeout_s"))
    return request, wants_job


class GenerationApp:
    """ASGI app; `make_service` runs at start-up in a thread (it loads the models and warms them up)."""

    def __init__(self, make_service: Callable[[], GenerationService]):
        self.make_service = make_service
        self.service: Optional[GenerationService] = None
        self.jobs: collections.OrderedDict[str, tuple[GenerationRequest, Future]] = collections.OrderedDict()
        self.routes: dict[str, Callable[[Callable], Awaitable[Reply]]] = {
            "/health": self.health, "/ready": self.ready, "/metrics": self.metrics, "/stats": self.stats}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            status, body, kind, headers = await self._route(scope, receive)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", kind), (b"content-length", b"%d" % len(body)), *headers]})
            await send({"type": "http.response.body", "body": body})

    async def _route(self, scope: dict, receive: Callable) -> Reply:
        path, method = scope["path"], scope["method"]
        if path == "/generate":
            if method != "POST":
                return _error(405, "/generate takes POST with a JSON body", "method_not_allowed")
            return await self.generate(receive)
        if path.startswith("/jobs/") and method == "GET":
            return self.job(path[len("/jobs/"):])
        if path in self.routes and method == "GET":
            return await self.routes[path](receive)
        return _error(404, f"no endpoint {method} {path}; endpoints: POST /generate, GET /jobs/ID, /health, "
                           "/ready, /metrics, /stats", "not_found")

    async def generate(self, receive: Callable) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading; retry in a few seconds", "starting")
        try:
            request, wants_job = parse_body(await _read_body(receive))
            future = self.service.submit(request)
        except ServiceError as exc:
            return _failure(exc)
        if wants_job:
            self._remember(request, future)
            return 202, orjson.dumps({"job_id": request.id, "status": "queued", "poll": f"/jobs/{request.id}"}), \
                JSON, []
        timeout = self.service.deadline(request) - time.perf_counter()
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), max(0.0, timeout))
        except asyncio.TimeoutError:
            self.service.stats.count("timeout")
            return _failure(RequestTimeoutError(f"no mesh within the request's {self.service.timeout(request):g}s "
                                                "timeout; retry later or with a larger `timeout_s`"))
        except Exception as exc:  # the service's own errors, mapped to their status
            return _failure(exc)
        return _mesh(result)

    def _remember(self, request: GenerationRequest, future: Future) -> None:
        while len(self.jobs) >= MAX_JOBS:
            self.jobs.popitem(last=False)                                       # the oldest job is forgotten
        self.jobs[request.id] = (request, future)

    def job(self, job_id: str) -> Reply:
        entry = self.jobs.get(job_id)
        if entry is None:
            return _error(404, f"no job `{job_id}`: unknown, or one of the {MAX_JOBS} newest jobs replaced it",
                          "unknown_job")
        request, future = entry
        if not future.done():
            status = "running" if future.running() else "queued"
            return 202, orjson.dumps({"job_id": job_id, "status": status}), JSON, []
        exc = future.exception()
        return _failure(exc) if exc is not None else _mesh(future.result())

    async def health(self, receive: Callable) -> Reply:
        return 200, b'{"status":"ok"}', JSON, []

    async def ready(self, receive: Callable) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        return 200, orjson.dumps({"status": "ready", "model": self.service.cfg.model}), JSON, []

    async def metrics(self, receive: Callable) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        return 200, self.service.stats.exposition(), b"text/plain; version=0.0.4; charset=utf-8", []

    async def stats(self, receive: Callable) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        return 200, orjson.dumps(self.service.stats.summary()), JSON, []

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.service = await asyncio.get_running_loop().run_in_executor(None, self.make_service)
                except Exception as exc:  # weights missing, bad settings: refuse to start, say why
                    log.error("generation service cannot start: %s", exc)
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.service is not None:
                    await asyncio.get_running_loop().run_in_executor(None, self.service.close)
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _read_body(receive: Callable[[], Awaitable[dict]]) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequestError("the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequestError(f"request body over {MAX_BODY_BYTES} bytes; send a shorter prompt")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def serve(make_service: Callable[[], GenerationService], host: str = "127.0.0.1", port: int = 6570) -> None:
    """Serve until interrupted: one process (one GPU), uvicorn over the ASGI app."""
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable from other machines; the service has no authentication", host)
    uvicorn.run(GenerationApp(make_service), host=host, port=port, lifespan="on", access_log=False,
                log_level="info", timeout_keep_alive=30)

