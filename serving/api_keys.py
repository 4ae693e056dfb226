"""API keys and their usage, stored in the registry database beside Feast's tables.

A key reads `fk_<id>_<secret>`; only the SHA-256 of the whole key is stored, so the database never holds a usable
secret. Each key names the feature services it may read (`*` for all), the push sources it may push to (stored
beside them as `push:NAME`, `push:*` for all, so keys made before pushes existed read back unchanged) and its
budgets per minute: requests for feature reads and pushes, generated shape tokens for generation. Servers
authenticate from an in-memory copy of the table, refreshed in the background, so the request path never waits on
the database; usage is counted in memory and flushed per minute.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import sqlalchemy as sa

from common.errors import FeaturectlError, shown

log = logging.getLogger(__name__)

_META = sa.MetaData()
KEYS = sa.Table(
    "featurectl_api_keys", _META,
    sa.Column("key_id", sa.String(16), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("services", sa.Text, nullable=False),
    sa.Column("requests_per_minute", sa.Integer, nullable=False),
    sa.Column("tokens_per_minute", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
    sa.Column("project", sa.String(255)),
)
USAGE = sa.Table(
    "featurectl_api_usage", _META,
    sa.Column("key_id", sa.String(16), primary_key=True),
    sa.Column("minute", sa.BigInteger, primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    sa.Column("rejected", sa.BigInteger, nullable=False),
)


class ApiKeyError(FeaturectlError, ValueError):
    """A key operation cannot be done as asked (unknown key, bad budget); the message says what to do."""


PUSH_GRANT = "push:"  # the prefix of a push grant among the stored grants; no feature service name has a `:`


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    name: str
    services: tuple[str, ...]
    requests_per_minute: int
    tokens_per_minute: int
    created_at: dt.datetime
    revoked_at: Optional[dt.datetime]
    pushes: tuple[str, ...] = ()  # push sources it may push to; `*` for all
    project: Optional[str] = None  # None: made before keys belonged to a project; valid for every project

    def may_read(self, service: Optional[str]) -> bool:
        """Reads by feature list (no service) need the `*` grant; a service read needs that service or `*`."""
        return "*" in self.services or (service is not None and service in self.services)

    def may_push(self, source: str) -> bool:
        """A push needs a push grant of its own: the read grant `*` is not one."""
        return "*" in self.pushes or source in self.pushes


MAX_BUDGET = 2**31 - 1  # the budget columns are 32-bit integers in both registry databases


def _check_names(names: Sequence[str], option: str, what: str) -> None:
    """One name per option, or `*` alone: grants are stored comma-separated, so a name with a comma would read
    back as several grants (`"a,*"` as `*`)."""
    for name in names:
        if not name.strip() or "," in name or ":" in name or name != name.strip():
            raise ApiKeyError(f"`{option} {shown(name)}` is not a {what} name: give one name per {option} (repeat "
                              "it for several), without commas, colons or surrounding spaces")
    if "*" in names and len(names) > 1:
        raise ApiKeyError(f"`*` already grants every {what}: give `{option} '*'` alone, or only names")


def check_grants(services: Sequence[str], pushes: Sequence[str] = ()) -> None:
    """Feature services to read and push sources to push to: at least one of either."""
    if not services and not pushes:
        raise ApiKeyError("a key needs at least one feature service (`--service NAME`, or `--service '*'` for all) "
                          "or push source (`--push NAME`)")
    _check_names(services, "--service", "feature service")
    _check_names(pushes, "--push", "push source")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _row_to_key(row) -> ApiKey:
    grants = [g for g in row.services.split(",") if g]
    return ApiKey(row.key_id, row.name, tuple(g for g in grants if not g.startswith(PUSH_GRANT)),
                  row.requests_per_minute, row.tokens_per_minute, row.created_at, row.revoked_at,
                  tuple(g[len(PUSH_GRANT):] for g in grants if g.startswith(PUSH_GRANT)), row.project)


def _add_project_column(engine: sa.Engine) -> None:
    """Tables made before keys belonged to a project get the column; their keys keep it empty (every project)."""
    if "project" not in {c["name"] for c in sa.inspect(engine).get_columns(KEYS.name)}:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE {KEYS.name} ADD COLUMN project VARCHAR(255)"))


class KeyStore:
    """The keys of one project and their usage, in the registry database (SQLite or PostgreSQL, any SQLAlchemy
    URL) that several projects may share."""

    def __init__(self, url: str, project: str):
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        self.project = project
        _META.create_all(self.engine)
        _add_project_column(self.engine)
        self._mine = sa.or_(KEYS.c.project == project, KEYS.c.project.is_(None))

    def create(self, name: str, services: Sequence[str], requests_per_minute: int, tokens_per_minute: int,
               pushes: Sequence[str] = ()) -> tuple[ApiKey, str]:
        """A new key; the plaintext is returned once and never stored."""
        if not (0 < requests_per_minute <= MAX_BUDGET and 0 < tokens_per_minute <= MAX_BUDGET):
            raise ApiKeyError(f"budgets must be whole numbers in [1, {MAX_BUDGET}]: pass --requests-per-minute N "
                              "and --tokens-per-minute N")
        check_grants(services, pushes)
        key_id = secrets.token_hex(4)
        token = f"fk_{key_id}_{secrets.token_urlsafe(24)}"
        now = dt.datetime.now(dt.timezone.utc)
        grants = [*services, *(PUSH_GRANT + p for p in pushes)]
        with self.engine.begin() as conn:
            conn.execute(KEYS.insert().values(key_id=key_id, name=name, key_hash=_digest(token),
                                              services=",".join(grants), requests_per_minute=requests_per_minute,
                                              tokens_per_minute=tokens_per_minute, created_at=now,
                                              project=self.project))
        return ApiKey(key_id, name, tuple(services), requests_per_minute, tokens_per_minute, now, None,
                      tuple(pushes), self.project), token

    def list(self) -> list[ApiKey]:
        with self.engine.connect() as conn:
            return [_row_to_key(r) for r in conn.execute(sa.select(KEYS).where(self._mine)
                                                         .order_by(KEYS.c.created_at))]

    def revoke(self, key_id: str) -> None:
        with self.engine.begin() as conn:
            done = conn.execute(KEYS.update().where(KEYS.c.key_id == key_id, KEYS.c.revoked_at.is_(None), self._mine)
                                .values(revoked_at=dt.datetime.now(dt.timezone.utc)))
        if done.rowcount == 0:
            raise ApiKeyError(f"no active key `{key_id}`: `featurectl keys list` shows the ids")

    def hashes(self) -> dict[str, tuple[str, ApiKey]]:
        """key_id -> (stored hash, key) of every active key."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(KEYS).where(KEYS.c.revoked_at.is_(None), self._mine))
            return {r.key_id: (r.key_hash, _row_to_key(r)) for r in rows}

    def add_usage(self, counts: dict[tuple[str, int], list[int]]) -> None:
        """Add (requests, tokens, rejected) per (key, minute) to the usage table, removing each entry from
        `counts` once it is committed (on failure, what is left was not written)."""
        for (key_id, minute), (requests, tokens, rejected) in list(counts.items()):
            where = (USAGE.c.key_id == key_id) & (USAGE.c.minute == minute)
            add = USAGE.update().where(where).values(requests=USAGE.c.requests + requests,
                                                     tokens=USAGE.c.tokens + tokens,
                                                     rejected=USAGE.c.rejected + rejected)
            try:
                self._upsert(add, USAGE.insert().values(key_id=key_id, minute=minute, requests=requests,
                                                        tokens=tokens, rejected=rejected))
            except sa.exc.IntegrityError:  # another server process inserted the same minute first
                self._upsert(add, None)
            del counts[(key_id, minute)]

    def _upsert(self, update, insert) -> None:
        with self.engine.begin() as conn:
            if conn.execute(update).rowcount == 0 and insert is not None:
                conn.execute(insert)

    def usage(self, since_minute: int = 0) -> list[tuple[str, str, int, int, int]]:
        """(key_id, name, requests, tokens, rejected) per key since a minute (epoch minutes)."""
        query = (sa.select(KEYS.c.key_id, KEYS.c.name, sa.func.coalesce(sa.func.sum(USAGE.c.requests), 0),
                           sa.func.coalesce(sa.func.sum(USAGE.c.tokens), 0),
                           sa.func.coalesce(sa.func.sum(USAGE.c.rejected), 0))
                 .select_from(KEYS.outerjoin(USAGE, (USAGE.c.key_id == KEYS.c.key_id)
                                             & (USAGE.c.minute >= since_minute)))
                 .where(self._mine).group_by(KEYS.c.key_id, KEYS.c.name).order_by(KEYS.c.key_id))
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(query)]

    def delete_project_keys(self) -> int:
        """Delete the keys made for this project and their usage (not the keys of every project); how many."""
        owned = sa.select(KEYS.c.key_id).where(KEYS.c.project == self.project)
        with self.engine.begin() as conn:
            conn.execute(USAGE.delete().where(USAGE.c.key_id.in_(owned)))
            return conn.execute(KEYS.delete().where(KEYS.c.project == self.project)).rowcount


