"""The generation service over HTTP, as a plain ASGI app (the feature server's style: no framework, orjson).

- `POST /generate` `{"prompt": ..., "asset_id"?: ..., "seed"?: 0, "top_p"?: 0.9, "timeout_s"?: 60, "async"?: false}`
  answers the mesh (`model/gltf-binary`) with `Server-Timing` per stage and `X-Request-ID` (the caller's when it
  sent one, else the request's own id, which a job's is too). `timeout_s` (default the service's
  `timeout_s`) is how long the caller waits: when it passes first, the request is not failed but answered like
  `"async": true`, with a job id (202, `Location: /jobs/{id}`, a `detail` saying why) while the mesh goes on being
  made. Poll `GET /jobs/{id}`: 202 while queued or running, then the mesh (200) or the error.
- `GET /health`, `GET /ready` (models loaded), `GET /metrics` (Prometheus: per-stage histograms and P50/P99,
  outcomes, fallbacks, batch sizes, queue depth), `GET /stats` (the same percentiles as JSON).
- No client input gets a 5xx: 400 for a bad body (the message names the field), 422 for a prompt whose object has
  no surface, 429 with `Retry-After` when the queue is full. 503 only says the server cannot take work: models
  still loading, shutting down, or overloaded so far that a request stayed queued past the service's
  `job_timeout_s` and was dropped unrun (`expired`, with `Retry-After`: submit again). A polled job that expired is
  410 `expired`: that job will never run, so its URL is gone for good rather than worth retrying.
- With API keys on (`serving.gateway`): `POST /generate` and `GET /jobs/{id}` need a key (401), the key must be
  granted the conditioning feature service (403), and each mesh spends the model's fixed count of generated shape
  tokens (512 for v0.1; in a rollout, those of the version the request's arm serves) from the key's per-minute
  budget, charged when the request is accepted and given back if the queue refuses it (429 with `Retry-After`) or
  the generation fails. A job is visible only to the key that submitted it.
- Served from the model registry (`inference.service.rollout`): the mesh's `X-Model-Version` header and the
  `model_version` field of job bodies name the version (`NAME/VERSION`) that admitted the request; `/ready`
  lists the versions under each alias; `/metrics` has a series per version (`arm`, `version` labels) and the
  shadow comparisons. The caller's `X-Request-ID` is the A/B split's key when given.
- Connections are `serving.http_protocol`'s, as the feature server's: the same limits (414, 431, 408, 413 past
  `MAX_BODY_BYTES`), flow control and timeouts, from `platform.http`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Optional, Union

import orjson

from common.config import HttpSettings
from inference.errors import Cube3DError, MeshError
from inference.service.openapi import OPENAPI
from inference.service.pipeline import GenerationRequest, GenerationResult
from inference.service.rollout import Rollout
from inference.service.service import BadRequestError, GenerationService, JobExpiredError, GenerationServiceError
from serving.api_keys import ApiKey
from serving.asgi import answer_http, refuse_startup
from serving.gateway import TOKENS, Gateway, Refusal
from serving.json_body import JsonBodyError, error_json, load_json

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 10
MAX_JOBS = 1024
JSON, GLB = b"application/json", b"model/gltf-binary"
Reply = tuple[int, bytes, bytes, list]  # status, body, content type, extra headers


def _error(status: int, message: str, code: str, headers: Optional[list] = None) -> Reply:
    return status, error_json(message, code), JSON, headers or []


def _failure(exc: BaseException) -> Reply:
    if isinstance(exc, GenerationServiceError):
        retry = [(b"retry-after", b"2")] if exc.status in (429, 503) else []
        return _error(exc.status, str(exc), exc.code, retry)
    if isinstance(exc, MeshError):
        return _error(422, f"{exc}; try another prompt or seed", "empty_mesh")
    if isinstance(exc, Cube3DError):
        return _error(500, str(exc), "generation_failed")
    log.error("unexpected failure: %r", exc)
    return _error(500, f"generation failed: {type(exc).__name__}", "internal")


def _refused(refusal: Refusal) -> Reply:
    return _error(refusal.status, refusal.message, refusal.code, refusal.headers)


def _consume(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


def _job(request: GenerationRequest, future: Future, detail: Optional[str] = None) -> Reply:
    """202: the job is queued or running; `detail` says why the caller got a job id rather than the mesh."""
    poll = f"/jobs/{request.id}"
    body = {"job_id": request.id, "status": "running" if future.running() else "queued", "poll": poll}
    if request.model_version is not None:
        body["model_version"] = request.model_version
    if detail is not None:
        body["detail"] = detail
    return 202, orjson.dumps(body), JSON, [(b"location", poll.encode())]


def _mesh(result: GenerationResult, client_id: Optional[str]) -> Reply:
    """The mesh's answer: `X-Request-ID` is the caller's when it sent one, else the request's own (its job id)."""
    timing = ", ".join(f"{k};dur={v * 1e3:.3f}" for k, v in result.stages.items())
    headers = [(b"x-request-id", (client_id or result.request_id).encode()), (b"server-timing", timing.encode()),
               (b"x-batch-size", b"%d" % result.batch_size)]
    if result.fallback:
        headers.append((b"x-feature-fallback", result.fallback.encode()))
    if result.model_version:
        headers.append((b"x-model-version", result.model_version.encode()))
    return 200, result.glb, GLB, headers


