"""Small building blocks shared by the decoder and the shape tokenizer (plain eager PyTorch)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def layer_norm(x: Tensor, eps: float) -> Tensor:
    """LayerNorm without affine, computed in float32 and cast back (as the released model does)."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=eps).type_as(x)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, float32 inside; `weight` is always a parameter (released layout)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).type_as(x)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_tables(head_dim: int, n_pos: int, theta: float, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's angles: each [n_pos, head_dim / 2], float32."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float32, device=device), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) by the angles of each position (complex multiply).

    x: [B, H, L, D]; cos, sin: [L, D/2] (or broadcastable to [B, H, L, D/2]).
    """
    xf = x.float().unflatten(-1, (-1, 2))            # [B, H, L, D/2, 2]
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class KVCache(nn.Module):
    """Static key/value cache of one layer, allocated once; keys are stored after RoPE."""

    def __init__(self, rows: int, n_head: int, length: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str | None = None):
        super().__init__()
        shape = (rows, n_head, length, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def fill(self, k: Tensor, v: Tensor) -> None:
        """Write a prefill's keys and values at positions 0..L-1. k, v: [B, H, L, D]."""
        b, _, n, _ = k.shape
        self.k[:b, :, :n].copy_(k)
        self.v[:b, :, :n].copy_(v)
