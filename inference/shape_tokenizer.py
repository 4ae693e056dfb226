"""The shape tokenizer's generation-side parts, under the released names: codebook (`bottleneck`), latent
`decoder` and `occupancy_decoder`. The point-cloud encoder is not needed to turn tokens into a mesh.

Shapes: B objects, N latents (one per shape token), W width, P query points.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import ShapeTokenizerConfig
from inference.layers import RMSNorm, layer_norm


class SphericalVQ(nn.Module):
    """Codebook of unit-RMS codes: RMSNorm(codebook * cb_weight + cb_bias), then `c_out` to the width."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.codebook = nn.Embedding(cfg.num_codes, cfg.code_dim)
        self.cb_weight = nn.Parameter(torch.ones(cfg.code_dim))
        self.cb_bias = nn.Parameter(torch.zeros(cfg.code_dim))
        self.c_in = nn.Linear(cfg.width, cfg.code_dim)     # encoder side; kept so the checkpoint loads strictly
        self.c_x = nn.Linear(cfg.width, cfg.code_dim)      # encoder side
        self.c_out = nn.Linear(cfg.code_dim, cfg.width)
        self.norm = RMSNorm(cfg.code_dim, cfg.qk_norm_eps)

    def get_codebook(self) -> Tensor:
        """[codes, code dim]: what the decoder's `shape_proj` maps into its token embedding."""
        return self.norm(self.codebook.weight * self.cb_weight + self.cb_bias)

    def lookup(self, ids: Tensor) -> Tensor:
        return self.c_out(F.embedding(ids, self.get_codebook()))              # [B, N, W]


class Bottleneck(nn.Module):
    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.block = SphericalVQ(cfg)


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.up_proj = nn.Linear(width, hidden)
        self.down_proj = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class SelfAttention(nn.Module):
    """Non-causal self-attention with per-head RMSNorm on q and k, no positions."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        w, hd = cfg.width, cfg.width // cfg.n_head
        self.n_head = cfg.n_head
        self.c_qk = nn.Linear(w, 2 * w)
        self.c_v = nn.Linear(w, w)
        self.c_proj = nn.Linear(w, w)
        self.q_norm = RMSNorm(hd, cfg.qk_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.qk_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        heads = lambda t: t.unflatten(-1, (self.n_head, -1)).transpose(1, 2)  # noqa: E731  [B, H, N, d]
        q, k = self.c_qk(x).chunk(2, dim=-1)
        y = F.scaled_dot_product_attention(self.q_norm(heads(q)), self.k_norm(heads(k)), heads(self.c_v(x)))
        return self.c_proj(y.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.eps = cfg.eps
        self.attn = SelfAttention(cfg)
        self.mlp = MLP(cfg.width, 4 * cfg.width)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(layer_norm(x, self.eps))
        return x + self.mlp(layer_norm(x, self.eps))


class LatentDecoder(nn.Module):
    """Codes [B, N, W] + learned positions -> latents, through non-causal self-attention layers."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.positional_encodings = nn.Parameter(torch.zeros(cfg.num_latents, cfg.width))
        self.blocks = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_decoder_layer))

    def forward(self, z: Tensor) -> Tensor:
        h = z + self.positional_encodings[: z.shape[1]]
        for block in self.blocks:
            h = block(h)
        return h


class FourierEmbedder(nn.Module):
    """Phase-modulated Fourier features: [x, cos(xW) + cos(x pi/2 + carrier), sin(...) + sin(...)]."""

    def __init__(self, num_freqs: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3, num_freqs))
        carrier = (num_freqs / 8) ** torch.linspace(1, 0, num_freqs, dtype=torch.float32)
        carrier = (carrier + torch.linspace(0, 1, num_freqs, dtype=torch.float32)) * 2 * math.pi
        self.register_buffer("carrier", carrier, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        m = x.float().unsqueeze(-1)                                             # [..., 3, 1]
        fm = (m * self.weight.float()).flatten(-2)                             # [..., 3F]
        pm = (m * (0.5 * math.pi) + self.carrier.float()).flatten(-2)
        return torch.cat([x.float(), fm.cos() + pm.cos(), fm.sin() + pm.sin()], dim=-1)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, width: int):
        super().__init__()
        self.in_layer = nn.Linear(in_dim, width)
        self.out_layer = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


class CrossAttention(nn.Module):
    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        w = cfg.width
        self.n_head = cfg.n_head
        self.c_q, self.c_k, self.c_v, self.c_proj = (nn.Linear(w, w) for _ in range(4))

    def heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.n_head, -1)).transpose(1, 2)

    def forward(self, x: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """x: [B, P, W] queries; k, v: [B, H, N, d] from `CrossAttentionLayer.keys_values`."""
        y = F.scaled_dot_product_attention(self.heads(self.c_q(x)), k, v)
        return self.c_proj(y.transpose(1, 2).flatten(2))


class CrossAttentionLayer(nn.Module):
    """x += attn(ln_1(x), ln_2(latents)); x += mlp(ln_f(x))."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.eps = cfg.eps
        self.attn = CrossAttention(cfg)
        self.mlp = MLP(cfg.width, 4 * cfg.width)

    def keys_values(self, latents: Tensor) -> tuple[Tensor, Tensor]:
        """The latents' side, computed once per object and reused for every chunk of query points."""
        c = layer_norm(latents, self.eps)
        return self.attn.heads(self.attn.c_k(c)), self.attn.heads(self.attn.c_v(c))

    def forward(self, x: Tensor, k: Tensor, v: Tensor) -> Tensor:
        x = x + self.attn(layer_norm(x, self.eps), k, v)
        return x + self.mlp(layer_norm(x, self.eps))


class OccupancyDecoder(nn.Module):
    """Query points [B, P, 3] + latents -> occupancy logits [B, P] (the surface is the zero level)."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.embedder = FourierEmbedder(cfg.num_freqs)
        self.query_in = MLPEmbedder(cfg.embed_dim, cfg.width)
        self.attn_out = CrossAttentionLayer(cfg)
        self.ln_f = nn.LayerNorm(cfg.width, eps=cfg.eps)
        self.c_head = nn.Linear(cfg.width, cfg.out_dim)

    def forward(self, points: Tensor, kv: tuple[Tensor, Tensor]) -> Tensor:
        dtype = self.query_in.in_layer.weight.dtype
        x = self.query_in(self.embedder(points).to(dtype))
        x = self.attn_out(x, *kv)
        x = F.layer_norm(x.float(), (x.shape[-1],), self.ln_f.weight.float(), self.ln_f.bias.float(),
                         self.ln_f.eps).to(dtype)
        return self.c_head(x).squeeze(-1)


class ShapeTokenizer(nn.Module):
    """Tokens -> latents -> occupancy. State dict names match the released tokenizer's generation parts."""

    def __init__(self, cfg: ShapeTokenizerConfig):
        super().__init__()
        self.cfg = cfg
        self.bottleneck = Bottleneck(cfg)
        self.decoder = LatentDecoder(cfg)
        self.occupancy_decoder = OccupancyDecoder(cfg)

    def decode_indices(self, ids: Tensor) -> Tensor:
        """ids [B, N] (clamped to the codebook) -> latents [B, N, W]."""
        ids = ids.clamp(0, self.cfg.num_codes - 1)
        return self.decoder(self.bottleneck.block.lookup(ids))
