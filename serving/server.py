"""Running the feature server: uvicorn on the uvloop event loop runs the processes (one or several workers sharing
the listening socket, signals, lifespan); `serving.http_protocol` handles the HTTP connections."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

from serving.client import AsyncOnlineClient
from serving.feature_log import FeatureLogger
from serving.drift import DriftMonitor
from serving.freshness import FreshnessMonitor
from serving.gateway import Gateway
from serving.http_app import FeatureServer
from serving.stats import ServerStats

logger = logging.getLogger(__name__)

# Workers are separate processes started by uvicorn: they read their settings from this one variable, set for the
# time the server runs.
ENV_SETTINGS = "FEATURECTL_SERVE_SETTINGS"


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """What every worker needs: the repo, how long to wait on Redis, where to share its stats and key budgets
    (several workers), and, with API keys required, how often to reload the keys."""

    repo: str
    registry: Optional[str] = None
    timeout_s: float = 1.0
    stats_dir: Optional[str] = None
    auth_refresh_s: Optional[float] = None
    workers: int = 1

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> "WorkerSettings":
        try:
            return cls(**json.loads(os.environ[ENV_SETTINGS]))
        except KeyError:
            raise RuntimeError(f"{ENV_SETTINGS} is not set: start workers with `featurectl serve`") from None


def _without_torch() -> None:
    """Feast imports torch eagerly (`feast.torch_wrapper`, for its vector-search helpers): about 4 s of start-up and
    750 MB per worker (measured: 935 MB -> 175 MB RSS). The feature server never uses it, so before Feast is
    imported it marks torch as absent, which Feast handles (`TORCH_AVAILABLE = False`)."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]


def _freeze_heap() -> None:
    """The registry's objects, loaded at start-up, are never garbage: keep them out of every later collection."""
    gc.collect()
    gc.freeze()


def create_app() -> FeatureServer:
    """The app of one worker (uvicorn's factory)."""
    from common.config import load_config

    _without_torch()
    settings = WorkerSettings.from_env()
    config = load_config(settings.repo, settings.registry)

    def make_client() -> AsyncOnlineClient:
        return AsyncOnlineClient.from_repo(settings.repo, registry=settings.registry, timeout_s=settings.timeout_s)

    def make_gateway() -> Gateway:
        buckets = str(Path(settings.stats_dir) / "budgets") if settings.stats_dir else None  # shared by workers
        return Gateway.open(config.registry_url, config.project, settings.auth_refresh_s, buckets)

    stats = ServerStats(Path(settings.stats_dir) if settings.stats_dir else None)
    monitoring = config.platform.serving.monitoring
    return FeatureServer(make_client, stats, make_gateway if settings.auth_refresh_s else None,
                         on_started=_freeze_heap, http=config.platform.http,
                         feature_log=FeatureLogger(config.platform.feature_logging, stats),
                         drift=DriftMonitor(_profiles_of(config.registry_url, config.project)) if monitoring else None,
                         freshness=FreshnessMonitor(config.state_dir) if monitoring else None,
                         count_served=monitoring)


def _profiles_of(registry_url: str, project: str) -> Callable[[], dict]:
    """The reader of the project's latest feature profiles (`common.quality_log`), connecting on first use."""
    from common.quality_log import QualityLog

    opened: list[QualityLog] = []

    def latest() -> dict:
        if not opened:
            opened.append(QualityLog(registry_url))
        return opened[0].latest_profiles(project)

    return latest


def serve(repo: Path, registry: Optional[str], host: str = "127.0.0.1", port: int = 6566, workers: int = 1,
          timeout_s: float = 1.0, require_api_key: Optional[bool] = None) -> None:
    """Serve until interrupted. `timeout_s` bounds every wait on Redis (a request then gets 503).
    `require_api_key` None: `platform.auth.enabled` of the repo decides."""
    import uvicorn

    from common.config import load_config

    platform = load_config(repo, registry).platform
    auth = platform.auth
    if not platform.serving.monitoring:
        logger.info("freshness and data-quality monitoring off (platform.serving.monitoring: false): no rows served "
                    "per view, freshness or drift in /metrics")
    required = auth.enabled if require_api_key is None else require_api_key
    if required:
        logger.info("API keys required on POST /get-online-features and POST /push (keys reloaded every %gs)",
                    auth.refresh_s)
    else:
        logger.warning("API keys are off: any caller may read every feature and push (turn them on with "
                       "platform.auth.enabled: true or --require-api-key)")
    if host not in ("127.0.0.1", "localhost", "::1") and not required:
        logger.warning("serving on %s: reachable from other machines without API keys", host)
    stats_dir = tempfile.mkdtemp(prefix="featurectl-serve-stats-") if workers > 1 else None
    settings = WorkerSettings(str(repo), registry, timeout_s, stats_dir, auth.refresh_s if required else None,
                              workers)
    os.environ[ENV_SETTINGS] = settings.to_env()
    try:
        uvicorn.run("serving.server:create_app", factory=True, host=host, port=port, workers=workers,
                    loop="uvloop", http="serving.http_protocol:HttpProtocol", lifespan="on",
                    access_log=False, log_level="info", proxy_headers=False)
    finally:
        os.environ.pop(ENV_SETTINGS, None)
        if stats_dir:
            shutil.rmtree(stats_dir, ignore_errors=True)
