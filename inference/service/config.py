"""Settings of the generation service as a dataclass plus named configs (`v0.1`, `v0.5`, `tiny`)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from inference.errors import UnknownConfigError


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service reads at start-up; weights come from local paths only (never a download)."""

    model: str = "v0.1"                      # decoder and tokenizer sizes: a name of CUBE3D_CONFIGS
    gpt_weights: str | None = None           # decoder safetensors; None = random weights (speed runs, tests)
    shape_weights: str | None = None         # shape tokenizer safetensors; None = random weights
    text_encoder: str | None = None          # folder with the CLIP ViT-L/14 text tower + tokenizer (HF layout);
                                             # None = a small random CLIP text tower (tests, speed runs)
    asset_projection: str | None = None      # trained asset-feature projection (safetensors); None = zeros
    device: str = "auto"                     # cuda when present, else cpu
    resolution: int = 8                      # mesh grid (2^r + 1)^3
    coarse_levels: int = 3                   # coarse-to-fine occupancy levels; 0 = every grid point (dense)
    batch_buckets: tuple[int, ...] = (1, 8)  # the engine's CUDA-graph batch sizes; the largest bounds a batch
    max_batch_wait_ms: float = 2.0           # how long the first request of a batch waits for company
    tail_wait_ms: float = 100.0              # while objects of earlier batches are still being finished on the host
                                             # (GLB bytes, the host meshing), a batch that is not full waits up to
                                             # this long for them, then `max_batch_wait_ms` for their callers to
                                             # come back; 0 = never
    queue_size: int = 64                     # requests waiting beyond this are refused (HTTP 429)
    timeout_s: float = 60.0                  # how long POST /generate waits for the mesh before answering 202
                                             # with a job id, unless the body sets `timeout_s` (at most 10x this)
    job_timeout_s: float = 300.0             # a request still queued this long after arriving is dropped unrun
                                             # (overload: no GPU time for work nobody may wait for); the service's
                                             # deadline, not the caller's
    mesh_workers: int = 4                    # processes for marching cubes + export (the host path)
    compile_occupancy: bool | None = None    # torch.compile the occupancy decoder; None = on a CUDA device
    mesh_on_device: bool | None = None       # marching cubes + GLB on the worker's device, no processes;
                                             # None = on a CUDA device, on the host (worker processes) otherwise
    feature_service: str = "cube3d_conditioning"
    feature_timeout_s: float = 0.05          # the SDK's Redis timeout; past it the request falls back, never fails
    bbox_max_size: float = 1.925             # v0.5 convention: the bbox is scaled so its longest side is this
    random_text_layers: int = 12             # layers of the random text tower used when `text_encoder` is None

    @property
    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    @property
    def compiles_occupancy(self) -> bool:
        return self.torch_device.type == "cuda" if self.compile_occupancy is None else self.compile_occupancy

    @property
    def meshes_on_device(self) -> bool:
        return self.torch_device.type == "cuda" if self.mesh_on_device is None else self.mesh_on_device

    @property
    def dtype(self) -> torch.dtype:
        """bf16 on a GPU (the engine's fast path), float32 on the CPU."""
        return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "ServiceConfig":
        if name not in SERVICE_CONFIGS:
            raise UnknownConfigError("service", name, SERVICE_CONFIGS)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown service setting(s) {', '.join(f'`{k}`' for k in unknown)}; "
                             f"valid: {', '.join(sorted(known))}")
        return replace(SERVICE_CONFIGS[name], **{k: v for k, v in overrides.items() if v is not None})


SERVICE_CONFIGS: dict[str, ServiceConfig] = {
    "v0.1": ServiceConfig(),
    "v0.5": ServiceConfig(model="v0.5"),
    # the tiny architecture of tests/data/cube3d/tiny_reference.json: CPU tests and CI-sized benchmarks
    "tiny": ServiceConfig(model="tiny", device="cpu", resolution=5, coarse_levels=2, batch_buckets=(1, 4),
                          mesh_workers=2, random_text_layers=1),
}
