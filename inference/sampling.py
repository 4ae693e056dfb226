"""Classifier-free guidance and token choice, all on the device (no host sync, so it can live in a CUDA graph)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_SEED_MUL, _POS_MUL, _ROW_MUL = 0x27D4EB2F, 0x165667B1, 0x61C88647


def guide(logits: Tensor, prompts: int, guided: bool, scale: Tensor, pos: Tensor, n_total: Tensor) -> Tensor:
    """logits: [R, V] with conditional rows first, then unconditional ones. Returns float32 [P, V].

    gamma = scale * (N - i) / N at step i (computed in float64 like the reference's Python floats), then
    (1 + gamma) * cond - gamma * uncond in float32.
    """
    lf = logits.float()
    if not guided:
        return lf[:prompts]
    gamma = scale * (n_total - pos).double() / n_total.double()                # [1] float64
    return (1.0 + gamma).float() * lf[:prompts] - gamma.float() * lf[prompts:2 * prompts]


def uniform(seed: Tensor, pos: Tensor, rows: int, cols: int) -> Tensor:
    """Counter-based uniforms in (0, 1), [rows, cols], from (seed, position, row, column) alone.

    A 32-bit integer hash evaluated with int64 tensor ops: no generator state, so a captured graph draws fresh
    numbers at every step (the position moves) and the same seed gives the same tokens on any device.
    """
    r = torch.arange(rows, device=pos.device).unsqueeze(1)
    c = torch.arange(cols, device=pos.device).unsqueeze(0)
    x = (seed * _SEED_MUL + pos * _POS_MUL + r * _ROW_MUL + c) & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & _MASK32
    x = x ^ (x >> 16)
    return ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))


def row_seeds(seeds: Sequence[int]) -> list[int]:
    """Seed values for the rows of one batch such that row i draws exactly what row 0 draws alone with seeds[i].

    The hash mixes `seed * _SEED_MUL + row * _ROW_MUL`; _SEED_MUL is odd, hence invertible modulo 2^32, so the row
    term can be folded into the seed. A request's sampled tokens then do not depend on its slot in a batch.
    """
    inverse = pow(_SEED_MUL, -1, 1 << 32)
    return [(int(s) - i * _ROW_MUL * inverse) & _MASK32 for i, s in enumerate(seeds)]


def top_p_sample(logits: Tensor, top_p: Tensor, seed: Tensor, pos: Tensor) -> Tensor:
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches `top_p`, draw one. [P] int64."""
    probs = torch.softmax(logits, dim=-1)                                        # [P, V]
    sorted_p, _ = probs.sort(dim=-1, descending=True)
    keep = (sorted_p.cumsum(-1) - sorted_p) < top_p                              # the first one always stays
    threshold = sorted_p.masked_fill(~keep, float("inf")).amin(-1, keepdim=True)
    # exponential race: argmax p / E with E ~ Exp(1) picks a token with probability proportional to p
    e = -torch.log(uniform(seed, pos, logits.shape[0], logits.shape[1]))
    score = torch.where(probs >= threshold, probs / e, torch.zeros_like(probs))
    return score.argmax(-1)


def choose(logits: Tensor, top_p: Tensor | None, seed: Tensor, pos: Tensor) -> Tensor:
    """argmax when `top_p` is None, else nucleus sampling. logits: float32 [P, V]. Returns [P] int64."""
    if top_p is None:
        return logits.argmax(-1)
    return top_p_sample(logits, top_p, seed, pos)
