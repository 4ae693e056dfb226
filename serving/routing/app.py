"""The gateway's HTTP app: the generation API of its replicas (`POST /generate`, `GET /jobs/{id}`, the rest
passed on), with API keys and token budgets checked once, here.

- Keys: with keys on, the gateway identifies the key (401), checks its grant of the conditioning feature service
  (403) and charges each mesh's generated shape tokens to the key's budget (429), as `generate-server` does, and
  gives them back when no mesh comes of it (the replica refused or failed; for a job, when a poll sees it failed).
  The replicas behind it run without keys (`--no-require-api-key`, on loopback or a private network): the gateway
  is their only door, so nothing is charged twice. With keys off here, the client's key is passed on, and the
  replicas may check it themselves (each with its own budgets).
- Job ids: a replica's job id comes back prefixed with the replica's tag (`{tag}-{id}`, in the body, `poll` and
  `Location`), so `GET /jobs/{tag}-{id}` goes to the replica that runs it, whichever gateway process is asked.
  With keys on, a job is visible only to the key that submitted it.
- Idempotent: GET and HEAD, and `POST /generate` with an `X-Request-ID` (the client names the request, saying that
  running it twice is fine; the mesh is the same for the same body). Only those are retried after a replica may
  have started them; see `serving.routing.router`.
- Waiting: a replica may take `--timeout` (90 s) to answer, or a request's own `timeout_s` plus 10 s when that is
  longer (generate-server waits up to `timeout_s` before it answers with a job). A job's poll that answers the
  job's failure (a 5xx) does not count against the replica: only a connection that fails does.
- `/health` (the gateway), `/ready` (some replica in rotation), `/metrics` and `/stats` (per replica) are the
  gateway's own. Each passed-on answer names its replica's tag in `X-Replica`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import orjson

from common.config import HttpSettings
from serving.api_keys import ApiKey
from serving.asgi import AsgiApp, refuse_startup
from serving.gateway import TOKENS, Gateway, Refusal
from serving.json_body import error_json
from serving.routing.metrics import RouterMetrics, summary
from serving.routing.replica import Replica
from serving.routing.router import Router
from serving.routing.upstream import Answer, ReplicaFailed, ReplicaUnreachable

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 << 10  # generate-server's limit: a larger body would only be refused there
MAX_JOBS_PER_REPLICA = 1024  # as many as a replica remembers
REPLY_GRACE_S = 10.0  # past a request's `timeout_s`: the replica answers by then (the mesh, or a 202 with a job)
MAX_WAIT_S = 3600.0  # the longest wait a request's `timeout_s` gets from the gateway (as `--timeout`)
JSON = b"application/json"
Reply = tuple[int, bytes, bytes, list]
_JOB_ID = re.compile(r"[A-Za-z0-9_.~-]{1,128}")  # a replica's job ids are hex


@dataclass(frozen=True)
class MeshCharge:
    """What a mesh costs a key: the feature service its key must be granted, the shape tokens it spends."""

    feature_service: str
    tokens: int


@dataclass
class _Job:
    key: ApiKey
    refunded: bool = False


def _error(status: int, message: str, code: str, headers: Optional[list] = None) -> Reply:
    return status, error_json(message, code), JSON, headers or []


def _refused(refusal: Refusal) -> Reply:
    return _error(refusal.status, refusal.message, refusal.code, refusal.headers)


def _reply(answer: Answer, replica: Optional[Replica]) -> Reply:
    headers = answer.headers + [(b"x-replica", replica.tag.encode())] if replica is not None else answer.headers
    return answer.status, answer.body, answer.content_type or JSON, headers


def _replica_wait_s(body: bytes, default_s: float) -> float:
    """How long the replica may take to answer this `POST /generate`: the gateway's `--timeout`, or longer when
    the request asks to wait longer (`timeout_s`), so that a slow mesh it asked for does not fail the replica over."""
    try:
        asked = orjson.loads(body).get("timeout_s")
    except (orjson.JSONDecodeError, AttributeError):
        return default_s   # not a JSON object: the replica answers 400 at once
    if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not asked > 0:
        return default_s   # refused by the replica at once, which says why
    return max(default_s, min(float(asked), MAX_WAIT_S) + REPLY_GRACE_S)


def _with_gateway_job_id(answer: Answer, replica: Replica) -> tuple[Answer, Optional[str]]:
    """A 202's job id, `poll` and `Location` as the gateway's (`{tag}-{id}`); the answer unchanged otherwise (also
    for an id that is not a URL-safe string: it goes into a header and a path)."""
    try:
        data = orjson.loads(answer.body)
        replica_job = data["job_id"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return answer, None
    if not isinstance(replica_job, str) or not _JOB_ID.fullmatch(replica_job):
        return answer, None
    job_id = f"{replica.tag}-{replica_job}"
    data["job_id"], data["poll"] = job_id, f"/jobs/{job_id}"
    headers = [(n, v) for n, v in answer.headers if n != b"location"] + [(b"location", data["poll"].encode())]
    return Answer(answer.status, orjson.dumps(data), answer.content_type, headers), job_id


class GatewayApp(AsgiApp):
    """The app (`respond`, as `serving.http_protocol` calls it, and an ASGI face for the lifespan)."""

    max_body_bytes = MAX_BODY_BYTES

    def __init__(self, router: Router, make_keys: Optional[Callable[[], Gateway]] = None,
                 charge: Optional[MeshCharge] = None, http: Optional[HttpSettings] = None):
        if make_keys is not None and charge is None:
            raise ValueError("with API keys on, the gateway needs the `charge` of a mesh")
        self.http = http or HttpSettings()
        self.router = router
        self.make_keys, self.charge = make_keys, charge
        self.keys: Optional[Gateway] = None
        self.jobs: collections.OrderedDict[str, _Job] = collections.OrderedDict()  # with keys on: job id -> owner
        self.max_jobs = MAX_JOBS_PER_REPLICA * len(router.replicas)
        self.prober: Optional[asyncio.Task] = None
        self.exposition = RouterMetrics(router)
        self.routes = {"/health": self.health, "/ready": self.ready, "/metrics": self.metrics, "/stats": self.stats}

    async def respond(self, method: str, path: str, body: Optional[bytes], api_key: Optional[str] = None,
                      request_id: Optional[str] = None) -> Reply:
        """The reply to one request; `body` None: it was over `MAX_BODY_BYTES`."""
        own = self.routes.get(path)
        try:
            if own is not None:
                if method not in ("GET", "HEAD"):
                    return _error(405, f"{path} takes GET", "method_not_allowed", [(b"allow", b"GET, HEAD")])
                return own()
            if body is None:
                return _error(413, f"request body over {MAX_BODY_BYTES} bytes; send a shorter prompt",
                              "body_too_large")
            headers = self._headers(api_key, request_id, bool(body))
            if path == "/generate" and method == "POST":
                return await self.generate(body, headers, api_key, request_id is not None)
            if path.startswith("/jobs/"):
                if method not in ("GET", "HEAD"):  # answered here: a poll's refusal would refund the job's tokens
                    return _error(405, f"{path} takes GET", "method_not_allowed", [(b"allow", b"GET, HEAD")])
                return await self.job(method, path[len("/jobs/"):], headers, api_key)
            upstream = "GET" if method == "HEAD" else method  # a HEAD answer has no body to read
            return _reply(*await self.router.forward(upstream, path, body, headers, method in ("GET", "HEAD")))
        except Exception as exc:  # a bug, not the request: log it, answer JSON, keep serving
            log.exception("%s %s failed", method, path)
            return _error(500, f"internal error ({type(exc).__name__}); see the gateway's log", "internal")

    def _headers(self, api_key: Optional[str], request_id: Optional[str], has_body: bool) -> bytes:
        """Header lines for the replica: the body's type, the client's request id, and its key when the
        gateway does not check keys itself."""
        lines = b"content-type: application/json\r\n" if has_body else b""
        if request_id is not None:
            lines += b"x-request-id: %s\r\n" % request_id.encode()
        if self.make_keys is None and api_key:
            lines += b"authorization: Bearer %s\r\n" % api_key.encode("latin-1")
        return lines

    def _identify(self, api_key: Optional[str]) -> Union[ApiKey, Refusal, None]:
        return self.keys.identify(api_key) if self.keys is not None else None

    async def generate(self, body: bytes, headers: bytes, api_key: Optional[str], idempotent: bool) -> Reply:
        key = self._identify(api_key)
        if isinstance(key, Refusal):
            return _refused(key)
        charge = self.charge
        if key is not None and charge is not None:
            refusal = self.keys.admit(key, charge.feature_service, TOKENS, charge.tokens)  # type: ignore[union-attr]
            if refusal is not None:
                return _refused(refusal)
        answer, replica = await self.router.forward("POST", "/generate", body, headers, idempotent,
                                                    _replica_wait_s(body, self.router.settings.timeout_s))
        if key is not None and charge is not None and answer.status not in (200, 202):
            self.keys.refund(key, TOKENS, charge.tokens)  # type: ignore[union-attr]
        if answer.status == 202 and replica is not None:
            answer, job_id = _with_gateway_job_id(answer, replica)
            if key is not None and job_id is not None:
                self._remember(job_id, key)
        return _reply(answer, replica)

    def _remember(self, job_id: str, key: ApiKey) -> None:
        while len(self.jobs) >= self.max_jobs:
            self.jobs.popitem(last=False)
        self.jobs[job_id] = _Job(key)

    async def job(self, method: str, job_id: str, headers: bytes, api_key: Optional[str]) -> Reply:
        key = self._identify(api_key)
        if isinstance(key, Refusal):
            return _refused(key)
        tag, _, replica_job = job_id.partition("-")
        replica = self.router.by_tag.get(tag)
        entry = self.jobs.get(job_id)
        owned = key is None or (entry is not None and entry.key.key_id == key.key_id)
        if replica is None or not replica_job or not owned:
            return _error(404, f"no job `{job_id}`: unknown, replaced by newer jobs, or submitted with another key",
                          "unknown_job")
        try:
            answer = await self.router.send(replica, "GET" if method == "HEAD" else method, f"/jobs/{replica_job}",
                                            b"", headers, judged=False)
        except (ReplicaUnreachable, ReplicaFailed) as exc:
            return _error(503, f"job `{job_id}` runs on replica {replica.tag}, which cannot be reached now ({exc}); "
                               "poll again later", "replica_unreachable", [(b"retry-after", b"2")])
        if answer.status == 202:
            answer, _ = _with_gateway_job_id(answer, replica)
        elif answer.status >= 400 and answer.status != 404 and entry is not None and not entry.refunded:
            entry.refunded = True  # the job failed or expired: no mesh, no charge
            self.keys.refund(entry.key, TOKENS, self.charge.tokens)  # type: ignore[union-attr]
        return _reply(answer, replica)

    def health(self) -> Reply:
        return 200, b'{"status":"ok"}', JSON, []

    def ready(self) -> Reply:
        ready = [r.url for r in self.router.replicas if r.in_rotation]
        if not ready:
            return _error(503, "no replica is in rotation; see /stats for why each was ejected", "no_replica")
        return 200, orjson.dumps({"status": "ready", "replicas": ready}), JSON, []

    def metrics(self) -> Reply:
        return 200, self.exposition.scrape(), b"text/plain; version=0.0.4; charset=utf-8", []

    def stats(self) -> Reply:
        return 200, orjson.dumps(summary(self.router)), JSON, []

    async def _lifespan(self, receive: Callable, send: Callable) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.keys = self.make_keys() if self.make_keys is not None else None
                except Exception as exc:  # the registry is unreachable: refuse to start, say why
                    await refuse_startup(send, log, "gateway", exc)
                    return
                await self.router.probe()
                self.prober = asyncio.get_running_loop().create_task(self.router.probe_forever())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.prober is not None:
                    self.prober.cancel()
                self.router.close()
                if self.keys is not None:
                    self.keys.close()  # writes the usage counted since the last flush
                await send({"type": "lifespan.shutdown.complete"})
                return


def serve(app: GatewayApp, host: str = "127.0.0.1", port: int = 6580, log_level: str = "info") -> Any:
    """Serve until interrupted: one process, uvicorn with the servers' HTTP protocol."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, lifespan="on", access_log=False, log_level=log_level,
                            http="serving.http_protocol:HttpProtocol")
    uvicorn.Server(config).run()
