"""Which feature service a model is conditioned on, and which version of it: the applied version of each of its
feature views (`featurectl versions`) at registration, folded into one short digest for the service."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from inference.errors import Cube3DError


class LineageError(Cube3DError):
    """The feature service named for a model is not registered, or its views have no recorded version."""


@dataclass(frozen=True)
class FeatureLineage:
    service: str
    version: str                  # digest of the views' versions: changes when any of them changes
    views: dict[str, str]         # feature view -> applied version

    def tags(self) -> dict[str, str]:
        return {"feature_service": self.service, "feature_service_version": self.version,
                "feature_views": ",".join(f"{view}@{version}" for view, version in sorted(self.views.items()))}


def service_version(views: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(views.items())).encode()).hexdigest()[:12]


def feature_lineage(project_config, service: str) -> FeatureLineage:
    """The lineage of `service` in the project's Feast registry, with its views' applied versions."""
    from feast import FeatureStore

    from common.version_log import VersionLog

    registry = FeatureStore(config=project_config.feast_repo_config()).registry
    project = project_config.project
    try:
        found = registry.get_feature_service(service, project, allow_cache=False)
    except Exception as exc:  # Feast's FeatureServiceNotFoundException, or an unreadable registry
        names = [s.name for s in registry.list_feature_services(project, allow_cache=False)]
        raise LineageError(f"feature service `{service}` is not registered in project `{project}` ({exc}); "
                           f"registered: {', '.join(names) or 'none'}; run `featurectl apply` first") from None
    log = VersionLog(project_config.registry_url)
    try:
        applied = log.applied(project)
    finally:
        log.close()
    views = {p.name: applied[p.name].version for p in found.feature_view_projections if p.name in applied}
    if not views:
        raise LineageError(f"no view of feature service `{service}` has a recorded version: `featurectl apply` "
                           "records them")
    return FeatureLineage(service, service_version(views), views)
