"""A client of `featurectl serve` over HTTP, for callers without Redis access: Feast's JSON, or Arrow IPC.

    client = HttpClient("http://127.0.0.1:6566", api_key="fk_...")
    client.get_online_features("asset_ranking", {"asset_id": ["a1", "a2"]})               # Feast's JSON answer
    client.get_online_features("asset_ranking", {"asset_id": ["a1", "a2"]}, binary=True)  # a pyarrow Table

`binary=True` sends the entity rows as an Arrow IPC stream and asks for one back (`serving.arrow_ipc`): the
table's columns are the join keys, then per feature its values, `{name}:status` and `{name}:event_timestamp`.
One keep-alive connection, reopened once when the server closed it; not thread-safe (one client per thread).
"""

from __future__ import annotations

import http.client
import json
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

import pyarrow as pa

from serving.arrow_ipc import arrow_request
from serving.errors import ServingError
from serving.media import ARROW_STREAM

PATH = "/get-online-features"
_ARROW = ARROW_STREAM.decode()


class HttpServingError(ServingError):
    """The server answered with an error: its status, code and message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"HTTP {status} ({code}): {message}")
        self.status, self.code = status, code


class HttpClient:
    """`featurectl serve` at `url` (`http://host:port`); `api_key` is sent as `Authorization: Bearer`."""

    def __init__(self, url: str, api_key: Optional[str] = None, timeout_s: float = 5.0):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"`url` must be http://host:port, got {url!r}")
        self.host, self.port, self.timeout_s = parts.hostname, parts.port or 80, timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._conn: Optional[http.client.HTTPConnection] = None

    def get_online_features(self, features: Sequence[str] | str, entities: dict[str, list], *,
                            full_feature_names: bool = False, binary: bool = False) -> dict | pa.Table:
        """Feast's JSON answer as a dict, or with `binary` the Arrow answer as a pyarrow Table; raises
        HttpServingError with the server's message for any status but 200."""
        if binary:
            body = arrow_request(features, entities, full_feature_names)
            headers = {"Content-Type": _ARROW, "Accept": _ARROW}
        else:
            wanted = {"feature_service": features} if isinstance(features, str) else {"features": list(features)}
            body = json.dumps({**wanted, "entities": entities, "full_feature_names": full_feature_names}).encode()
            headers = {"Content-Type": "application/json"}
        status, kind, payload = self._post(body, headers)
        if status != 200:
            try:
                error = json.loads(payload)
                code, message = error.get("code", "error"), error.get("error", "")
            except (ValueError, AttributeError):
                code, message = "error", payload[:300].decode("utf-8", "replace")
            raise HttpServingError(status, code, message)
        if binary:
            if kind != _ARROW:
                raise ServingError(f"the server answered {kind or 'no content type'}, not Arrow: is it a featurectl "
                                   "server of this version?")
            return pa.ipc.open_stream(payload).read_all()
        return json.loads(payload)

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        try:
            return self._send(body, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self.close()  # the server closed the kept-alive connection: once more, on a new one
            return self._send(body, headers)

    def _send(self, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        self._conn.request("POST", PATH, body, {**self.headers, **headers})
        reply = self._conn.getresponse()
        return reply.status, reply.getheader("content-type", ""), reply.read()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
