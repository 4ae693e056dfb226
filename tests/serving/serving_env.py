"""Helpers of the serving tests: a private feature repo, Feast's own writes, and our server as a subprocess (the
private redis-servers and clusters are `featurectl.services.scratch_redis`'s)."""

from __future__ import annotations

import contextlib
import json
import datetime as dt
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Optional

from cli_helpers import cli_server, copy_example_repo, register_repo
from featurectl.services.scratch_redis import RedisServer


def make_repo(folder: Path, project: str, connection_string: str, redis_type: str = "redis"):
    """The example repo's definitions under `project`, registered in a SQLite registry; returns (repo, store)."""
    repo = copy_example_repo(folder, project, {"path": f"sqlite:///{folder / project}.db"},
                             {"type": "redis", "redis_type": redis_type, "connection_string": connection_string})
    return repo, register_repo(repo)


def feast_rows(store, view_name: str, values: dict[str, dict], event_time: Optional[dt.datetime] = None):
    """Write rows with Feast's own `write_to_online_store`: `values` maps asset_id -> {feature: value}."""
    import pandas as pd

    view = store.get_feature_view(view_name)
    when = event_time or dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    frame = pd.DataFrame({"asset_id": list(values), "event_timestamp": [when] * len(values),
                          **{f.name: [row.get(f.name) for row in values.values()] for f in view.features}})
    store.write_to_online_store(view_name, frame)


@contextlib.contextmanager
def scratch_repo(folder: Path, project: str) -> Iterator[tuple[Path, object, RedisServer]]:
    """The example repo on a redis-server of its own holding asset `a1` (views_1h 4, dwell_ms_mean_1h 2.5,
    category chair): (repo, Feast's store, the server); the server stops when the block ends."""
    redis_server = RedisServer(folder)
    try:
        repo, store = make_repo(folder, project, f"127.0.0.1:{redis_server.port}")
        feast_rows(store, "asset_activity", {"a1": {"views_1h": 4, "dwell_ms_mean_1h": 2.5}})
        feast_rows(store, "asset_attributes", {"a1": {"category": "chair"}})
        yield repo, store, redis_server
    finally:
        redis_server.stop()


@contextlib.contextmanager
def feature_server(repo: Path, port: int, *args: str) -> Iterator[str]:
    """`featurectl serve` on `port` until the block ends, its output in `server-PORT.log` beside the repo; yields
    its base URL once /health answers."""
    with cli_server(repo, "serve", *args, port=port, ready_s=120, log=repo.parent / f"server-{port}.log") as server:
        yield server.url


def post(url: str, body, path: str = "/get-online-features", headers: Optional[dict] = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
