"""Where Redis is and how to talk to it safely: the one place every Redis client of the project is configured.

Feast's `online_store.connection_string` format is kept, so Feast's own RedisOnlineStore reads the same settings:
`host:port[,host:port...][,name=value...]`, the names being redis-py's keyword arguments:

    127.0.0.1:6380,username=feast,password=${REDIS_PASSWORD},ssl=true,ssl_ca_certs=/etc/redis/ca.pem

`db`, `username` and `password` (AUTH, ACL users), `ssl`, `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`,
`ssl_cert_reqs` (`required`, `optional`, `none`), `ssl_check_hostname`, `socket_timeout` and
`socket_connect_timeout`. `${VAR}` is expanded from the environment when feature_store.yaml is read (as Feast
does), so the password need not be written in the file. The password is kept out of every repr, log line and
error message.

Every client of ours (`redis_store.node`, `redis_store.cluster`: the SDK, the servers, materialization, the
streaming sink) takes `RedisSettings`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import ssl
from dataclasses import dataclass, field
from typing import Any, Optional

import hiredis

from common.config import ProjectConfig
from redis_store.errors import RedisConfigError

_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
_RAW = {"username", "password", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"}  # kept verbatim, never decoded
_KNOWN = {"db", "username", "password", "ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
          "ssl_check_hostname", "socket_timeout", "socket_connect_timeout", "skip_full_coverage_check"}
AUTH_ERRORS = ("NOAUTH", "WRONGPASS", "NOPERM")
BULK_WRITE_TIMEOUT_S = 30.0  # a bulk writer's round trip carries many blocks or a whole chunk's transaction


def _value(name: str, text: str) -> Any:
    """Feast json-decodes each value (`true`, `0`), falling back to the plain string; secrets and paths stay as
    written (a password `1e5` is not the number 100000.0)."""
    if name in _RAW:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _flag(params: dict, name: str, default: bool) -> bool:
    value = params.get(name, default)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise RedisConfigError(f"online_store.connection_string: `{name}` must be true or false, got `{value}`")


def _node(part: str, after_settings: bool) -> tuple[str, int]:
    host, _, port = part.strip().rpartition(":")
    if not port.isdigit():
        if after_settings:  # likely the rest of a password holding a `,`: never echoed
            raise RedisConfigError("online_store.connection_string: a part after the settings is not host:port; "
                                   "a value (the password?) cannot hold a `,` in Feast's format")
        raise RedisConfigError(f"online_store.connection_string: `{part.strip()}` is not host:port; "
                               "write e.g. 127.0.0.1:6379,password=...")
    return host or "127.0.0.1", int(port)


@dataclass(frozen=True)
class RedisSettings:
    """Where Redis is, how to authenticate and encrypt, how long to wait; parsed from Feast's settings."""

    nodes: tuple[tuple[str, int], ...]
    cluster: bool = False
    db: int = 0
    username: Optional[str] = None
    password: Optional[str] = field(default=None, repr=False)   # never printed
    timeout_s: float = 1.0
    connect_timeout_s: float = 1.0
    tls: bool = False
    ca_certs: Optional[str] = None
    certfile: Optional[str] = None
    keyfile: Optional[str] = None
    cert_reqs: str = "required"
    check_hostname: bool = False
    spin_s: float = 0.0002  # the sync client's busy poll for a reply before it sleeps (`node.Connection`)

    @classmethod
    def from_config(cls, config: ProjectConfig, timeout_s: float = 1.0) -> "RedisSettings":
        """From the repo's feature_store.yaml (`online_store`), as Feast reads it."""
        store = config.raw.get("online_store") or {}
        return cls.parse(store.get("connection_string", "127.0.0.1:6379"), store.get("redis_type", "redis"),
                         timeout_s)

    def for_bulk_writes(self) -> "RedisSettings":
        """These settings for a writer that sends many commands per round trip (materialization, the streaming
        sink): Redis may take seconds to run them all, and a reply that far off is not worth spinning for."""
        return dataclasses.replace(self, timeout_s=max(self.timeout_s, BULK_WRITE_TIMEOUT_S), spin_s=0.0)

    def single_node(self, purpose: str) -> tuple[str, int]:
        """The one node of a non-cluster setup; a cluster is refused, saying so (`purpose`: who needs one)."""
        if self.cluster:
            raise RedisConfigError(f"{purpose} needs a single Redis node; point online_store.connection_string at "
                                   "one and set redis_type: redis")
        return self.nodes[0]

    @classmethod
    def from_feast(cls, online_store: Any, timeout_s: float = 1.0) -> "RedisSettings":
        """From Feast's `RedisOnlineStoreConfig` (or anything with `connection_string` and `redis_type`)."""
        kind = str(getattr(online_store.redis_type, "value", online_store.redis_type))
        return cls.parse(online_store.connection_string, kind, timeout_s)

    @classmethod
    def parse(cls, connection_string: str, redis_type: str = "redis", timeout_s: float = 1.0) -> "RedisSettings":
        """Feast's `connection_string` and `redis_type` (`redis` or `redis_cluster`)."""
        if redis_type not in ("redis", "redis_cluster"):
            raise RedisConfigError(f"online_store.redis_type `{redis_type}` is not supported here; "
                                   "use `redis` or `redis_cluster`")
        parts = [p for p in connection_string.split(",") if p.strip()]
        pairs = [(name.strip(), value) for name, _, value in (p.partition("=") for p in parts if "=" in p)]
        params = {name: _value(name, value) for name, value in pairs}
        first_setting = next((i for i, p in enumerate(parts) if "=" in p), len(parts))
        nodes = tuple(_node(p, i > first_setting) for i, p in enumerate(parts) if "=" not in p)
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise RedisConfigError(f"online_store.connection_string: unknown setting(s) "
                                   f"{', '.join(f'`{u}`' for u in unknown)}; valid: {', '.join(sorted(_KNOWN))}")
        if not nodes:
            raise RedisConfigError("online_store.connection_string names no host:port; start it with one, "
                                   "e.g. 127.0.0.1:6379")
        cert_reqs = str(params.get("ssl_cert_reqs", "required")).lower()
        if cert_reqs not in _CERT_REQS:
            raise RedisConfigError(f"online_store.connection_string: `ssl_cert_reqs` must be one of "
                                   f"{', '.join(_CERT_REQS)}, got `{cert_reqs}`")
        password, username = params.get("password"), params.get("username")
        if password is not None and "${" in password:
            raise RedisConfigError("online_store.connection_string: `password` still holds a `${...}` reference; "
                                   "export that environment variable before starting featurectl")
        return cls(nodes, redis_type == "redis_cluster", int(params.get("db", 0)),
                   None if username is None else str(username), None if password is None else str(password),
                   float(params.get("socket_timeout", timeout_s)),
                   float(params.get("socket_connect_timeout", min(timeout_s, 1.0))), _flag(params, "ssl", False),
                   params.get("ssl_ca_certs"), params.get("ssl_certfile"), params.get("ssl_keyfile"), cert_reqs,
                   _flag(params, "ssl_check_hostname", False))

    def handshake(self) -> list[bytes]:
        """AUTH and SELECT commands a new connection sends first (none for the default setup)."""
        out = []
        if self.password is not None:
            args = (b"AUTH", self.username, self.password) if self.username else (b"AUTH", self.password)
            out.append(hiredis.pack_command(args))
        if self.db and not self.cluster:
            out.append(hiredis.pack_command((b"SELECT", self.db)))
        return out

    @functools.cached_property
    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The client TLS context (None without `ssl=true`), built once."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_certs)
        context.check_hostname = self.check_hostname and self.cert_reqs != "none"
        context.verify_mode = _CERT_REQS[self.cert_reqs]
        if self.certfile:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


def auth_hint(reply: Any) -> str:
    """What to do about an AUTH/ACL refusal from Redis (empty for any other error reply); a long command before AUTH
    is refused as `ERR Protocol error: unauthenticated multibulk length` (and the connection closed)."""
    if str(reply).startswith(AUTH_ERRORS) or "Protocol error: unauthenticated" in str(reply):
        return ("; set `password=` (and `username=` for an ACL user) in online_store.connection_string, "
                "e.g. password=${REDIS_PASSWORD}")
    return ""
