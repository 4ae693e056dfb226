"""Tokens to a mesh file: codebook + latent decoder and occupancy on a (2^r + 1)^3 grid on the device (in
chunks), marching cubes at level 0 (Lewiner's method: on a CUDA device by `inference.marching_cubes`, else
scikit-image's on the host; the same triangles), export to GLB or OBJ. Every stage is timed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from inference.checkpoint import init_random_, load_safetensors, load_state_dict_strict
from inference.config import ShapeTokenizerConfig
from inference.engine import Weights, _default_dtype
from inference.errors import MeshError
from inference.glb import glb_bytes
from inference.marching_cubes import marching_cubes_torch
from inference.shape_tokenizer import ShapeTokenizer

log = logging.getLogger(__name__)

# released tokenizer checkpoints also hold the point-cloud encoder; generation does not use it
ENCODER_PREFIXES = ("encoder.", "embedder.")


@dataclass
class Mesh:
    """Vertices [V, 3] float32 and faces [F, 3] int64 (int32 from the device path), numpy, with the seconds each
    stage took."""

    vertices: np.ndarray
    faces: np.ndarray
    stages: dict[str, float] = field(default_factory=dict)

    def to_trimesh(self):
        try:
            import trimesh
        except ImportError as exc:  # pragma: no cover - trimesh is a dependency of the project
            raise MeshError("mesh export needs `trimesh`: pip install trimesh") from exc
        return trimesh.Trimesh(vertices=self.vertices, faces=self.faces, process=False)

    def glb(self) -> bytes:
        return glb_bytes(self.vertices, self.faces)

    def export(self, path: str | Path) -> Path:
        """Write `.glb` or `.obj` (by suffix); records the `export_<suffix>` stage."""
        path = Path(path)
        if path.suffix.lower() not in (".glb", ".obj"):
            raise MeshError(f"unsupported mesh file `{path.name}`: use a `.glb` or `.obj` suffix")
        t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix.lower() == ".glb":
            path.write_bytes(self.glb())
        else:
            self.to_trimesh().export(path)
        self.stages[f"export_{path.suffix.lower()[1:]}"] = time.perf_counter() - t0
        return path


def grid_points(resolution: int, bounds: float, start: int, count: int, device: torch.device) -> Tensor:
    """Points `start .. start+count` of the (2^r + 1)^3 grid over [-bounds, bounds]^3, 'ij' order. [count, 3]."""
    g = 2 ** resolution + 1
    idx = torch.arange(start, start + count, device=device)
    ijk = torch.stack([idx // (g * g), (idx // g) % g, idx % g], dim=-1).float()
    return ijk * (2 * bounds / (g - 1)) - bounds


def marching_cubes(grid: np.ndarray, bounds: float, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Surface of `grid` (occupancy logits [G, G, G]) at level 0, in the grid's world coordinates.

    Vertex scaling and face winding follow the released tokenizer (index / G * size + min; faces reversed).
    `mask` (bool [G, G, G]) limits the work to the cubes it marks, where the surface is known to lie.
    """
    from skimage import measure

    if not grid.min() < 0.0 < grid.max():
        raise MeshError(f"occupancy has no zero crossing (logits in [{grid.min():.3g}, {grid.max():.3g}]): "
                        "the tokens decode to an empty or full volume")
    verts, faces, _, _ = measure.marching_cubes(grid, 0.0, method="lewiner", mask=mask)
    size = grid.shape[0]
    verts = verts / size * (2 * bounds) - bounds
    return verts.astype(np.float32), np.ascontiguousarray(faces[:, ::-1]).astype(np.int64)


def device_surface(grid: Tensor, bounds: float) -> tuple[Tensor, Tensor]:
    """`marching_cubes` where `grid` lives (`inference.marching_cubes`, the same triangles): vertices [V, 3] float32
    in world coordinates and faces [F, 3] int64, on the grid's device, same scaling and winding."""
    verts, faces = marching_cubes_torch(grid, 0.0)
    return verts * (2 * bounds / grid.shape[0]) - bounds, faces


