"""The feature server: Feast's `POST /get-online-features` and `POST /push`, `/health`, `/ready`, `/metrics`,
`/stats` and `/openapi.json`.

No web framework on the hot path: a request is routed by a dict lookup, parsed by orjson, checked by hand
(so every bad input gets a 400 naming the problem, never a 500), served by `AsyncOnlineClient` and timed into
log-linear histograms; a one-row read is answered from the Redis reply's callback (`answer_soon`), with no task or
coroutine per request. Redis failures become 503 within the client's timeout. With API keys on
(`serving.gateway`), feature reads answer 401/403/429 before any Redis work; the probes stay open. A feature
service with logging gets a sample of its answers, the bytes sent, queued for `serving.feature_log` (the answer
then carries `x-request-id`). Service-to-service callers may send and receive Arrow IPC streams instead of JSON
on the same route (`serving.arrow_ipc`: `Content-Type` / `Accept: application/vnd.apache.arrow.stream`), through
the same code: only the parsing of the body and the encoding of the answer differ.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Optional, Union

import orjson

from common.config import HttpSettings
from common.errors import FeaturectlError
from dsl.transform import TransformationError
from redis_store.errors import RedisStoreError, RedisUnavailableError
from redis_store.node import check_replies
from serving.arrow_ipc import arrow_answer, parse_arrow_request
from serving.asgi import answer_http, refuse_startup
from serving.documents_request import parse_documents_request
from serving.drift import DriftMonitor
from serving.api_keys import ApiKey
from serving.client import AsyncOnlineClient
from serving.errors import (PushUnavailableError, RequestError, ServingError, UnknownServiceError,
                            VersionConflictError)
from serving.feature_log import FeatureLogger
from serving.freshness import FreshnessMonitor
from serving.gateway import REQUESTS, Gateway, Refusal
from serving.json_body import JsonBodyError, error_json, load_json
from serving.media import ARROW_ANSWER, ARROW_BODY, ARROW_STREAM as ARROW
from serving.metrics import CONTENT_TYPE as METRICS_TYPE, exposition
from serving.openapi import OPENAPI
from serving.push_request import parse_push_request
from serving.request import PreparedRequest
from serving.stats import ServerStats

logger = logging.getLogger(__name__)

FEATURES_PATH = "/get-online-features"
PUSH_PATH = "/push"
DOCUMENTS_PATH = "/retrieve-online-documents"
MAX_BODY_BYTES = 1 << 20
MAX_ROWS = 10_000
JSON = b"application/json"
Reply = tuple[int, bytes, bytes]  # status, body, content type
Answer = tuple[int, bytes, bytes, Any]  # a Reply and extra (name, value) headers
_STR = {str}


class BadRequest(RequestError):
    """The HTTP body is JSON of the wrong shape."""


class MalformedJSON(BadRequest):
    code = "malformed_json"


class TooLarge(BadRequest):
    code = "body_too_large"


def _error(status: int, exc: Exception, code: Optional[str] = None) -> Reply:
    return status, error_json(str(exc), code or getattr(exc, "code", "error")), JSON


def _refused(refusal: Refusal) -> tuple[int, bytes, bytes, Optional[str], Any]:
    """A gateway refusal (401/403/429) as `get_online_features` answers it; no service label."""
    return refusal.status, error_json(refusal.message, refusal.code), JSON, None, refusal.headers


def parse_request(body: bytes) -> tuple[Any, dict, bool]:
    """(features or service name, entities, full_feature_names) from Feast's request body."""
    try:
        data = load_json(body)
    except JsonBodyError as exc:
        raise MalformedJSON(str(exc)) from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object with `features` (or `feature_service`) and `entities`")
    features, service = data.get("features"), data.get("feature_service")
    if service is not None:
        if not isinstance(service, str) or not service:
            raise BadRequest("`feature_service` must be a non-empty string, the name of a feature service")
        if features:
            raise BadRequest("give either `features` or `feature_service`, not both")
        features = service
    elif not isinstance(features, list) or not features or not set(map(type, features)) <= _STR:  # checked in C
        raise BadRequest("`features` must be a non-empty list of `view:feature` strings "
                         "(or give `feature_service` instead)")
    entities = data.get("entities")
    if not isinstance(entities, dict) or not entities:
        raise BadRequest("`entities` must be an object mapping each join key to a list of values, "
                         'e.g. {"asset_id": ["a1", "a2"]}')
    for key, values in entities.items():
        if isinstance(values, list) and len(values) > MAX_ROWS:
            raise BadRequest(f"entity `{key}` has {len(values)} rows; at most {MAX_ROWS} per request")
    full = data.get("full_feature_names", False)
    if not isinstance(full, bool):
        raise BadRequest("`full_feature_names` must be true or false")
    return features, entities, full


