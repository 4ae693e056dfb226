"""The Flink REST API, as far as featurectl needs it: whether an address is a JobManager's REST endpoint, which
jobs a cluster runs, and stopping one (with a savepoint, or cancelled). Plain urllib: the calls are few and small.

`--jobmanager` names this endpoint. Given anything else (the RPC port, 6123 by default, is the usual mistake),
PyFlink's client only fails after minutes of retries with a Java stack, so every remote job asks first.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from common.errors import FeaturectlError

CHECK_TIMEOUT_S = 3.0
ENDED = frozenset({"FAILED", "CANCELED", "FINISHED"})
NEEDS = "the JobManager's REST address, host:port (the REST port, 8081 by default; the RPC port 6123 will not do)"


class FlinkRestError(FeaturectlError, RuntimeError):
    """A Flink cluster cannot be reached or refused a request; the message names the address and the fix."""


def rest_url(address: str) -> str:
    """`host:port` or `http://host:port/` -> `http://host:port`; anything else is refused with what is needed."""
    bare = address.strip().removeprefix("http://").rstrip("/")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit() or "/" in bare:
        raise FlinkRestError(f"`--jobmanager {address}` is not host:port: give {NEEDS}, e.g. 127.0.0.1:8081")
    return f"http://{bare}"


def check_jobmanager(address: Optional[str]) -> Optional[str]:
    """`address` once it is known to be a JobManager's REST endpoint (None: no cluster): the commands ask before
    any work, so a wrong `--jobmanager` fails in seconds."""
    if address:
        FlinkRest(address).check()
    return address


class FlinkRest:
    """One cluster's REST endpoint."""

    def __init__(self, address: str, timeout_s: float = 10.0):
        self.address = address
        self.url = rest_url(address)
        self.timeout_s = timeout_s

    def call(self, method: str, path: str, body: Optional[dict] = None, timeout_s: Optional[float] = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s or self.timeout_s) as reply:
                text = reply.read()
        except urllib.error.HTTPError as exc:
            raise FlinkRestError(f"Flink at {self.url} refused {method} {path} (HTTP {exc.code}): "
                                 f"{exc.read()[:500].decode(errors='replace')}") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise FlinkRestError(f"Flink at {self.url} did not answer {method} {path}: {exc}") from exc
        return json.loads(text) if text else None

    def check(self) -> str:
        """The cluster's Flink version; raises, saying what `--jobmanager` needs, when this is no REST endpoint."""
        try:
            config = self.call("GET", "/config", timeout_s=CHECK_TIMEOUT_S)
        except FlinkRestError as exc:
            cause = exc.__cause__
            if isinstance(cause, urllib.error.URLError) and isinstance(cause.reason, ConnectionRefusedError):
                raise FlinkRestError(f"nothing listens at {self.address}: start the cluster (a local one: "
                                     f"`featurectl services up --flink 2`) or fix `--jobmanager`; it needs "
                                     f"{NEEDS}") from None
            raise FlinkRestError(f"`{self.address}` is not a Flink REST address: it needs {NEEDS}; "
                                 f"GET {self.url}/config: {cause or exc}") from None
        except ValueError:
            config = None
        if not isinstance(config, dict) or "flink-version" not in config:
            raise FlinkRestError(f"`{self.address}` answers HTTP but is not a Flink JobManager: it needs {NEEDS}")
        return str(config["flink-version"])

    def jobs(self) -> list[dict]:
        """Every job the cluster knows: `jid`, `name`, `state`, ..."""
        return self.call("GET", "/jobs/overview")["jobs"]

    def taskmanagers(self) -> list[dict]:
        """The registered TaskManagers: `id`, `slotsNumber`, `freeSlots`, ..."""
        return self.call("GET", "/taskmanagers")["taskmanagers"]

    def state(self, job_id: str) -> str:
        return self.call("GET", f"/jobs/{job_id}")["state"]

    def stop_with_savepoint(self, job_id: str, directory: str, timeout_s: float = 120.0) -> str:
        """Stop the job after a savepoint into `directory` (a URI); returns the savepoint's location."""
        trigger = self.call("POST", f"/jobs/{job_id}/stop", {"targetDirectory": directory, "drain": False})
        path = f"/jobs/{job_id}/savepoints/{trigger['request-id']}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = self.call("GET", path)
            if answer["status"]["id"] == "COMPLETED":
                operation = answer.get("operation") or {}
                if "location" not in operation:
                    raise FlinkRestError(f"the savepoint of Flink job {job_id} failed: "
                                         f"{str(operation.get('failure-cause'))[:500]}")
                self.wait_ended(job_id, timeout_s)
                return operation["location"]
            time.sleep(0.5)
        raise FlinkRestError(f"the savepoint of Flink job {job_id} did not complete within {timeout_s:.0f} s")

    def cancel(self, job_id: str, timeout_s: float = 60.0) -> None:
        """Cancel the job unless it has ended already, and wait until it has."""
        if self.state(job_id) not in ENDED:
            self.call("PATCH", f"/jobs/{job_id}?mode=cancel")
        self.wait_ended(job_id, timeout_s)

    def wait_ended(self, job_id: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (state := self.state(job_id)) not in ENDED:
            if time.monotonic() > deadline:
                raise FlinkRestError(f"Flink job {job_id} is still {state} after {timeout_s:.0f} s")
            time.sleep(0.3)
        return state
