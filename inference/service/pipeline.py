"""One batch of requests through the models: features, text, condition, tokens, occupancy grids (all of the batch's
objects in one coarse-to-fine pass); stages timed.

The GPU work of a batch runs on one thread (the service's worker). On a CUDA device (`mesh_on_device`) the mesh
is made there too: marching cubes on the grid in device memory, then the vertex and face buffers' copies to
pinned host memory on a side stream (`mesh.SurfaceCopy`), not waited for; the service waits for them and writes
the GLB bytes in a thread while the worker goes on with the next object. Otherwise what follows
the occupancy grid (marching cubes, GLB export) runs in a worker process (`meshing.MeshPool`) while the device
takes the next object.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from inference.engine import Engine
from inference.errors import MeshError
from inference.glb import glb_bytes
from inference.mesh import ShapeDecoder, SurfaceCopy, device_surface
from inference.occupancy import Fields, OccupancyGrid, coarse_to_fine_batch, shape_fields
from inference.service.conditioning import (AssetFeatureFetcher, AssetFeatures, AssetProjection, asset_vector,
                                            bbox_condition)
from inference.service.config import ServiceConfig
from inference.service.meshing import MeshOutput, SharedGrid
from inference.service.text_encoder import TextEncoder, random_clip

log = logging.getLogger(__name__)

# words of the random text tower's tokenizer (tests and speed runs); a real CLIP folder brings its own
RANDOM_WORDS = ("a an the of with and in wooden metal stone glass red blue green old new small large tall chair "
                "table car house tree lamp sword shield cup vase boat robot dragon version style low poly").split()


@dataclass
class GenerationRequest:
    """What a caller asks for. `seed` matters with `top_p` (greedy decoding ignores it)."""

    prompt: str
    asset_id: str | None = None
    seed: int = 0
    top_p: float | None = None
    timeout_s: float | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    arrived: float = field(default_factory=time.perf_counter)
    client_id: str | None = None             # the caller's X-Request-ID: the A/B split's key when given
    model_version: str | None = None         # `NAME/VERSION` of the registered model that admitted it, if any
    shadow: bool = False                     # a rollout's shadow copy: counted apart, its result never returned

    @property
    def batch_key(self) -> float | None:
        """Requests batch together only when the engine can run them in one call (same token choice)."""
        return self.top_p


@dataclass
class GenerationResult:
    request_id: str
    glb: bytes
    vertices: int
    faces: int
    stages: dict[str, float]                 # seconds per stage, `total` included
    bbox: list[float] | None                 # the bbox condition used (None: none, or the zero fallback)
    fallback: str | None                     # why asset features were not used, if they were not
    batch_size: int = 1
    tokens: list[int] = field(default_factory=list)   # the generated shape tokens (shadow runs compare them)
    model_version: str | None = None         # `NAME/VERSION` that answered, when served from the model registry


@dataclass
class GridJob:
    """One object after its occupancy grid: the grid in shared memory, ready for marching cubes (the mesh pool's
    work item), or, meshed on the device, its vertices and faces on the host (for `export_glb`) or the error that
    stopped it."""

    request: GenerationRequest
    grid: SharedGrid | None
    stages: dict[str, float]
    features: AssetFeatures | None
    bbox: list[float] | None
    batch_size: int
    surface: SurfaceCopy | None = None       # device path: vertices, faces on their way to the host
    marching_cubes_s: float = 0.0
    error: MeshError | None = None
    tokens: list[int] = field(default_factory=list)


class Pipeline:
    """The models of one service, loaded once; `run_batch` does a batch's GPU work."""

    def __init__(self, cfg: ServiceConfig, fetcher: AssetFeatureFetcher | None = None):
        self.cfg = cfg
        self.device, self.dtype = cfg.torch_device, cfg.dtype
        self.fetcher = fetcher or AssetFeatureFetcher(None)                 # no store: asset requests fall back
        self.shapes = ShapeDecoder(cfg.model, cfg.shape_weights, self.device, self.dtype,
                                   init_std=0.02 if cfg.model != "tiny" else 0.3)
        self.engine = Engine(cfg.model, cfg.gpt_weights, self.device, self.dtype, batch_buckets=cfg.batch_buckets,
                             codebook=self.shapes.codebook(), init_std=0.02 if cfg.model != "tiny" else 0.1)
        mcfg = self.engine.cfg
        self.text = self._text_encoder()
        self.assets = AssetProjection(mcfg.n_embd).to(self.device, self.dtype)
        if cfg.asset_projection:
            self.assets.load(cfg.asset_projection)
        empty_bbox = torch.zeros(1, 3) if mcfg.use_bbox else None
        self.uncond = self.engine.condition(self.text.empty(), empty_bbox)      # [1, S, D], computed once

    def _text_encoder(self) -> TextEncoder:
        mcfg, cfg = self.engine.cfg, self.cfg
        if cfg.text_encoder:
            return TextEncoder.from_path(cfg.text_encoder, mcfg.text_tokens, self.device, self.dtype)
        log.warning("no `text_encoder` folder configured: using a random CLIP text tower (speed runs and tests)")
        vocab = 49408 if mcfg.text_model_embed_dim == 768 else None
        model, tokenizer = random_clip(RANDOM_WORDS, mcfg.text_model_embed_dim, cfg.random_text_layers,
                                       mcfg.text_tokens, vocab_size=vocab)
        return TextEncoder(model, tokenizer, mcfg.text_tokens, self.device, self.dtype)

    def _fields(self, ids: Tensor) -> Fields:
        fields = shape_fields(self.shapes, ids, compiled=self.cfg.compiles_occupancy)
        if self.cfg.shape_weights is not None:
            return fields
        # random tokenizer weights put each object's logits at their own offset, often all of one sign: centre
        # them on the median of a 17^3 grid so that speed runs and tests get a surface (released weights do not
        # take this path)
        grids = coarse_to_fine_batch(fields, ids.shape[0], 4, self.shapes.cfg.bounds, self.device, levels=0)
        offsets = torch.stack([grid.values.median() for grid in grids])[:, None]
        return lambda points: fields(points) - offsets

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def condition(self, requests: list[GenerationRequest],
                  features: list[AssetFeatures | None]) -> tuple[Tensor, list[list[float] | None]]:
        """Condition tokens [P, S, D] and the bbox condition of each request (None where it has none)."""
        mcfg, size = self.engine.cfg, self.cfg.bbox_max_size
        text = self.text.encode([r.prompt for r in requests])
        boxes = [bbox_condition(f.bbox if f else None, size) for f in features]
        cond = self.engine.condition(text, torch.stack(boxes) if mcfg.use_bbox else None)
        vectors = torch.stack([asset_vector(f, size) for f in features]).to(self.device, self.dtype)
        cond = cond + self.assets(vectors).unsqueeze(1)                  # zero until the projection is trained
        used = [b.tolist() if mcfg.use_bbox and f is not None and f.bbox else None for b, f in zip(boxes, features)]
        return cond, used

    def run_batch(self, requests: list[GenerationRequest], emit: Callable[[GridJob], None]) -> None:
        """Fetch, encode, generate and decode the occupancy grids for the whole batch; then each object's mesh job,
        handed to `emit`."""
        stages: dict[str, float] = {}
        t0 = time.perf_counter()
        wanted = [r.asset_id for r in requests if r.asset_id]
        found = iter(self.fetcher.fetch(wanted))
        features = [next(found) if r.asset_id else None for r in requests]
        t1 = time.perf_counter()
        if wanted:
            stages["fetch"] = t1 - t0
        cond, boxes = self.condition(requests, features)
        self._sync()
        stages["text"] = time.perf_counter() - t1
        ids = self.engine.generate(cond, self.uncond, top_p=requests[0].top_p, seed=[r.seed for r in requests])
        stats = self.engine.last_stats
        stages["prefill"], stages["decode"] = stats.prefill_s, stats.decode_s
        tokens = ids.tolist()
        grids = self.shape_decode(ids, stages)
        for i, request in enumerate(requests):
            job = self.mesh_job(request, grids[i], dict(stages), features[i], boxes[i], len(requests))
            job.tokens = tokens[i]
            emit(job)

    @torch.no_grad()
    def shape_decode(self, ids: Tensor, stages: dict[str, float]) -> list[OccupancyGrid]:
        """The occupancy grids of a batch's token ids [B, N], decoded together (one latent pass, one network call
        per chunk for every object): the `shape_decode` stage, the batch's time, as `decode` is."""
        t0 = time.perf_counter()
        grids = coarse_to_fine_batch(self._fields(ids), ids.shape[0], self.cfg.resolution, self.shapes.cfg.bounds,
                                     self.device, levels=self.cfg.coarse_levels)
        self._sync()
        stages["shape_decode"] = time.perf_counter() - t0
        return grids

    def mesh_job(self, request: GenerationRequest, grid: OccupancyGrid, stages: dict[str, float],
                 features: AssetFeatures | None, bbox: list[float] | None, batch_size: int) -> GridJob:
        """One object's grid, meshed on the device, or put in shared memory for the mesh pool."""
        t0 = time.perf_counter()
        if self.cfg.meshes_on_device:
            job = GridJob(request, None, stages, features, bbox, batch_size)
            try:
                self.device_mesh(grid.values, job)
            except MeshError as exc:
                job.error = exc
            return job
        shared = SharedGrid(grid.values.shape[0])
        torch.from_numpy(shared.values).copy_(grid.values)              # device -> shared memory, one copy
        torch.from_numpy(shared.surface).copy_(grid.surface)
        stages["to_host"] = time.perf_counter() - t0
        return GridJob(request, shared, stages, features, bbox, batch_size)

    def device_mesh(self, values: Tensor, job: GridJob) -> None:
        """Marching cubes on the device; the two buffers' copies to the host are started, not waited for:
        `export_glb` waits for them (the `to_host` stage) in its thread while this one takes the next object."""
        t0 = time.perf_counter()
        verts, faces = device_surface(values, self.shapes.cfg.bounds)
        if self.device.type == "cuda":                  # this stream only: not the copies still under way
            torch.cuda.current_stream(self.device).synchronize()
        job.marching_cubes_s = time.perf_counter() - t0
        job.surface = SurfaceCopy(verts, faces)


