"""The decode step's pieces in plain PyTorch: the reference for the Triton kernels, and the CPU path.

Everything here is free of host syncs (positions are read through device tensors), so it can also be captured
in a CUDA graph as-is.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from inference.fp8 import Fp8Weights
from inference.layers import apply_rope, layer_norm
from inference.model import LayerWeights


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).type_as(x)


class TorchOps:
    """Unfused PyTorch ops; attention runs over the whole static cache with a length mask."""

    name = "torch"
    fuse_pick = False  # greedy steps take the logits and pick in PyTorch (`Engine._advance`)

    def __init__(self, fp8: Fp8Weights | None = None):
        self.fp8 = fp8     # weight-only FP8 (`inference.fp8`): the layers' matrices dequantized at each use

    def _w(self, w: Tensor) -> Tensor:
        return w if self.fp8 is None else self.fp8.dense(w)

    def fused_layers(self, x: Tensor, pos: Tensor, layers: Sequence[LayerWeights], cos: Tensor, sin: Tensor,
                     eps: float, qk_eps: float) -> Tensor | None:
        """None: the layers run one op at a time (`TritonOps` may run them all in one launch)."""
        return None

    def layer_norm(self, x: Tensor, eps: float) -> Tensor:
        return layer_norm(x, eps)

    def residual_layer_norm(self, x: Tensor, parts: Tensor, bias: Tensor, eps: float) -> Tensor:
        """x += sum(parts) + bias in place (the residual stream; parts: [S, R, D]); returns LayerNorm(x)."""
        x.add_(parts.sum(0) + bias)
        return layer_norm(x, eps)

    def linear(self, x: Tensor, w: Tensor) -> Tensor:
        return F.linear(x, w)

    def linear_parts(self, x: Tensor, w: Tensor) -> Tensor:
        """x W^T as one part: [1, R, N] (the Triton version splits K)."""
        return F.linear(x, self._w(w)).unsqueeze(0)

    def linear_swiglu(self, h: Tensor, w: Tensor, b: Tensor) -> Tensor:
        """w, b: [gate; up] stacked. Returns silu(h Wg^T + bg) * (h Wu^T + bu)."""
        g, u = F.linear(h, self._w(w), b).chunk(2, dim=-1)
        return F.silu(g) * u

    def qk_norm_rope_cache(self, qkv: Tensor, lw: LayerWeights, rows: int, cos: Tensor, sin: Tensor,
                           pos: Tensor, eps: float) -> Tensor:
        """qkv: [S, R, 3D] parts (no bias yet). Writes k (after RoPE) and v at `offset + pos`; returns q [R, H, d]."""
        n_head, head_dim = lw.cache.k.shape[1], lw.cache.k.shape[3]
        q, k, v = (qkv.sum(0) + lw.qkv_b).view(rows, 3, n_head, head_dim).unbind(1)  # each [R, H, d]
        c, s = cos.index_select(0, pos), sin.index_select(0, pos)                 # [1, d/2]
        q = apply_rope(_rms(q, lw.q_norm, eps).unsqueeze(2), c, s)                # [R, H, 1, d]
        k = apply_rope(_rms(k, lw.k_norm, eps).unsqueeze(2), c, s)
        idx = pos + lw.offset
        lw.cache.k[:rows].index_copy_(2, idx, k)
        lw.cache.v[:rows].index_copy_(2, idx, v.unsqueeze(2))
        return q.squeeze(2)

    def qkv_attention(self, qkv: Tensor, lw: LayerWeights, rows: int, cos: Tensor, sin: Tensor, pos: Tensor,
                      eps: float) -> Tensor:
        """`qk_norm_rope_cache`, then `attention`: [R, H * d]."""
        return self.attention(self.qk_norm_rope_cache(qkv, lw, rows, cos, sin, pos, eps), lw, rows, pos)

    def attention(self, q: Tensor, lw: LayerWeights, rows: int, pos: Tensor) -> Tensor:
        """q: [R, H, d] against cache positions 0 .. offset + pos. Returns [R, H * d]."""
        k, v = lw.cache.k[:rows], lw.cache.v[:rows]
        filled = torch.arange(k.shape[2], device=q.device) <= pos + lw.offset    # [L] bool
        y = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=filled.view(1, 1, 1, -1))  # [R, H, 1, d]
        return y.reshape(rows, -1)
