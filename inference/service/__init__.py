"""The Cube 3D generation service: asset-conditioned text-to-shape requests, batched on one GPU, timed per stage.

    from inference.service import GenerationRequest, GenerationService, ServiceConfig, online_store
    service = GenerationService(ServiceConfig.from_name("v0.1", text_encoder="/models/clip-vit-large-patch14"),
                                make_client=online_store("feature_repo"))
    glb = service.generate(GenerationRequest("a wooden version", asset_id="asset_000042")).glb

`featurectl generate` and `featurectl generate-server` (HTTP, `inference.service.http_app`) are built on it.
"""

from inference.service.conditioning import AssetFeatures, AssetProjection, online_store
from inference.service.config import SERVICE_CONFIGS, ServiceConfig
from inference.service.metrics import STAGES, ServiceStats
from inference.service.pipeline import GenerationRequest, GenerationResult
from inference.service.service import (BadRequestError, GenerationService, GenerationServiceError, JobExpiredError,
                                       QueueFullError)

__all__ = ["SERVICE_CONFIGS", "STAGES", "AssetFeatures", "AssetProjection", "BadRequestError", "GenerationRequest",
           "GenerationResult", "GenerationService", "GenerationServiceError", "JobExpiredError", "QueueFullError",
           "ServiceConfig", "ServiceStats", "online_store"]