def export_glb(job: GridJob) -> MeshOutput:
    """GLB bytes of a device-meshed job (in a thread beside the device worker: numpy copies release the GIL),
    after its buffers' copies to the host (`to_host`: the wait for them here)."""
    t0 = time.perf_counter()
    verts, faces = job.surface.wait()
    t1 = time.perf_counter()
    job.stages["to_host"] = t1 - t0
    job.surface = None                                   # the pinned buffers go back once the bytes are written
    glb = glb_bytes(verts, faces)
    return MeshOutput(glb, len(verts), len(faces), job.marching_cubes_s, time.perf_counter() - t1)


def result_of(job: GridJob, mesh: MeshOutput) -> GenerationResult:
    """The result of a meshed job. Stages: `marching_cubes`, `to_host` (the grid before it on the host path, the
    mesh buffers after it on the device path), `meshing` (the two together) and `export` (GLB bytes)."""
    stages = job.stages
    stages["marching_cubes"] = mesh.marching_cubes_s
    stages["meshing"] = stages["to_host"] + mesh.marching_cubes_s
    stages["export"] = mesh.export_s
    fallback = job.features.fallback if job.features else None
    return GenerationResult(job.request.id, mesh.glb, mesh.vertices, mesh.faces, stages, job.bbox, fallback,
                            job.batch_size, job.tokens, job.request.model_version)
