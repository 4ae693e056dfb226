"""The API-key check in front of `serve` and `generate`: who is asking (401), may they (403), within budget (429).

Both servers call it the same way: `identify` the presented key before reading the request, then `admit` the
request once its feature service and cost are known. Everything happens in memory (keys cached and refreshed by
`Authenticator`, budgets in `TokenBuckets`, shared by a server's worker processes through a mapped file), so the
check costs a SHA-256 and two locks, never a database round trip. A presented key is never logged nor echoed in a
reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from common.errors import shown
from serving.api_keys import ApiKey, Authenticator, KeyStore
from serving.throttle import SharedTokenBuckets, TokenBuckets

REQUESTS, TOKENS = "requests", "tokens"
_HOW = ("send it as `Authorization: Bearer <key>` or `X-API-Key: <key>`; "
        "`featurectl keys create NAME --service S` makes one")


@dataclass(frozen=True)
class Refusal:
    """A request turned away: its HTTP status, error code, message and extra response headers."""

    status: int
    code: str
    message: str
    retry_after_s: int = 0

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.status == 401:
            return [(b"www-authenticate", b"Bearer")]
        if self.retry_after_s:
            return [(b"retry-after", b"%d" % self.retry_after_s)]
        return []


def bearer(value: Optional[bytes]) -> Optional[str]:
    """The key in an `Authorization: Bearer <key>` header value (None for any other scheme)."""
    if value is not None and value[:7].lower() == b"bearer ":
        return value[7:].strip().decode("latin-1")
    return None


def key_from_headers(headers) -> Optional[str]:
    """The presented key from ASGI-style (name, value) byte pairs: `Authorization: Bearer` or `X-API-Key`."""
    found = None
    for name, value in headers:
        name = name.lower()
        if name == b"authorization" and (token := bearer(value)) is not None:
            return token
        if name == b"x-api-key":
            found = value.strip().decode("latin-1")
    return found


class Gateway:
    """Keys, grants and per-minute budgets for one server process."""

    def __init__(self, authenticator: Authenticator, buckets: Optional[TokenBuckets] = None):
        self.authenticator = authenticator
        self.buckets = buckets or TokenBuckets()

    @classmethod
    def open(cls, registry_url: str, project: str, refresh_s: float = 10.0,
             buckets_path: Optional[str] = None) -> "Gateway":
        """A gateway over the project's keys in the registry database (tables created on first use);
        `buckets_path`: the file the worker processes of one server share their budgets in (None: one process)."""
        buckets = SharedTokenBuckets(buckets_path) if buckets_path else TokenBuckets()
        return cls(Authenticator(KeyStore(registry_url, project), refresh_s), buckets)

    def identify(self, token: Optional[str]) -> Union[ApiKey, Refusal]:
        """The key presented with a request, or a 401 refusal (missing, unknown, revoked)."""
        if not token:
            return Refusal(401, "missing_api_key", f"this endpoint needs an API key: {_HOW}")
        key = self.authenticator.authenticate(token)
        if key is None:
            return Refusal(401, "invalid_api_key", "the API key is unknown or revoked (`featurectl keys list` shows "
                                                   "the active ones); check the key you send")
        return key

    def admit(self, key: ApiKey, service: Optional[str], kind: str, cost: int) -> Optional[Refusal]:
        """None when the key may read `service` (None: a feature list) and its `kind` budget covers `cost`. A granted
        request is counted either way (as a request, or as throttled); a refused grant is not."""
        if not key.may_read(service):
            what = f"feature service `{service}`" if service else "free feature lists (they need the `*` grant)"
            return Refusal(403, "forbidden", f"key `{key.key_id}` has no access to {what}; it may read "
                                             f"{', '.join(key.services) or 'nothing'}. Create a key with `--service` "
                                             "for it")
        return self._spend(key, kind, cost)

    def admit_push(self, key: ApiKey, source: str) -> Optional[Refusal]:
        """None when the key may push to `source` and its request budget covers one more request."""
        if not key.may_push(source):
            return Refusal(403, "forbidden", f"key `{key.key_id}` may not push to {shown(source)}; it may push to "
                                             f"{', '.join(key.pushes) or 'nothing'}. Create a key with "
                                             "`--push NAME` for it")
        return self._spend(key, REQUESTS, 1)

    def _spend(self, key: ApiKey, kind: str, cost: int) -> Optional[Refusal]:
        budget = self._budget(key, kind)
        if cost > budget:  # it would wait for ever: not a 429 with a Retry-After
            self.authenticator.count(key, rejected=1)
            unit = "generated shape tokens" if kind == TOKENS else "requests"
            return Refusal(403, "over_key_limit", f"this request costs {cost} {unit}, more than key `{key.key_id}` "
                                                  f"may spend in a minute ({budget:g}); create a key with a larger "
                                                  f"--{kind}-per-minute")
        allowed, retry_after = self.buckets.take(key.key_id, kind, cost, budget)
        if not allowed:
            self.authenticator.count(key, rejected=1)
            return Refusal(429, "over_budget", self._over(key, kind, cost, retry_after), retry_after)
        self.authenticator.count(key, requests=1, tokens=cost if kind == TOKENS else 0)
        return None

    def refund(self, key: ApiKey, kind: str, cost: int) -> None:
        """Undo an `admit` whose request was then refused before any work (a full queue)."""
        self.buckets.give_back(key.key_id, kind, cost, self._budget(key, kind))
        self.authenticator.count(key, requests=-1, tokens=-cost if kind == TOKENS else 0)

    @staticmethod
    def _budget(key: ApiKey, kind: str) -> float:
        return float(key.tokens_per_minute if kind == TOKENS else key.requests_per_minute)

    def _over(self, key: ApiKey, kind: str, cost: int, retry_after: int) -> str:
        unit = "generated shape tokens" if kind == TOKENS else "requests"
        return (f"key `{key.key_id}` is over its budget of {self._budget(key, kind):g} {unit} per minute; retry in "
                f"{retry_after} s (Retry-After)")

    def close(self) -> None:
        """Stop the key refresh and write the usage counted so far."""
        self.authenticator.close()
        if isinstance(self.buckets, SharedTokenBuckets):
            self.buckets.close()
