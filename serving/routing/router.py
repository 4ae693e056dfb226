"""Which replica answers a request, what happens when it fails, and the health probes that drain and readmit.

`pick`: power of two choices (two replicas in rotation drawn at random, the cheaper by `Replica.cost` wins: its
latency estimate times its requests in flight + 1), or plain round robin (`balance: round-robin`, the benchmark's
peer; it ejects on failures only). When every replica is ejected, all of them are candidates again (a gateway
never refuses work only because its estimates are pessimistic).

Retries (`forward`): a request goes to another replica, at most `attempts` in all, when the replica surely did not
run it (no connection; 503: it takes no work; 429 `queue_full`), and, for idempotent requests only, also when it
may have (the connection broke or timed out mid-request, other 5xx). The caller says which requests are
idempotent; a non-idempotent one whose replica may have started it is answered 502 and not run again.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from typing import Optional, Sequence
from urllib.parse import urlsplit

from common.errors import FeaturectlError
from serving.json_body import error_json
from serving.routing.replica import Replica, RoutingSettings
from serving.routing.upstream import Answer, ReplicaClient, ReplicaFailed, ReplicaUnreachable

log = logging.getLogger(__name__)

JSON = b"application/json"
BALANCES = ("latency", "round-robin")
ROUTED_PATH = "/generate"  # the requests whose latency the estimates are made of


class RoutingError(FeaturectlError, ValueError):
    """The replicas or settings given to the gateway cannot work; the message says which and what to do."""


def parse_replica(url: str) -> tuple[str, int]:
    """(host, port) of a replica URL `http://HOST:PORT`."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise RoutingError(f"replica `{url}` is not `http://HOST:PORT` (a `featurectl generate-server`); pass "
                           "--replica http://127.0.0.1:6570 for each replica")
    return parts.hostname, parts.port


def _synthetic(status: int, message: str, code: str, retry_after: bool = False) -> Answer:
    return Answer(status, error_json(message, code), JSON, [(b"retry-after", b"1")] if retry_after else [])


def _not_run(answer: Answer) -> bool:
    """The replica answered without running the request: it cannot take work (503) or its queue is full."""
    return answer.status == 503 or (answer.status == 429 and b'"queue_full"' in answer.body)


def _eject(replica: Replica, why: str) -> None:
    if replica.in_rotation:
        replica.eject(time.monotonic(), why)
        log.warning("replica %s out of rotation for %.1f s: %s", replica.url, replica.ejected_until - time.monotonic(),
                    why)


def _measures_work(answer: Answer) -> bool:
    """Whether the answer's latency is the replica's work: not a 202 to `"async": true`, answered at once (a 202
    after the caller's `timeout_s` carries a `detail` and counts: the replica was that slow)."""
    return answer.status != 202 or b'"detail"' in answer.body


