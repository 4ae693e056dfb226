"""The generation engine: prefill once per request, then one captured CUDA graph per token.

Modes (the benchmark runs all of them on the same weights):
- `nocache`: eager, the whole sequence recomputed for every token (no KV cache);
- `eager`:   eager PyTorch with the static KV cache, one Python-driven step per token;
- `graph`:   the same PyTorch step captured in CUDA graphs;
- `fast`:    fused Triton kernels (split-K attention over the filled part of the cache) in CUDA graphs.
In `graph` and `fast` the whole step, guidance and token choice included, is one graph replay; the position lives
on the device, so the host only enqueues replays and syncs once per generation. One graph set per batch bucket.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from inference.checkpoint import init_random_, load_safetensors, load_state_dict_strict
from inference.config import Cube3DConfig
from inference.errors import GenerationError
from inference.fp8 import Fp8Weights
from inference.model import Cube3DDecoder, DecodeOps
from inference.ops import TorchOps
from inference.sampling import choose, guide, row_seeds

if TYPE_CHECKING:
    from inference.triton_ops import Launch

log = logging.getLogger(__name__)

MODES = ("auto", "fast", "graph", "eager", "nocache")
Weights = str | Path | Mapping[str, Tensor] | None


@dataclass(frozen=True)
class GenerationStats:
    """Timings of one `generate` call (device time between events on CUDA, wall time on the CPU)."""

    prompts: int
    rows: int
    tokens: int
    prefill_s: float
    decode_s: float

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first (the decode steps alone)."""
        return 1e3 * self.decode_s / max(1, self.tokens - 1)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_decoder(cfg: Cube3DConfig, weights: Weights, device: torch.device, dtype: torch.dtype,
                  prefix: str = "", init_std: float = 0.02, seed: int = 0) -> Cube3DDecoder:
    """The decoder built directly on `device` in `dtype`, then loaded strictly (or randomly initialized)."""
    with torch.device(device), _default_dtype(dtype):
        model = Cube3DDecoder(cfg)
    if weights is None:
        init_random_(model, init_std, seed)
    elif isinstance(weights, (str, Path)):
        load_safetensors(model, weights, prefix=prefix)
    else:
        load_state_dict_strict(model, {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})
    return model.eval().requires_grad_(False)


def _resolve_mode(mode: str, device: torch.device) -> str:
    if mode not in MODES:
        raise GenerationError(f"unknown mode `{mode}`; valid modes: {', '.join(MODES)}")
    if mode == "auto":
        return "fast" if device.type == "cuda" else "eager"
    if mode in ("fast", "graph") and device.type != "cuda":
        raise GenerationError(f"mode `{mode}` needs a CUDA device; use mode `eager` (or `auto`) on `{device}`")
    return mode