class Authenticator:
    """Checks bearer keys against an in-memory copy of the active keys, refreshed every `refresh_s`."""

    def __init__(self, store: KeyStore, refresh_s: float = 10.0):
        self.store = store
        self.refresh_s = refresh_s
        self._keys = store.hashes()
        self._usage: dict[tuple[str, int], list[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="api-keys-refresh", daemon=True)
        self._thread.start()

    def authenticate(self, token: Optional[str]) -> Optional[ApiKey]:
        """The key for a presented token, or None (unknown, malformed or revoked)."""
        if not token or not token.startswith("fk_"):
            return None
        key_id = token[3:].split("_", 1)[0]
        entry = self._keys.get(key_id)
        if entry is None or not hmac.compare_digest(entry[0], _digest(token)):
            return None
        return entry[1]

    def count(self, key: ApiKey, requests: int = 0, tokens: int = 0, rejected: int = 0) -> None:
        """Add to the key's usage of this minute (in memory; `flush` writes it)."""
        minute = int(time.time() // 60)
        with self._lock:
            totals = self._usage.setdefault((key.key_id, minute), [0, 0, 0])
            totals[0] += requests
            totals[1] += tokens
            totals[2] += rejected

    def flush(self) -> None:
        """Write the counted usage to the registry database; what could not be written is kept for next time."""
        with self._lock:
            pending, self._usage = self._usage, {}
        if not pending:
            return
        try:
            self.store.add_usage(pending)
        finally:
            if pending:
                with self._lock:
                    for slot, (requests, tokens, rejected) in pending.items():
                        totals = self._usage.setdefault(slot, [0, 0, 0])
                        totals[0] += requests
                        totals[1] += tokens
                        totals[2] += rejected

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self._keys = self.store.hashes()
                self.flush()
            except Exception as exc:  # the registry may be down: keep serving with the keys we have
                log.warning("api keys: refresh from the registry failed (%s); using the cached keys",
                            type(exc).__name__)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.flush()