class Router:
    """The replicas of one gateway, their estimates, and the requests sent to them."""

    def __init__(self, urls: Sequence[str], settings: RoutingSettings = RoutingSettings()):
        if not urls:
            raise RoutingError("the gateway needs at least one replica: pass --replica http://HOST:PORT")
        if settings.balance not in BALANCES:
            raise RoutingError(f"unknown balance `{settings.balance}`; valid: {', '.join(BALANCES)}")
        self.settings = settings
        self.replicas: list[Replica] = []
        for url in urls:
            host, port = parse_replica(url)
            client = ReplicaClient(host, port, settings.connect_timeout_s)
            self.replicas.append(Replica(url.rstrip("/"), client, settings))
        tags = [r.tag for r in self.replicas]
        if len(set(tags)) != len(tags):
            raise RoutingError(f"replicas given twice: {', '.join(urls)}; give each replica's URL once")
        self.by_tag = {r.tag: r for r in self.replicas}
        self.retries = 0
        self._turn = itertools.count()
        self._random = random.Random()

    # choosing
    def pick(self, tried: Sequence[Replica] = ()) -> Optional[Replica]:
        """The replica for the next attempt of a request, never one it `tried`; None when none is left."""
        fresh = [r for r in self.replicas if r not in tried]
        candidates = [r for r in fresh if r.in_rotation] or fresh
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        if self.settings.balance == "round-robin":
            return candidates[next(self._turn) % len(candidates)]
        first, second = self._random.sample(candidates, 2)
        now = time.monotonic()
        return first if first.cost(now) <= second.cost(now) else second

    # sending
    async def forward(self, method: str, path: str, body: bytes, headers: bytes, idempotent: bool,
                      timeout_s: Optional[float] = None) -> tuple[Answer, Optional[Replica]]:
        """The answer of the first replica that ran the request (see the module's note on retries), and which
        replica it was (None when the answer is the gateway's own). `timeout_s`: how long a replica may take to
        answer (default `RoutingSettings.timeout_s`)."""
        tried: list[Replica] = []
        last: Optional[Answer] = None
        while len(tried) < self.settings.attempts and (replica := self.pick(tried)) is not None:
            if tried:
                self.retries += 1
            tried.append(replica)
            try:
                answer = await self.send(replica, method, path, body, headers, timeout_s=timeout_s)
            except ReplicaUnreachable as exc:
                last = _synthetic(503, f"no replica could take the request: {exc}", "no_replica", True)
                continue
            except ReplicaFailed as exc:
                if not idempotent:
                    return _synthetic(502, f"the replica failed while running the request ({exc}); it was not sent "
                                           "again, as running it twice is not safe: send an X-Request-ID with "
                                           "POST /generate to allow that", "replica_failed"), replica
                last = _synthetic(502, f"the replicas failed while running the request ({exc})", "replica_failed")
                continue
            if _not_run(answer) or (idempotent and answer.status >= 500):
                last = answer
                continue
            return answer, replica
        return last or _synthetic(503, "no replica could take the request", "no_replica", True), None

    async def send(self, replica: Replica, method: str, path: str, body: bytes = b"", headers: bytes = b"",
                   timeout_s: Optional[float] = None, judged: bool = True) -> Answer:
        """One request to one replica, its outcome recorded (estimate, errors, ejection). `judged` False: the
        answer's status is not the replica's health (a job poll answers its job's failure with a 5xx); only a
        connection that fails counts against the replica."""
        replica.in_flight += 1
        replica.requests += 1
        start = time.monotonic()
        try:
            answer = await replica.client.request(method, path, body, headers, timeout_s or self.settings.timeout_s)
        except ReplicaUnreachable as exc:
            replica.failed("connect")
            _eject(replica, str(exc))
            raise
        except ReplicaFailed as exc:
            replica.failed("broken")
            _eject(replica, str(exc))
            raise
        finally:
            replica.in_flight -= 1
        now = time.monotonic()
        replica.latency.record_ns(int((now - start) * 1e9))
        if answer.status >= 500 and judged:
            self._failed_answer(replica, answer)
        elif path == ROUTED_PATH and _measures_work(answer):
            replica.observe(now - start, now)
            replica.answered(self._slow(replica, now - start))
            if replica.slow_in_a_row >= self.settings.slow_samples and self._may_eject_for_slowness():
                _eject(replica, f"{replica.slow_in_a_row} answers in a row over {self.settings.slow_factor:g}x the "
                                "fastest replica's latency")
        return answer

    def _failed_answer(self, replica: Replica, answer: Answer) -> None:
        replica.failed("5xx")
        if answer.status == 503 or replica.failures_in_a_row >= self.settings.failures_to_eject:
            _eject(replica, f"{replica.failures_in_a_row} answers in a row with HTTP {answer.status}")

    def _slow(self, replica: Replica, seconds: float) -> bool:
        if self.settings.balance != "latency" or seconds <= self.settings.slow_floor_s:
            return False
        others = [r.ewma_s for r in self.replicas if r is not replica and r.in_rotation and r.samples]
        return bool(others) and seconds > self.settings.slow_factor * min(others)

    def _may_eject_for_slowness(self) -> bool:
        out = sum(not r.in_rotation for r in self.replicas)
        return out + 1 <= int(len(self.replicas) * self.settings.max_slow_share)

    # probing
    async def probe(self) -> None:
        """One round of health probes: replicas in rotation, and ejected ones whose back-off has passed."""
        now = time.monotonic()
        due = [r for r in self.replicas if r.in_rotation or now >= r.ejected_until]
        await asyncio.gather(*(self._probe(r) for r in due))

    async def _probe(self, replica: Replica) -> None:
        try:
            answer = await replica.client.request("GET", "/ready", timeout_s=max(self.settings.probe_s, 1.0))
            healthy, why = answer.status == 200, f"/ready answered {answer.status}"
        except (ReplicaUnreachable, ReplicaFailed) as exc:
            healthy, why = False, str(exc)
        now = time.monotonic()
        if healthy and not replica.in_rotation:
            log.info("replica %s is back in rotation", replica.url)
            replica.readmit()
        elif not healthy and replica.in_rotation:
            _eject(replica, why)
        elif not healthy:
            replica.extend(now, why)

    async def probe_forever(self) -> None:
        while True:
            try:
                await self.probe()
            except Exception:  # a bug in a probe must not stop the probing
                log.exception("health probe round failed")
            await asyncio.sleep(self.settings.probe_s)

    def close(self) -> None:
        for replica in self.replicas:
            replica.client.close()