def host_mesh(verts: Tensor, faces: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Device buffers -> numpy, one copy each (faces as int32: half the bytes, and what GLB stores)."""
    return verts.cpu().numpy(), faces.int().cpu().numpy()


_COPY_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> "torch.cuda.Stream":
    if device not in _COPY_STREAMS:
        _COPY_STREAMS[device] = torch.cuda.Stream(device)
    return _COPY_STREAMS[device]


class SurfaceCopy:
    """A mesh's vertex and face buffers on their way to the host, so the thread that made them need not wait.

    On CUDA the two copies go to pinned host memory on a side stream (the copy engine, beside the next object's
    kernels); `wait` blocks on their event with the GIL released. The device buffers are held until then, so the
    allocator cannot hand their memory out while the copy still reads it. Elsewhere the buffers are read at once.
    Either way `wait` returns what `host_mesh` returns: the same numbers, faces as int32.
    """

    def __init__(self, verts: Tensor, faces: Tensor):
        faces = faces.int()
        self._event: torch.cuda.Event | None = None
        self._device: tuple[Tensor, Tensor] | None = None
        if verts.device.type != "cuda":
            self._host = (verts.numpy(), faces.numpy())
            return
        stream = _copy_stream(verts.device)
        stream.wait_stream(torch.cuda.current_stream(verts.device))
        with torch.cuda.stream(stream):
            host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (verts, faces))
            for dst, src in zip(host, (verts, faces)):
                dst.copy_(src, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(stream)
        self._device, self._pinned = (verts, faces), host
        self._host = (host[0].numpy(), host[1].numpy())

    def wait(self) -> tuple[np.ndarray, np.ndarray]:
        """The vertices [V, 3] float32 and faces [F, 3] int32 on the host, once their copies are done."""
        if self._event is not None:
            self._event.synchronize()
            self._event, self._device = None, None
        return self._host


class ShapeDecoder:
    """Shape tokens -> mesh, on `device`. `decode_mesh(ids, resolution)` times each stage."""

    def __init__(self, config: ShapeTokenizerConfig | str = "v0.1", weights: Weights = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, weights_prefix: str = "",
                 init_std: float = 0.02, seed: int = 0):
        self.cfg = ShapeTokenizerConfig.from_name(config) if isinstance(config, str) else config
        self.device, self.dtype = torch.device(device), dtype
        with torch.device(self.device), _default_dtype(dtype):
            self.model = ShapeTokenizer(self.cfg)
        if weights is None:
            init_random_(self.model, init_std, seed)
        elif isinstance(weights, (str, Path)):
            load_safetensors(self.model, weights, prefix=weights_prefix, ignore=ENCODER_PREFIXES)
        else:
            load_state_dict_strict(self.model, {k: v for k, v in weights.items() if not k.startswith(ENCODER_PREFIXES)})
        self.model.eval().requires_grad_(False)
        self._compiled = None

    def compiled_occupancy(self):
        """The occupancy decoder through torch.compile (dynamic point counts), built on first use. Its per-point
        work is small matrix products between elementwise steps (Fourier features, norms, activations) that eager
        mode runs as separate passes over memory; compiled, they fuse."""
        if self._compiled is None:
            self._compiled = torch.compile(self.model.occupancy_decoder, dynamic=True)
        return self._compiled

    @torch.no_grad()
    def codebook(self) -> Tensor:
        """[codes, code dim] for `Engine(..., codebook=...)` (the decoder's token embedding comes from it)."""
        return self.model.bottleneck.block.get_codebook()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @torch.no_grad()
    def occupancy_grid(self, ids: Tensor, resolution: int = 8, chunk_size: int | None = None,
                       stages: dict[str, float] | None = None) -> Tensor:
        """Occupancy logits [G, G, G] (float32, on the device) of one object's token ids [N] or [1, N]."""
        stages = {} if stages is None else stages
        ids = ids.reshape(1, -1).to(self.device)
        t0 = time.perf_counter()
        latents = self.model.decode_indices(ids)                                   # [1, N, W]
        kv = self.model.occupancy_decoder.attn_out.keys_values(latents)
        self._sync()
        t1 = time.perf_counter()
        g = 2 ** resolution + 1
        total = g ** 3
        chunk = chunk_size or (1 << 19 if self.device.type == "cuda" else 1 << 14)
        out = torch.empty(total, dtype=torch.float32, device=self.device)
        for start in range(0, total, chunk):
            count = min(chunk, total - start)
            pts = grid_points(resolution, self.cfg.bounds, start, count, self.device).unsqueeze(0)
            out[start:start + count] = self.model.occupancy_decoder(pts.to(self.dtype), kv)[0].float()
        self._sync()
        stages["latents"] = t1 - t0
        stages["occupancy"] = time.perf_counter() - t1
        return out.view(g, g, g)

    def decode_mesh(self, ids: Tensor, resolution: int = 8, chunk_size: int | None = None,
                    on_device: bool | None = None) -> Mesh:
        """Token ids [N] or [1, N] -> `Mesh`, with stages latents / occupancy / marching_cubes / to_host.
        `on_device` (default: on a CUDA device) runs marching cubes on the device and copies the mesh to the host;
        otherwise the grid goes to the host for scikit-image."""
        stages: dict[str, float] = {}
        grid = self.occupancy_grid(ids, resolution, chunk_size, stages)
        if self.device.type == "cuda" if on_device is None else on_device:
            t0 = time.perf_counter()
            dverts, dfaces = device_surface(grid, self.cfg.bounds)
            self._sync()
            t1 = time.perf_counter()
            verts, faces = host_mesh(dverts, dfaces)
            stages["marching_cubes"] = t1 - t0
            stages["to_host"] = time.perf_counter() - t1
        else:
            t0 = time.perf_counter()
            host = grid.cpu().numpy()
            t1 = time.perf_counter()
            verts, faces = marching_cubes(host, self.cfg.bounds)
            stages["to_host"] = t1 - t0
            stages["marching_cubes"] = time.perf_counter() - t1
        log.info("mesh: %d vertices, %d faces", len(verts), len(faces))
        return Mesh(verts, faces, stages)