def parse_body(body: bytes) -> tuple[GenerationRequest, bool]:
    """The request and whether the caller wants a job id instead of waiting for the mesh."""
    try:
        data = load_json(body)
    except JsonBodyError as exc:
        raise BadRequestError(str(exc)) from None
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
    """The app (`respond`, as `serving.http_protocol` calls it, and an ASGI face); `make_service` runs at start-up
    in a thread (it loads the models and warms them up)."""

    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, make_service: Callable[[], Union[GenerationService, Rollout]],
                 make_gateway: Optional[Callable[[], Gateway]] = None, http: Optional[HttpSettings] = None):
        self.http = http or HttpSettings()
        self.make_service = make_service
        self.make_gateway = make_gateway  # None: no API keys asked; else checked on /generate and /jobs
        self.service: Optional[Union[GenerationService, Rollout]] = None
        self.gateway: Optional[Gateway] = None
        # job id -> (request, future, id of the key that submitted it, None without keys)
        self.jobs: collections.OrderedDict[str, tuple[GenerationRequest, Future, Optional[str]]] = \
            collections.OrderedDict()
        self.routes: dict[str, Callable[[], Awaitable[Reply]]] = {
            "/health": self.health, "/ready": self.ready, "/metrics": self.metrics, "/stats": self.stats,
            "/openapi.json": self.openapi}

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await answer_http(self, scope, receive, send)

    async def respond(self, method: str, path: str, body: Optional[bytes], api_key: Optional[str] = None,
                      request_id: Optional[str] = None) -> Reply:
        """The reply to one request; `body` None: it was over `MAX_BODY_BYTES`. (`request_id`, the client's
        `X-Request-ID`, is the A/B split's key for a rollout.)"""
        try:
            if path == "/generate":
                if method != "POST":
                    return _error(405, "/generate takes POST with a JSON body", "method_not_allowed",
                                  [(b"allow", b"POST")])
                return await self.generate(body, api_key, request_id)
            if path.startswith("/jobs/") or path in self.routes:
                if method not in ("GET", "HEAD"):
                    return _error(405, f"{path} takes GET", "method_not_allowed", [(b"allow", b"GET, HEAD")])
                if path in self.routes:
                    return await self.routes[path]()
                return self.job(path[len("/jobs/"):], api_key)
        except Exception as exc:  # a bug, not the request: log it, answer JSON, keep serving
            log.exception("%s %s failed", method, path)
            return _error(500, f"internal error ({type(exc).__name__}); see the server log", "internal")
        return _error(404, f"no endpoint {method} {path}; endpoints: POST /generate, GET /jobs/ID, /health, "
                           "/ready, /metrics, /stats, /openapi.json", "not_found")

    async def generate(self, body: Optional[bytes], api_key: Optional[str] = None,
                       request_id: Optional[str] = None) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading; retry in a few seconds", "starting")
        key = self.gateway.identify(api_key) if self.gateway is not None else None
        if isinstance(key, Refusal):
            return _refused(key)
        if body is None:
            return _error(413, f"request body over {MAX_BODY_BYTES} bytes; send a shorter prompt", "body_too_large")
        try:
            request, wants_job = parse_body(body)
            request.client_id = request_id
            future = self._submit(self.service, request, key)
        except GenerationServiceError as exc:
            return _failure(exc)
        if isinstance(future, Refusal):
            return _refused(future)
        owner = key.key_id if key is not None else None
        if wants_job:
            self._remember(request, future, owner)
            return _job(request, future)
        wait_s = request.timeout_s or self.service.cfg.timeout_s
        left = request.arrived + wait_s - time.perf_counter()
        try:
            # Shielded: a cancelled future would make the service's worker thread fail when it later settles it;
            # what it settles after the wait is consumed by `_consume` rather than logged as never retrieved.
            waiting = asyncio.wrap_future(future)
            waiting.add_done_callback(_consume)
            result = await asyncio.wait_for(asyncio.shield(waiting), max(0.0, left))
        except asyncio.TimeoutError:  # the caller's wait is over, not the job: it goes on, to be polled
            self._remember(request, future, owner)
            return _job(request, future, f"the mesh was not ready within {wait_s:g}s (`timeout_s`); it is still "
                                            f"being made: poll /jobs/{request.id}")
        except Exception as exc:  # the service's own errors, mapped to their status
            return _failure(exc)
        return _mesh(result, request.client_id)

    def _submit(self, service: Union[GenerationService, Rollout], request: GenerationRequest,
                key: Optional[ApiKey]) -> Union[Future, Refusal]:
        """Queue the request, first charging the key's token budget: given back if the queue refuses it or the
        generation fails (expired in the queue, no surface, an error), so a key pays only for meshes made."""
        if key is None or self.gateway is None:
            return service.submit(request)
        cost = service.tokens_for(request)   # a rollout's: the version the request's arm serves
        gateway = self.gateway
        refusal = gateway.admit(key, service.cfg.feature_service, TOKENS, cost)
        if refusal is not None:
            return refusal
        try:
            future = service.submit(request)
        except BaseException:
            gateway.refund(key, TOKENS, cost)
            raise
        loop = asyncio.get_running_loop()

        def refund_failure(done: Future) -> None:
            if done.cancelled() or done.exception() is not None:
                try:
                    loop.call_soon_threadsafe(gateway.refund, key, TOKENS, cost)
                except RuntimeError:  # the loop is closed: the server is gone and its budgets with it
                    pass

        future.add_done_callback(refund_failure)
        return future

    def _remember(self, request: GenerationRequest, future: Future, owner: Optional[str]) -> None:
        while len(self.jobs) >= MAX_JOBS:
            self.jobs.popitem(last=False)                                       # the oldest job is forgotten
        self.jobs[request.id] = (request, future, owner)

    def job(self, job_id: str, api_key: Optional[str] = None) -> Reply:
        key = self.gateway.identify(api_key) if self.gateway is not None else None
        if isinstance(key, Refusal):
            return _refused(key)
        entry = self.jobs.get(job_id)
        if entry is None or (key is not None and entry[2] != key.key_id):
            return _error(404, f"no job `{job_id}`: unknown, one of the {MAX_JOBS} newest jobs replaced it, or "
                               "submitted with another key", "unknown_job")
        request, future, _ = entry
        if not future.done():
            return _job(request, future)
        exc = future.exception()
        if isinstance(exc, JobExpiredError):  # never to run: gone; a 503's Retry-After would promise this URL a mesh
            return _error(410, str(exc), exc.code)
        return _failure(exc) if exc is not None else _mesh(future.result(), request.client_id)

    async def health(self) -> Reply:
        return 200, b'{"status":"ok"}', JSON, []

    async def openapi(self) -> Reply:
        return 200, orjson.dumps(OPENAPI), JSON, []

    async def ready(self) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        body = {"status": "ready", "model": self.service.cfg.model}
        if isinstance(self.service, Rollout):
            body["versions"] = self.service.versions()
        return 200, orjson.dumps(body), JSON, []

    async def metrics(self) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        return 200, self.service.stats.exposition(), b"text/plain; version=0.0.4; charset=utf-8", []

    async def stats(self) -> Reply:
        if self.service is None:
            return _error(503, "the models are still loading", "starting")
        return 200, orjson.dumps(self.service.stats.summary(), option=orjson.OPT_NON_STR_KEYS), JSON, []

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.service = await asyncio.get_running_loop().run_in_executor(None, self.make_service)
                    self.gateway = self.make_gateway() if self.make_gateway is not None else None
                except Exception as exc:  # weights missing, bad settings: refuse to start, say why
                    await refuse_startup(send, log, "generation service", exc)
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.service is not None:
                    await asyncio.get_running_loop().run_in_executor(None, self.service.close)
                if self.gateway is not None:
                    self.gateway.close()  # writes the usage counted since the last flush
                await send({"type": "lifespan.shutdown.complete"})
                return


def server_config(app: GenerationApp, host: str = "127.0.0.1", port: int = 6570, log_level: str = "info") -> Any:
    """uvicorn's settings for the app: our HTTP protocol (its limits from `app.http`), lifespan on."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, lifespan="on", access_log=False, log_level=log_level,
                          http="serving.http_protocol:HttpProtocol")


def serve(make_service: Callable[[], Union[GenerationService, Rollout]], host: str = "127.0.0.1", port: int = 6570,
          make_gateway: Optional[Callable[[], Gateway]] = None, http: Optional[HttpSettings] = None) -> None:
    """Serve until interrupted: one process (one GPU), uvicorn over the app; API keys when `make_gateway`."""
    import uvicorn

    if make_gateway is None:
        log.warning("API keys are off: any caller may generate (turn them on with platform.auth.enabled: true "
                    "or --require-api-key)")
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("serving on %s: reachable from other machines without API keys", host)
    uvicorn.Server(server_config(GenerationApp(make_service, make_gateway, http), host, port)).run()

