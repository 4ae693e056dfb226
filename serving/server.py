"""Running the feature server: uvicorn on the uvloop event loop runs the processes (one or several workers sharing
the listening socket, signals, lifespan); `serving.http_protocol` handles the HTTP connections."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from serving.client import AsyncOnlineClient
from serving.gateway import Gateway
from serving.http_app import FeatureServer
from serving.stats import ServerStats

logger = logging.getLogger(__name__)

# Workers are separate processes started by uvicorn: they learn their settings from the environment.
ENV_REPO, ENV_REGISTRY = "FEATURECTL_SERVE_REPO", "FEATURECTL_SERVE_REGISTRY"
ENV_TIMEOUT, ENV_STATS_DIR = "FEATURECTL_SERVE_TIMEOUT_S", "FEATURECTL_SERVE_STATS_DIR"
ENV_AUTH_REFRESH, ENV_WORKERS = "FEATURECTL_SERVE_AUTH_REFRESH_S", "FEATURECTL_SERVE_WORKERS"  # set: keys required


def _without_torch() -> None:
    """Feast imports torch eagerly (`feast.torch_wrapper`, for its vector-search helpers): about 4 s of start-up and
    750 MB per worker (measured: 935 MB -> 175 MB RSS). The feature server never uses it, so before Feast is
    imported it marks torch as absent, which Feast handles (`TORCH_AVAILABLE = False`)."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]


def create_app() -> FeatureServer:
    """The app of one worker (uvicorn's factory)."""
    _without_torch()
    repo, registry = os.environ[ENV_REPO], os.environ.get(ENV_REGISTRY) or None
    timeout_s = float(os.environ.get(ENV_TIMEOUT, "1.0"))
    stats_dir = os.environ.get(ENV_STATS_DIR)
    auth_refresh_s = os.environ.get(ENV_AUTH_REFRESH)

    def make_client() -> AsyncOnlineClient:
        return AsyncOnlineClient.from_repo(repo, registry=registry, timeout_s=timeout_s)

    def make_gateway() -> Gateway:
        from common.config import load_config

        share = 1 / int(os.environ.get(ENV_WORKERS, "1"))  # each worker admits its part of a key's budget
        return Gateway.open(load_config(repo, registry).registry_url, float(auth_refresh_s), share)

    return FeatureServer(make_client, ServerStats(Path(stats_dir) if stats_dir else None),
                         make_gateway if auth_refresh_s else None)


def serve(repo: Path, registry: Optional[str], host: str = "127.0.0.1", port: int = 6566, workers: int = 1,
          timeout_s: float = 1.0, require_api_key: Optional[bool] = None) -> None:
    """Serve until interrupted. `timeout_s` bounds every wait on Redis (a request then gets 503).
    `require_api_key` None: `platform.auth.enabled` of the repo decides."""
    import uvicorn

    from common.config import load_config

    auth = load_config(repo, registry).platform.auth
    required = auth.enabled if require_api_key is None else require_api_key
    if required:
        logger.info("API keys required on POST /get-online-features (keys reloaded every %gs)", auth.refresh_s)
        os.environ.update({ENV_AUTH_REFRESH: str(auth.refresh_s), ENV_WORKERS: str(workers)})
    else:
        os.environ.pop(ENV_AUTH_REFRESH, None)
        logger.warning("API keys are off: any caller may read every feature (turn them on with "
                       "platform.auth.enabled: true or --require-api-key)")
    if host not in ("127.0.0.1", "localhost", "::1") and not required:
        logger.warning("serving on %s: reachable from other machines without API keys", host)
    stats_dir = tempfile.mkdtemp(prefix="featurectl-serve-stats-") if workers > 1 else None
    os.environ.update({ENV_REPO: str(repo), ENV_REGISTRY: registry or "", ENV_TIMEOUT: str(timeout_s)})
    if stats_dir:
        os.environ[ENV_STATS_DIR] = stats_dir
    try:
        uvicorn.run("serving.server:create_app", factory=True, host=host, port=port, workers=workers,
                    loop="uvloop", http="serving.http_protocol:FeatureHttpProtocol", lifespan="on",
                    access_log=False, log_level="info", timeout_keep_alive=30, proxy_headers=False)
    finally:
        if stats_dir:
            shutil.rmtree(stats_dir, ignore_errors=True)