def parse_body(body: bytes, media: int) -> tuple[Any, dict, bool]:
    """`parse_request`, or `parse_arrow_request` when the request's Content-Type said Arrow (`media`)."""
    return parse_arrow_request(body, MAX_ROWS) if media & ARROW_BODY else parse_request(body)


class FeatureServer:
    """One per worker process; `make_client` runs at startup (it reads the registry).

    `respond(method, path, body)` is the whole server: routing, parsing, serving, timing. The HTTP connection
    code (`serving.http_protocol`) calls it directly, under the limits of `http` and `max_body_bytes`, after
    `answer_soon` (the same answers for one-row reads, from a callback) declined; `__call__` is the ASGI face,
    used for lifespan events and by any other ASGI server.
    """

    max_body_bytes = MAX_BODY_BYTES
    arrow_media = True  # `serving.http_protocol` passes the Arrow bits of Content-Type and Accept (`media`)

    def __init__(self, make_client: Callable[[], AsyncOnlineClient], stats: Optional[ServerStats] = None,
                 make_gateway: Optional[Callable[[], Gateway]] = None,
                 on_started: Optional[Callable[[], None]] = None, http: Optional[HttpSettings] = None,
                 feature_log: Optional[FeatureLogger] = None, drift: Optional[DriftMonitor] = None,
                 freshness: Optional[FreshnessMonitor] = None, count_served: bool = True):
        """`on_started` runs once the client and gateway are up (the entry point freezes the heap there);
        `feature_log` None: no feature logging; `drift` samples served values for the drift metrics
        (`serving.drift`); `freshness` reads the views' newest event times and stream lags in the background for
        /metrics; `count_served` counts the rows served per view and status (`serving.served_rows`)."""
        self.http = http or HttpSettings()
        self.feature_log = feature_log
        self.make_client = make_client
        self.make_gateway = make_gateway  # None: no API keys asked (the local demo); else checked per request
        self.on_started = on_started
        self.client: Optional[AsyncOnlineClient] = None
        self.gateway: Optional[Gateway] = None
        self.stats = stats or ServerStats()
        self.routes: dict[str, tuple[str, Callable[[Optional[bytes]], Awaitable[Any]]]] = {
            FEATURES_PATH: ("POST", self.get_online_features), PUSH_PATH: ("POST", self.push),
            DOCUMENTS_PATH: ("POST", self.retrieve_online_documents),
            "/health": ("GET", self.health), "/ready": ("GET", self.ready), "/metrics": ("GET", self.metrics),
            "/stats": ("GET", self.stats_json), "/openapi.json": ("GET", self.openapi),
        }
        self._openapi = orjson.dumps(OPENAPI)
        self._sharing: Optional[asyncio.Future] = None
        self.drift = drift
        self._drifting: Optional[asyncio.Future] = None
        self.freshness = freshness
        self._watching: Optional[asyncio.Future] = None
        self.count_served = count_served

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await answer_http(self, scope, receive, send)

    async def respond(self, method: str, path: str, body: Optional[bytes], api_key: Optional[str] = None,
                      request_id: Optional[str] = None, media: int = 0) -> Answer:
        """The reply to one request (`body` None: it was over MAX_BODY_BYTES), timed into the histograms;
        `request_id` is the client's `X-Request-ID`, for feature logging; `media`, the `serving.media` bits."""
        start = time.perf_counter_ns()
        stats = self.stats
        stats.in_flight += 1
        service, headers = None, ()
        route = self.routes.get(path)
        endpoint = path if route else "other"
        try:
            if route is None:
                status, payload, kind = _error(404, RequestError(f"no endpoint {path}; see /openapi.json"),
                                               "not_found")
            elif method != route[0] and not (route[0] == "GET" and method == "HEAD"):
                status, payload, kind = _error(405, RequestError(f"{path} takes {route[0]}, not {method}"),
                                               "method_not_allowed")
                headers = ((b"allow", b"GET, HEAD" if route[0] == "GET" else route[0].encode()),)
            elif path == FEATURES_PATH:
                status, payload, kind, service, headers = await self.get_online_features(body, api_key, request_id,
                                                                                        media)
            elif route[0] == "POST":  # the other endpoints with a body, which check the API key themselves
                status, payload, kind, service, headers = await route[1](body, api_key)
            else:
                status, payload, kind = await route[1](body)
        except Exception as exc:  # a bug, not the request: log it, answer JSON, keep serving
            logger.exception("%s %s failed", method, path)
            status, payload, kind = _error(500, ServingError(f"internal error ({type(exc).__name__}); "
                                                             "see the server log"), "internal")
        finally:
            stats.in_flight -= 1
        stats.record(endpoint, status, time.perf_counter_ns() - start, service)
        return status, payload, kind, headers

    def answer_soon(self, method: str, url: bytes, body: Optional[bytes], api_key: Optional[str],
                    reply: Callable[[Answer], None], media: int = 0) -> bool:
        """Answer the usual request, a one-row feature read with nothing to log or compute, through `reply` from the
        Redis reply's callback: no task and no coroutine per request (a task and the coroutines of `respond` cost
        more than the answer itself). False, having done nothing that `respond` would not redo, for every other
        request, and for one that fails before Redis is asked: `respond` answers them. Same answers, guarantees and
        metrics as `respond`."""
        start = time.perf_counter_ns()
        client, gateway = self.client, self.gateway
        if url != b"/get-online-features" or method != "POST" or body is None or client is None \
                or not client.reads_soon():
            return False
        try:
            key = gateway.identify(api_key) if gateway is not None else None
            if isinstance(key, Refusal):
                return False
            features, entities, full = parse_body(body, media)
            if self._logged(features) is not None:
                return False
            request = client.prepare(features, entities, full)
        except Exception:  # a bad request (or a bug) fails the same way in `respond`, which answers it
            return False
        if request.rows != 1 or request.plan.on_demand or not request.commands:
            return False
        if key is not None:
            refusal = gateway.admit(key, features if isinstance(features, str) else None, REQUESTS, 1)  # type: ignore
            if refusal is not None:
                status, payload, kind, _, headers = _refused(refusal)
                self.stats.record(FEATURES_PATH, status, time.perf_counter_ns() - start)
                reply((status, payload, kind, headers))
                return True
        service = features if isinstance(features, str) else "-"
        self.stats.in_flight += 1
        client.read_soon(request, lambda replies, error: reply(
            self._row_answered(replies, error, request, features, service, start, media)))
        return True

    def _row_answered(self, replies: Optional[list], error: Optional[BaseException], request: Any, features: Any,
                      service: str, start: int, media: int) -> Answer:
        """`answer_soon`'s answer once Redis replied (`replies`) or failed (`error`)."""
        stats = self.stats
        stats.in_flight -= 1
        arrow = bool(media & ARROW_ANSWER)
        try:
            if error is not None:
                raise error
            replies = check_replies(replies, self.client.redis.where)  # type: ignore[union-attr,arg-type]
            payload, status, kind = self._answered(features, request, replies, arrow), 200, ARROW if arrow else JSON
        except Exception as exc:
            failed = self._failure("get-online-features", exc)
            if failed is None:
                logger.exception("POST %s failed", FEATURES_PATH)
                failed = _error(500, ServingError(f"internal error ({type(exc).__name__}); see the server log"),
                                "internal")
            status, payload, kind = failed
        stats.record(FEATURES_PATH, status, time.perf_counter_ns() - start, service)
        return status, payload, kind, ()

    def _identified(self, api_key: Optional[str], body: Optional[bytes], fewer: str) -> Union[ApiKey, Refusal, None]:
        """The caller's key (None with keys off) or its 401 refusal, before the body is looked at; then a body over
        the limit is a 413 (TooLarge), whose message ends with `fewer`."""
        key = self.gateway.identify(api_key) if self.gateway is not None else None
        if body is None and not isinstance(key, Refusal):
            raise TooLarge(f"request body over {MAX_BODY_BYTES} bytes; {fewer}")
        return key

    async def get_online_features(self, body: Optional[bytes], api_key: Optional[str] = None,
                                  request_id: Optional[str] = None, media: int = 0
                                  ) -> tuple[int, bytes, bytes, Optional[str], Any]:
        """The reply, the feature service label (`-` for feature lists, None when unknown) and extra headers.

        With API keys on: 401 before the body is read, then 403/429 once the feature service is known. `media`:
        the body and the answer are Arrow IPC streams (`serving.arrow_ipc`); errors are JSON either way.
        """
        service, headers = None, ()
        try:
            key = self._identified(api_key, body, "send fewer entity rows per request")
            if isinstance(key, Refusal):
                return _refused(key)
            features, entities, full = parse_body(body, media)  # type: ignore[arg-type]
            if key is not None:
                refusal = self.gateway.admit(key, features if isinstance(features, str) else None, REQUESTS, 1)
                if refusal is not None:
                    return _refused(refusal)
            service = features if isinstance(features, str) else "-"
            status, payload, kind, headers = await self._fetch(features, entities, full, request_id,
                                                                bool(media & ARROW_ANSWER))
        except TooLarge as exc:
            status, payload, kind = _error(413, exc)
        except VersionConflictError as exc:
            status, payload, kind = _error(409, exc)
        except RequestError as exc:
            status, payload, kind = _error(400, exc)
            if isinstance(exc, UnknownServiceError):
                service = None  # unknown names never become metric labels
        return status, payload, kind, service, headers

    async def push(self, body: Optional[bytes], api_key: Optional[str] = None
                   ) -> tuple[int, bytes, bytes, Optional[str], Any]:
        """Feast's `POST /push` (`serving.push`). With API keys on: 401 before the body is read, then 403/429 once
        the push source is named, before any row is checked or written."""
        try:
            key = self._identified(api_key, body, "push fewer rows per request")
            if isinstance(key, Refusal):
                return _refused(key)
            name, rows, to = parse_push_request(body)  # type: ignore[arg-type]
            refusal = self.gateway.admit_push(key, name) if key is not None else None  # type: ignore[union-attr]
            if refusal is not None:
                return _refused(refusal)
            status, payload, kind = await self._call("push", lambda client: self._pushed(client, name, rows, to))
        except TooLarge as exc:
            status, payload, kind = _error(413, exc)
        except RequestError as exc:
            status, payload, kind = _error(400, exc)
        return status, payload, kind, None, ()

    async def retrieve_online_documents(self, body: Optional[bytes], api_key: Optional[str] = None
                                        ) -> tuple[int, bytes, bytes, Optional[str], Any]:
        """Feast's `POST /retrieve-online-documents` (`serving.search`): the nearest entities of a vector feature,
        their distances and features. With API keys on, a search reads free feature lists (the `*` grant)."""
        try:
            key = self._identified(api_key, body, "send a smaller query")
            if isinstance(key, Refusal):
                return _refused(key)
            refusal = self.gateway.admit(key, None, REQUESTS, 1) if key is not None else None  # type: ignore
            if refusal is not None:
                return _refused(refusal)
            status, payload, kind = await self._call("retrieve-online-documents", lambda client: self._searched(
                client, body))  # type: ignore[arg-type]
        except TooLarge as exc:
            status, payload, kind = _error(413, exc)
        except RequestError as exc:
            status, payload, kind = _error(400, exc)
        return status, payload, kind, None, ()

    @staticmethod
    async def _searched(client: AsyncOnlineClient, body: bytes) -> bytes:
        request = parse_documents_request(body, client.registry.catalog)
        found = await client.search(request.reference, request.vector, request.k, request.filters, request.features)
        return orjson.dumps(found.to_feast_response())

    @staticmethod
    async def _pushed(client: AsyncOnlineClient, name: str, rows: dict, to: str) -> bytes:
        return orjson.dumps((await client.push(name, rows, to=to)).to_json())  # type: ignore[arg-type]

    async def _fetch(self, features: Any, entities: dict, full: bool, request_id: Optional[str],
                     arrow: bool = False) -> Answer:
        logged = None

        async def fetched(client: AsyncOnlineClient) -> bytes:
            nonlocal logged
            request, replies = await client.fetch(features, entities, full)
            payload = self._answered(features, request, replies, arrow)
            spec = self._logged(features)
            if spec is not None:  # the JSON answer, parsed back into columns by the log's writer process
                sent = orjson.dumps(request.finish(replies).to_feast_response()) if arrow else payload
                request_data = orjson.dumps({n: entities.get(n) for n in spec.request_fields}) if spec.request_fields \
                    else b""  # what the answer does not echo: its on-demand views' request data
                logged = self.feature_log.offer(  # type: ignore[union-attr]
                    spec, sent, request.rows, request_id, request_data)
            return payload

        status, payload, kind = await self._call("get-online-features", fetched)
        if arrow and status == 200:
            kind = ARROW
        return status, payload, kind, ((b"x-request-id", logged.encode()),) if logged else ()

    def _answered(self, features: Any, request: PreparedRequest, replies: list, arrow: bool = False) -> bytes:
        """Feast's JSON answer (one plain row is written straight from the replies, with no columns built), or with
        `arrow` the Arrow IPC stream of `serving.arrow_ipc`."""
        written = None if arrow else request.answer_json(replies)
        if written is not None:
            if self.count_served:
                self.stats.served.count_row(written[1])
            if self.drift is not None and self.drift.sampling():
                self.drift.offer_row(features, request.plan.row_answer, replies, written[1])
            return written[0]
        response = request.finish(replies)
        if self.count_served:
            self.stats.served.count(response.views)
        if self.drift is not None and self.drift.sampling(request.rows):
            self.drift.offer(features, response)
        if arrow:
            return arrow_answer(response, request.plan.join_keys)
        return orjson.dumps(response.to_feast_response())

    async def _call(self, what: str, call: Callable[[AsyncOnlineClient], Awaitable[bytes]]) -> Reply:
        """200 and the payload `call` makes with the client; 503 while starting or when Redis or Kafka is away,
        502 when Redis answers with an error. A RequestError goes to the caller (400)."""
        if self.client is None:
            return _error(503, ServingError("the server is starting: the registry is not loaded yet"), "starting")
        try:
            return 200, await call(self.client), JSON
        except Exception as exc:
            failed = self._failure(what, exc)
            if failed is None:
                raise
            return failed

    def _failure(self, what: str, exc: Exception) -> Optional[Reply]:
        """The reply to a call that failed with `exc`; None for a RequestError (the caller answers 400) or a bug."""
        if isinstance(exc, RedisUnavailableError):
            self.stats.redis_errors += 1
            return _error(503, exc)
        if isinstance(exc, PushUnavailableError):
            return _error(503, exc)
        if isinstance(exc, (RequestError, VersionConflictError)):
            return None
        if isinstance(exc, TransformationError):  # an on-demand view's function failed: the definition's fault
            logger.error("get-online-features failed: %s", exc)
            return _error(500, exc, "transformation_failed")
        if isinstance(exc, (ServingError, RedisStoreError)):  # Redis answered with an error (a key of another type)
            self.stats.redis_errors += 1
            logger.error("%s failed: %s", what, exc)
            return _error(502, exc, "redis_error")
        if isinstance(exc, FeaturectlError):  # the repo's definitions or settings cannot be read (a push loads them)
            logger.error("%s failed: %s", what, exc)
            return _error(503, exc, "repo_error")
        return None

    def _logged(self, features: Any) -> Any:
        """The logging spec of a requested feature service that logs its answers; None: nothing to log."""
        if self.feature_log is None or not isinstance(features, str):
            return None
        return self.client.registry.catalog.logged.get(features)  # type: ignore[union-attr]

    async def health(self, body: Optional[bytes]) -> Reply:
        return 200, b'{"status":"ok"}', JSON

    async def ready(self, body: Optional[bytes]) -> Reply:
        if self.client is None:
            return _error(503, ServingError("the registry is not loaded yet"), "starting")
        try:
            await self.client.ping()
        except (ServingError, RedisStoreError) as exc:
            self.stats.redis_errors += 1
            return _error(503, exc, "redis_unavailable")
        catalog = self.client.registry.catalog
        return 200, orjson.dumps({"status": "ready", "project": catalog.project, "feature_views": len(catalog.views),
                                  "feature_services": len(catalog.services),
                                  "registry": self.client.registry.state()}), JSON

    async def metrics(self, body: Optional[bytes]) -> Reply:
        snapshot = self.freshness.snapshot if self.freshness is not None else None
        return 200, exposition(self.stats, self.drift, snapshot, self.count_served), METRICS_TYPE.encode()

    async def stats_json(self, body: Optional[bytes]) -> Reply:
        summary = self.stats.merged().summary()
        if self.drift is not None:
            summary["drift"] = self.drift.summary()
        return 200, orjson.dumps(summary), JSON

    async def openapi(self, body: Optional[bytes]) -> Reply:
        return 200, self._openapi, JSON

    async def _share_stats(self, every_s: float = 1.0) -> None:
        """With several workers: publish this worker's counters every second for the others to merge."""
        while True:
            await asyncio.sleep(every_s)
            self.stats.dump()

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.client = self.make_client()
                    self.gateway = self.make_gateway() if self.make_gateway is not None else None
                except Exception as exc:  # registry unreadable, bad settings: refuse to start, say why
                    await refuse_startup(send, logger, "feature server", exc)
                    return
                if self.feature_log is not None:
                    self.feature_log.start()
                if self.on_started is not None:
                    self.on_started()
                if self.stats.directory is not None:
                    self._sharing = asyncio.ensure_future(self._share_stats())
                if self.drift is not None:
                    self._drifting = asyncio.ensure_future(self.drift.run(lambda: self.client.registry.catalog))
                if self.freshness is not None:
                    self._watching = asyncio.ensure_future(self.freshness.run(self.client))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in (self._sharing, self._drifting, self._watching):
                    if task is not None:
                        task.cancel()
                if self.client is not None:
                    await self.client.close()
                if self.gateway is not None:
                    self.gateway.close()  # writes the usage counted since the last flush
                if self.feature_log is not None:
                    self.feature_log.close()  # writes the vectors logged since the last flush
                self.stats.dump()
                await send({"type": "lifespan.shutdown.complete"})
                return
