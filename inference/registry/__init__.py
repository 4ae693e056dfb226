"""Versions of the generation model in MLflow's Model Registry: checked checkpoints, aliases, feature lineage.

    registry = ModelRegistry(project.registry_url)
    version = registry.register("cube3d", verify_checkpoint("gpt.safetensors"), tags={"data": "2026-11"})
    registry.promote("cube3d", version.version, "champion")     # a server on models:/cube3d@champion follows
"""

from inference.registry.checkpoint_check import CheckpointRefusedError, VerifiedCheckpoint, verify_checkpoint
from inference.registry.lineage import FeatureLineage, LineageError, feature_lineage
from inference.registry.store import (ALIASES, ModelRegistry, ModelRegistryError, ModelVersion, mlflow_uri,
                                      parse_model_uri)

__all__ = ["ALIASES", "CheckpointRefusedError", "FeatureLineage", "LineageError", "ModelRegistry",
           "ModelRegistryError", "ModelVersion", "VerifiedCheckpoint", "feature_lineage", "mlflow_uri",
           "parse_model_uri", "verify_checkpoint"]
