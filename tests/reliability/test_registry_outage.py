"""The PostgreSQL registry goes away while `featurectl serve` runs: requests keep being answered from the catalog
the server read before (same values), `/ready` stays ready and says the definitions are cached and why, and the
server goes back to reading the registry by itself once PostgreSQL is back. Private PostgreSQL and Redis only."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from fault_env import PrivateServices, example_repo, feature_server, http, sibling

pytestmark = pytest.mark.integration

VALUES = {f"asset_{i:06d}": {"views_1h": i, "views_24h": 10 * i, "likes_24h": i % 3} for i in range(1, 6)}
FEATURES = [f"asset_activity:{name}" for name in ("views_1h", "views_24h", "likes_24h")]


@pytest.fixture(scope="module")
def services():
    """PostgreSQL runs as the `postgres` user when we are root: its folder must sit outside pytest's private tmp."""
    folder = Path(tempfile.mkdtemp(prefix="featurectl-registry-outage-"))
    os.chmod(folder, 0o755)
    services = PrivateServices(folder / "services")
    try:
        services.postgres.up()
        services.redis.up()
        yield services
    finally:
        services.down()
        shutil.rmtree(folder, ignore_errors=True)


def write_values(repo: Path) -> None:
    """VALUES through Feast's own online write, so the oracle is independent of our writers."""
    from feast import FeatureStore

    from common.config import load_config

    store = FeatureStore(config=load_config(repo).feast_repo_config())
    sibling("serving_env", "serving").feast_rows(store, "asset_activity", VALUES,
                                                 dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))


def fetch(url: str) -> dict[str, list]:
    status, reply = http("POST", url + "/get-online-features",
                         {"features": FEATURES, "entities": {"asset_id": list(VALUES)}})
    assert status == 200, reply
    names = reply["metadata"]["feature_names"]
    return {name: result["values"] for name, result in zip(names, reply["results"])}


def expected() -> dict[str, list]:
    return {"asset_id": list(VALUES), **{f.split(":")[1]: [row[f.split(":")[1]] for row in VALUES.values()]
                                          for f in FEATURES}}


def wait_registry(url: str, state: str, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status, reply = http("GET", url + "/ready")
        if status == 200 and reply.get("registry", {}).get("state") == state:
            return reply
        assert time.monotonic() < deadline, f"/ready never said the registry is {state}: {status} {reply}"
        time.sleep(0.3)


def test_server_keeps_serving_from_its_cached_registry(services, tmp_path):
    pg = services.config.platform.postgres
    repo = example_repo(tmp_path, "registry_outage", {
        "path": f"postgresql://{pg.user}@127.0.0.1:{pg.port}/{pg.database}", "cache_ttl_seconds": 1,
    }, services.redis_port)
    write_values(repo)
    with feature_server(repo) as url:
        wait_registry(url, "current")
        assert fetch(url) == expected()

        services.postgres.down()
        ready = wait_registry(url, "cached")
        assert ready["status"] == "ready" and ready["feature_views"] > 0
        assert "registry" in ready["registry"]["error"]
        for _ in range(20):
            assert fetch(url) == expected()

        services.postgres.up()
        wait_registry(url, "current")
        assert fetch(url) == expected()