class Engine:
    """Cube 3D shape-token generation for a service: `generate(cond, uncond, ...) -> ids [P, N]`."""

    def __init__(self, config: Cube3DConfig | str, weights: Weights = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, *, mode: str = "auto", batch_buckets: tuple[int, ...] = (1, 8),
                 weights_prefix: str = "", codebook: Tensor | None = None, init_std: float = 0.02, seed: int = 0,
                 launch: Launch | None = None, fp8_weights: bool = False):
        """`launch`: the fast path's `inference.triton_ops.Launch` (default: the H200 tables); tuning replaces it.
        `fp8_weights`: decode steps read the layers' matrices as weight-only FP8 (`inference.fp8`; optional, with
        a measured error; the fast path needs bf16 weights)."""
        self.cfg = Cube3DConfig.from_name(config) if isinstance(config, str) else config
        self.launch = launch
        self.device, self.dtype = torch.device(device), dtype
        self.mode = _resolve_mode(mode, self.device)
        if not batch_buckets or min(batch_buckets) < 1:
            raise GenerationError(f"`batch_buckets` must be positive prompt counts, got {batch_buckets}")
        self.buckets = tuple(sorted(set(batch_buckets)))
        self.model = build_decoder(self.cfg, weights, self.device, dtype, weights_prefix, init_std, seed)
        if codebook is not None:
            self.model.set_codebook(codebook)
        if fp8_weights and self.mode == "fast" and dtype != torch.bfloat16:
            raise GenerationError(f"`fp8_weights` on the fast path needs bf16 weights, got {dtype}; use "
                                  "dtype=torch.bfloat16, or mode `eager`")
        self._allocate(2 * self.buckets[-1])
        self.fp8 = Fp8Weights(self.model) if fp8_weights else None
        self.ops = self._ops()
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.last_stats: GenerationStats | None = None

    def set_mode(self, mode: str) -> None:
        """Switch between the modes on the same weights and caches (drops the captured graphs)."""
        self.mode = _resolve_mode(mode, self.device)
        self.ops = self._ops()
        self._graphs.clear()

    @torch.no_grad()
    def time_step(self, position: int, prompts: int = 1, guided: bool = True, repeats: int = 3) -> float:
        """Median seconds of one decode step at shape `position` in the current mode, for benchmarks.

        The caches and earlier tokens hold whatever the last request left: only the time means anything.
        """
        if not 1 <= position < self.cfg.n_generated:
            raise GenerationError(f"`position` must be within 1..{self.cfg.n_generated - 1}, got {position}")
        bucket = next((b for b in self.buckets if b >= prompts), None)
        if bucket is None:
            raise GenerationError(f"`prompts` must be at most {self.buckets[-1]} (the largest batch bucket)")
        step = self._runner("step", bucket, guided, False)
        self.n_total.fill_(self.cfg.n_generated)
        times = []
        for _ in range(repeats):
            self.pos.fill_(position)
            marks = _Marks(self.device)
            marks()
            step(position) if self.mode == "nocache" else step()
            marks()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(marks.elapsed()[0])
        return sorted(times)[len(times) // 2]

    def _ops(self) -> DecodeOps:
        if self.mode == "fast":
            from inference.triton_ops import Launch, TritonOps

            self.launch = self.launch or Launch()
            return TritonOps(self.launch, fp8=self.fp8)
        return TorchOps(self.fp8)

    def _allocate(self, rows: int) -> None:
        """Static buffers, allocated once: caches (in the model), inputs, the position and the outputs."""
        cfg, dev = self.cfg, self.device
        self.model.setup_caches(rows, self.dtype, dev)
        self.model.decode_layers()                                            # fuse q/k/v and gate/up now
        self.cond_buf = torch.zeros(rows, cfg.cond_len, cfg.n_embd, dtype=self.dtype, device=dev)
        self.x_buf = torch.zeros(rows, cfg.n_embd, dtype=self.dtype, device=dev)  # next step's token embeddings
        self.bos_ids = torch.full((rows, 1), cfg.bos_id, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)               # shape position of x_buf
        self.ids = torch.zeros(self.buckets[-1], cfg.n_generated, dtype=torch.long, device=dev)
        self.scale = torch.zeros(1, dtype=torch.float64, device=dev)
        self.n_total = torch.zeros(1, dtype=torch.long, device=dev)
        self.top_p = torch.ones(1, dtype=torch.float32, device=dev)
        self.seed = torch.zeros(self.buckets[-1], 1, dtype=torch.long, device=dev)  # one per prompt row

    # ---- public API ------------------------------------------------------------------------------
    @torch.no_grad()
    def condition(self, text_embed: Tensor, bbox: Tensor | None = None) -> Tensor:
        """CLIP text embeddings [B, 77, 768] (+ bbox [B, 3] for v0.5) -> condition tokens [B, S, D]."""
        return self.model.condition(text_embed.to(self.device, self.dtype),
                                    None if bbox is None else bbox.to(self.device, self.dtype))

    @torch.no_grad()
    def generate(self, cond: Tensor, uncond: Tensor | None = None, n_tokens: int | None = None,
                 guidance_scale: float | None = None, top_p: float | None = None,
                 seed: int | Sequence[int] = 0) -> Tensor:
        """Shape token ids [P, N] (int64, on the CPU) for P prompts.

        cond: [P, S, D] condition tokens (see `condition`); uncond: [P or 1, S, D], the empty prompt's (with a
        zero bbox), needed when guidance is on. Greedy (argmax) unless `top_p` is given. `seed`: one for the call,
        or one per prompt (a prompt then samples the same tokens whatever else shares its batch).
        """
        n, scale = self._check(cond, uncond, n_tokens, guidance_scale, top_p)
        outs, stats = [], []
        for start in range(0, cond.shape[0], self.buckets[-1]):
            chunk = cond[start:start + self.buckets[-1]]
            un = None if uncond is None else (uncond if uncond.shape[0] == 1 else uncond[start:start + len(chunk)])
            seeds = seed + start if isinstance(seed, int) else row_seeds(seed[start:start + len(chunk)])
            outs.append(self._generate_bucket(chunk, un, n, scale, top_p, seeds))
            stats.append(self.last_stats)
        self.last_stats = GenerationStats(cond.shape[0], sum(s.rows for s in stats), n,
                                          sum(s.prefill_s for s in stats), sum(s.decode_s for s in stats))
        return torch.cat(outs)

    def _check(self, cond: Tensor, uncond: Tensor | None, n_tokens: int | None, guidance_scale: float | None,
               top_p: float | None) -> tuple[int, float]:
        cfg = self.cfg
        want = (cfg.cond_len, cfg.n_embd)
        if cond.ndim != 3 or tuple(cond.shape[1:]) != want:
            raise GenerationError(f"`cond` must be [prompts, {want[0]}, {want[1]}], got {list(cond.shape)}; "
                                  "build it with `Engine.condition(text_embed, bbox)`")
        n = cfg.n_generated if n_tokens is None else n_tokens
        if not 1 <= n <= cfg.n_generated:
            raise GenerationError(f"`n_tokens` must be within 1..{cfg.n_generated}, got {n}")
        scale = cfg.guidance_scale if guidance_scale is None else guidance_scale
        if scale > 0 and (uncond is None or uncond.ndim != 3 or tuple(uncond.shape[1:]) != want
                          or uncond.shape[0] not in (1, cond.shape[0])):
            raise GenerationError("guidance needs `uncond` [prompts or 1, S, D] (the empty prompt with a zero "
                                  "bbox); pass guidance_scale=0 to generate without guidance")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise GenerationError(f"`top_p` must be in (0, 1], got {top_p}")
        return n, scale

    # ---- one bucket ------------------------------------------------------------------------------
    def _generate_bucket(self, cond: Tensor, uncond: Tensor | None, n: int, scale: float, top_p: float | None,
                         seed: int | list[int]) -> Tensor:
        prompts = cond.shape[0]
        bucket = next(b for b in self.buckets if b >= prompts)
        guided, sampling = scale > 0, top_p is not None
        rows = bucket * (2 if guided else 1)
        pad = lambda t: torch.cat([t, t[-1:].expand(bucket - t.shape[0], -1, -1)])  # noqa: E731
        parts = [pad(cond)] + ([pad(uncond.expand(prompts, -1, -1))] if guided else [])
        self.cond_buf[:rows].copy_(torch.cat(parts))
        self.scale.fill_(scale)
        self.n_total.fill_(n)
        self.top_p.fill_(1.0 if top_p is None else top_p)
        if isinstance(seed, int):
            self.seed.fill_(seed & 0x7FFFFFFF)
        else:
            self.seed[:prompts, 0].copy_(torch.tensor(seed, dtype=torch.long))
        prefill = self._runner("prefill", bucket, guided, sampling)
        step = self._runner("step", bucket, guided, sampling)
        with self._timer() as marks:
            prefill()
            marks()
            for i in range(1, n):
                step(i) if self.mode == "nocache" else step()
        ids = self.ids[:prompts, :n].to("cpu", copy=True)                     # the one host sync
        prefill_s, decode_s = marks.elapsed()
        self.last_stats = GenerationStats(prompts, rows, n, prefill_s, decode_s)
        return ids

    @contextlib.contextmanager
    def _timer(self) -> Iterator["_Marks"]:
        marks = _Marks(self.device)
        marks()
        yield marks
        marks()

    def _runner(self, kind: str, bucket: int, guided: bool, sampling: bool) -> Callable:
        fn = self._prefill if kind == "prefill" else (self._nocache_step if self.mode == "nocache" else self._step)
        fn = partial(fn, bucket, guided, sampling)
        if self.mode not in ("graph", "fast"):
            return fn
        key = (kind, bucket, guided, sampling)
        if key not in self._graphs:
            self._graphs[key] = self._capture(fn, kind)
        return self._graphs[key].replay

    def _capture(self, fn: Callable[[], None], kind: str) -> torch.cuda.CUDAGraph:
        self.pos.fill_(1)                                  # warm-up steps write ids[:, pos]: keep pos in range
        before = (lambda: self.pos.fill_(1)) if kind == "step" else None
        graph = capture_graph(fn, self.device, before)
        log.info("captured %s graph", kind)
        return graph

    # ---- the captured bodies -----------------------------------------------------------------------
    def _prefill(self, bucket: int, guided: bool, sampling: bool) -> None:
        """Both streams over [cond ; BOS]: fills every cache, picks token 0, sets the position to 1."""
        rows = bucket * (2 if guided else 1)
        self.pos.zero_()
        logits = self.model(self.cond_buf[:rows], self.model.embed(self.bos_ids[:rows]), fill_cache=True)
        self._advance(logits[:, -1, : self.cfg.shape_model_vocab_size], bucket, guided, sampling)

    def _step(self, bucket: int, guided: bool, sampling: bool) -> None:
        rows = bucket * (2 if guided else 1)
        m = self.model
        if sampling or not self.ops.fuse_pick:
            self._advance(m.decode_step(self.x_buf[:rows], self.pos, self.ops), bucket, guided, sampling)
            return
        h = m.decode_hidden(self.x_buf[:rows], self.pos, self.ops)
        self.ops.lm_head_pick(h, m.shape_head(), m.transformer.wte.weight, bucket, guided, self.scale, self.n_total,
                              self.pos, self.ids, self.x_buf)

    def _nocache_step(self, bucket: int, guided: bool, sampling: bool, i: int) -> None:
        """The reference's slow path: recompute [cond ; BOS, t_0 .. t_{i-1}] in full for token i."""
        rows = bucket * (2 if guided else 1)
        prev = self.ids[:bucket, :i].repeat(rows // bucket, 1)
        x = self.model.embed(torch.cat([self.bos_ids[:rows], prev], dim=1))
        logits = self.model(self.cond_buf[:rows], x)
        self._advance(logits[:, -1, : self.cfg.shape_model_vocab_size], bucket, guided, sampling)

    def _advance(self, logits: Tensor, prompts: int, guided: bool, sampling: bool) -> None:
        """Guidance, token choice, bookkeeping: ids[:, pos] = token; x_buf = its embedding; pos += 1."""
        g = guide(logits, prompts, guided, self.scale, self.pos, self.n_total)   # [P, V] float32
        nxt = choose(g, self.top_p if sampling else None, self.seed[:prompts], self.pos)   # [P]
        self.ids[:prompts].index_copy_(1, self.pos, nxt.unsqueeze(1))
        emb = self.model.embed(nxt)                                              # [P, D]
        self.x_buf[:prompts].copy_(emb)
        if guided:
            self.x_buf[prompts:2 * prompts].copy_(emb)
        self.pos.add_(1)


def capture_graph(fn: Callable[[], None], device: torch.device, before: Callable[[], object] | None = None,
                  warmup: int = 2) -> torch.cuda.CUDAGraph:
    """Warm `fn` up on a side stream (Triton compiles, cuBLAS picks kernels), then capture one call of it."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            if before is not None:
                before()
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph


class _Marks:
    """Time marks: CUDA events on a GPU (read after the generation's one sync), wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.points: list = []

    def __call__(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.points.append(ev)
        else:
            self.points.append(time.perf_counter())

    def elapsed(self) -> tuple[float, ...]:
        a = self.points
        if self.cuda:
            return tuple(a[i].elapsed_time(a[i + 1]) / 1e3 for i in range(len(a) - 1))
        return tuple(a[i + 1] - a[i] for i in range(len(a) - 1))
