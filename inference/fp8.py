"""Weight-only FP8 for the decode steps: an optional mode (`Engine(..., fp8_weights=True)`), never the default.

A decode step reads every layer's weights once for a handful of rows, so its time is the bytes it reads: the four
matrices of each layer (fused q/k/v, the attention output, fused gate/up, down) stored as float8_e4m3fn halve
them. Each output channel (row of W) gets its own float32 scale, max|row| / 448, so the largest weight of a row
is exact and the others keep e4m3's three mantissa bits (relative rounding at most 1/16). The scale is per row,
so it factors out of the dot product: y = (x . q_row) * scale + b; the fast path's GEMV loads the FP8 tiles,
widens them to bf16 in registers and multiplies the sums by the scales (`triton_ops`), and the PyTorch path
multiplies by the dequantized matrix. Activations stay bf16: this is not FP8 arithmetic (`torch._scaled_mm`
needs both operands in FP8). The lm_head (the shape-code logits) and the embeddings stay in the model's dtype.
The prefill (the whole-sequence forward) multiplies by the same quantized values held in the model's dtype
(`Fp8Weights` writes them back), so the mode saves no memory. What it costs in accuracy is measured, not
assumed: `teacher_forced_error`, `bench cube3d --fp8`.
"""

from __future__ import annotations

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)          # 448


def quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [N, K] -> (q [N, K] float8_e4m3fn, scale [N] float32) with w ~= q * scale[:, None], one scale per row."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / FP8_MAX
    return (wf / scale[:, None]).to(FP8), scale


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    return (q.float() * scale[:, None]).to(dtype)


def _key(w: Tensor) -> tuple[int, tuple[int, ...]]:
    return w.data_ptr(), tuple(w.shape)


class Fp8Weights:
    """A decoder's decode-step matrices as FP8 + scales, found by the matrix they stand for (`get(w)`).

    Built from a model, it also writes the FP8 values back into the model's matrices (in the model's dtype), so
    the prefill, the whole-sequence forward and the decode steps all use the same quantized weights: the model
    is then the FP8 model, and `teacher_forced_error` against an unquantized copy measures the mode."""

    @torch.no_grad()
    def __init__(self, model) -> None:
        self._by_key: dict[tuple[int, tuple[int, ...]], tuple[Tensor, Tensor]] = {}
        for lw in model.decode_layers():
            for w in (lw.qkv_w, lw.proj_w, lw.gu_w, lw.down_w):
                q, scale = quantize(w)
                w.copy_(dequantize(q, scale, w.dtype))
                self._by_key[_key(w)] = q, scale

    def get(self, w: Tensor) -> tuple[Tensor, Tensor] | None:
        """(q, scale) if `w` is one of the quantized matrices, else None (it is used as it is)."""
        return self._by_key.get(_key(w))

    def dense(self, w: Tensor) -> Tensor:
        """The matrix the decode step multiplies by: `w`'s FP8 values dequantized, or `w` itself."""
        q = self.get(w)
        return w if q is None else dequantize(*q, w.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the FP8 matrices and their scales: what a decode step reads instead of the bf16 ones."""
        return sum(q.numel() * q.element_size() + s.numel() * s.element_size() for q, s in self._by_key.values())


@torch.no_grad()
def teacher_forced_error(model, fp8_model, cond: Tensor, ids: Tensor) -> dict[str, float]:
    """Both models' logits on the same token sequences (BOS + `ids`[:, :-1], condition `cond`): relative error
    ||fp8 - ref|| / ||ref|| over all positions, and the fraction of positions whose argmax agrees."""
    bos = torch.full_like(ids[:, :1], model.cfg.bos_id)
    tokens = torch.cat([bos, ids[:, :-1]], dim=1)
    ref = model(cond, model.embed(tokens)).float()
    got = fp8_model(cond, fp8_model.embed(tokens)).float()
    return {"logits_rel_err": float((got - ref).norm() / ref.norm()),
            "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean())}
