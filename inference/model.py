"""The Cube 3D dual-stream decoder ("DualStreamRoformer"), with the released parameter names.

Plain eager PyTorch in the style of gpt-fast: the model owns its KV caches; CUDA graphs and fused kernels are
applied by the engine at the call site (`inference.engine`), never here. Shapes: B rows, S condition tokens,
L shape tokens, D width, H heads, d head dim, V vocabulary.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import Cube3DConfig
from inference.layers import KVCache, RMSNorm, SwiGLU, apply_rope, layer_norm, rope_tables


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


class PreAttention(nn.Module):
    """One stream's projection to heads: q and k (`c_qk`), or k alone (`c_k`), and v; RMSNorm per head."""

    def __init__(self, cfg: Cube3DConfig, query: bool):
        super().__init__()
        d, hd = cfg.n_embd, cfg.head_dim
        self.n_head = cfg.n_head
        self.query = query
        if query:
            self.c_qk = nn.Linear(d, 2 * d, bias=False)
            self.q_norm = RMSNorm(hd, cfg.qk_norm_eps)
        else:
            self.c_k = nn.Linear(d, d, bias=cfg.bias)
        self.k_norm = RMSNorm(hd, cfg.qk_norm_eps)
        self.c_v = nn.Linear(d, d, bias=cfg.bias)

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.n_head, -1)).transpose(1, 2)  # [B, L, D] -> [B, H, L, d]

    def forward(self, h: Tensor) -> tuple[Tensor | None, Tensor, Tensor]:
        if self.query:
            q, k = self.c_qk(h).chunk(2, dim=-1)
            q = self.q_norm(self._heads(q))
        else:
            q, k = None, self.c_k(h)
        return q, self.k_norm(self._heads(k)), self._heads(self.c_v(h))


class PostAttention(nn.Module):
    """Output projection, residual, LayerNorm, SwiGLU MLP, residual."""

    def __init__(self, cfg: Cube3DConfig):
        super().__init__()
        self.eps = cfg.eps
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.mlp = SwiGLU(cfg.n_embd, cfg.mlp_hidden, cfg.bias)

    def forward(self, x: Tensor, a: Tensor) -> Tensor:
        x = x + self.c_proj(a)
        return x + self.mlp(layer_norm(x, self.eps))


class DualAttention(nn.Module):
    """Holds the two streams' pre-attention parts (`attn.pre_x`, `attn.pre_c` in the checkpoint)."""

    def __init__(self, cfg: Cube3DConfig, cond_pre_only: bool):
        super().__init__()
        self.pre_x = PreAttention(cfg, query=True)
        self.pre_c = PreAttention(cfg, query=not cond_pre_only)


class DualBlock(nn.Module):
    """Joint attention over [c ; x] with a causal mask over the whole (S + L) sequence; a post block per stream."""

    def __init__(self, cfg: Cube3DConfig, cond_pre_only: bool):
        super().__init__()
        self.eps = cfg.eps
        self.attn = DualAttention(cfg, cond_pre_only)
        self.post_1 = PostAttention(cfg)
        self.post_2 = None if cond_pre_only else PostAttention(cfg)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, c: Tensor, cos: Tensor, sin: Tensor, mask: Tensor,
                fill_cache: bool = False) -> tuple[Tensor, Tensor | None]:
        s, n = c.shape[1], x.shape[1]
        qx, kx, vx = self.attn.pre_x(layer_norm(x, self.eps))
        qc, kc, vc = self.attn.pre_c(layer_norm(c, self.eps))
        # condition tokens all sit at position 0 (a zero rotation); shape tokens at 0..L-1
        qx, kx = apply_rope(qx, cos, sin), apply_rope(kx, cos, sin)
        k, v = torch.cat([kc, kx], dim=2), torch.cat([vc, vx], dim=2)      # [B, H, S+L, d]
        if fill_cache:
            self.kv_cache.fill(k, v)
        q, rows = (qx, mask[s:]) if qc is None else (torch.cat([qc, qx], dim=2), mask)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=rows).transpose(1, 2).flatten(2)
        x = self.post_1(x, y[:, -n:])
        return x, (None if self.post_2 is None else self.post_2(c, y[:, :s]))


class SingleAttention(nn.Module):
    def __init__(self, cfg: Cube3DConfig):
        super().__init__()
        d = cfg.n_embd
        self.n_head = cfg.n_head
        self.c_qk = nn.Linear(d, 2 * d, bias=False)
        self.c_v = nn.Linear(d, d, bias=cfg.bias)
        self.c_proj = nn.Linear(d, d, bias=cfg.bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.qk_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.qk_norm_eps)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None) -> Tensor:
        heads = lambda t: t.unflatten(-1, (self.n_head, -1)).transpose(1, 2)  # noqa: E731  [B, H, L, d]
        q, k = self.c_qk(h).chunk(2, dim=-1)
        q = apply_rope(self.q_norm(heads(q)), cos, sin)
        k = apply_rope(self.k_norm(heads(k)), cos, sin)
        v = heads(self.c_v(h))
        if cache is not None:
            cache.fill(k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).flatten(2))


class SingleBlock(nn.Module):
    """Shape tokens only, causal, their own RoPE positions 0..L-1."""

    def __init__(self, cfg: Cube3DConfig):
        super().__init__()
        self.eps = cfg.eps
        self.attn = SingleAttention(cfg)
        self.mlp = SwiGLU(cfg.n_embd, cfg.mlp_hidden, cfg.bias)
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, fill_cache: bool = False) -> Tensor:
        x = x + self.attn(layer_norm(x, self.eps), cos, sin, self.kv_cache if fill_cache else None)
        return x + self.mlp(layer_norm(x, self.eps))


class LayerWeights(NamedTuple):
    """What one layer's decode step reads: fused [q; k; v] and [gate; up] projections, views of the parameters."""

    qkv_w: Tensor    # [3D, D]
    qkv_b: Tensor    # [3D] (zeros for q and k)
    q_norm: Tensor   # [d]
    k_norm: Tensor   # [d]
    proj_w: Tensor   # [D, D]
    proj_b: Tensor   # [D]
    gu_w: Tensor     # [2F, D]
    gu_b: Tensor     # [2F]
    down_w: Tensor   # [D, F]
    down_b: Tensor   # [D]
    cache: KVCache
    offset: int      # where shape tokens start in this layer's cache (S for dual layers, 0 for single)


class DecodeOps(Protocol):
    """The pieces of a decode step (`inference.ops.TorchOps` in PyTorch, `inference.triton_ops.TritonOps` fused).
    `fuse_pick`: whether greedy steps pick the token inside the lm_head GEMM (`lm_head_pick`)."""

    fuse_pick: bool

    def fused_layers(self, x: Tensor, pos: Tensor, layers: Sequence[LayerWeights], cos: Tensor, sin: Tensor,
                     eps: float, qk_eps: float) -> Tensor | None: ...
    def layer_norm(self, x: Tensor, eps: float) -> Tensor: ...
    def residual_layer_norm(self, x: Tensor, parts: Tensor, bias: Tensor, eps: float) -> Tensor: ...
    def linear(self, x: Tensor, w: Tensor) -> Tensor: ...
    def linear_parts(self, x: Tensor, w: Tensor) -> Tensor: ...
    def linear_swiglu(self, h: Tensor, w: Tensor, b: Tensor) -> Tensor: ...
    def qkv_attention(self, qkv: Tensor, lw: LayerWeights, rows: int, cos: Tensor, sin: Tensor, pos: Tensor,
                      eps: float) -> Tensor: ...


class Cube3DDecoder(nn.Module):
    """Text (and bbox) condition tokens in, logits over shape tokens out."""

    def __init__(self, cfg: Cube3DConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.n_embd
        self.text_proj = nn.Linear(cfg.text_model_embed_dim, d, bias=cfg.bias)
        self.shape_proj = nn.Linear(cfg.shape_model_embed_dim, d)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.padding_id),
            dual_blocks=nn.ModuleList(DualBlock(cfg, cond_pre_only=i == cfg.n_layer - 1)
                                      for i in range(cfg.n_layer)),
            single_blocks=nn.ModuleList(SingleBlock(cfg) for _ in range(cfg.n_single_layer)),
        ))
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.use_bbox:
            self.bbox_proj = nn.Linear(3, d)
        self.rope_cos: Tensor | None = None   # [N, d/2] float32, set by setup_caches
        self.rope_sin: Tensor | None = None
        self._decode_layers: list[LayerWeights] | None = None

    # ---- conditioning and embeddings -------------------------------------------------------------
    def condition(self, text_embed: Tensor, bbox: Tensor | None = None) -> Tensor:
        """text_embed: [B, T, text dim] (CLIP last hidden state); bbox: [B, 3]. Returns cond [B, S, D]."""
        cond = self.text_proj(text_embed)
        if self.cfg.use_bbox:
            if bbox is None:
                bbox = torch.zeros(text_embed.shape[0], 3, dtype=text_embed.dtype, device=text_embed.device)
            cond = torch.cat([cond, self.bbox_proj(bbox).unsqueeze(1)], dim=1)
        return cond

    def embed(self, ids: Tensor) -> Tensor:
        return self.transformer.wte(ids)

    @torch.no_grad()
    def set_codebook(self, codebook: Tensor) -> None:
        """Replace the first `vocab` rows of `wte` by `shape_proj(codebook)` ([codes, code dim]), as at load time."""
        rows = self.shape_proj(codebook.to(self.shape_proj.weight))
        self.transformer.wte.weight[: rows.shape[0]].copy_(rows)

    # ---- full forward (teacher forcing, no-cache decoding, prefill) -------------------------------
    def forward(self, cond: Tensor, x: Tensor, fill_cache: bool = False) -> Tensor:
        """cond: [B, S, D]; x: [B, L, D] shape-token embeddings (BOS first). Returns logits [B, L, vocab].

        With `fill_cache` the keys and values of every position are written to the caches (prefill).
        """
        s, n = cond.shape[1], x.shape[1]
        cos, sin = rope_tables(self.cfg.head_dim, n, self.cfg.rope_theta, x.device)
        mask = torch.ones(s + n, s + n, dtype=torch.bool, device=x.device).tril()
        c: Tensor | None = cond
        for block in self.transformer.dual_blocks:
            x, c = block(x, c, cos, sin, mask, fill_cache)
        for block in self.transformer.single_blocks:
            x = block(x, cos, sin, fill_cache)
        return self.lm_head(layer_norm(x, self.cfg.eps))

    # ---- caches and the one-token decode step ------------------------------------------------------
    def setup_caches(self, rows: int, dtype: torch.dtype, device: torch.device | str) -> None:
        """Allocate every layer's static KV cache once for up to `rows` rows (prompts x guidance branches)."""
        cfg, n = self.cfg, self.cfg.n_generated
        dual_len = _round_up(cfg.cond_len + n, 16)
        for block in self.transformer.dual_blocks:
            block.kv_cache = KVCache(rows, cfg.n_head, dual_len, cfg.head_dim, dtype, device)
        for block in self.transformer.single_blocks:
            block.kv_cache = KVCache(rows, cfg.n_head, _round_up(n, 16), cfg.head_dim, dtype, device)
        self.rope_cos, self.rope_sin = rope_tables(cfg.head_dim, n, cfg.rope_theta, torch.device(device))
        self._decode_layers = None

    def decode_layers(self) -> list[LayerWeights]:
        """Every layer's decode weights; fuses q/k/v and gate/up into single matrices on first use.

        The parameters become views of the fused tensors, so the state dict keeps the released names.
        """
        if self._decode_layers is None or self._decode_layers[0].qkv_w.data_ptr() != self._first_qk_ptr():
            self._decode_layers = [self._fuse(b) for b in self.transformer.dual_blocks]
            self._decode_layers += [self._fuse(b) for b in self.transformer.single_blocks]
        return self._decode_layers

    def _first_qk_ptr(self) -> int:
        return self.transformer.dual_blocks[0].attn.pre_x.c_qk.weight.data_ptr()

    @torch.no_grad()
    def _fuse(self, block: DualBlock | SingleBlock) -> LayerWeights:
        dual = isinstance(block, DualBlock)
        attn = block.attn.pre_x if dual else block.attn
        proj = block.post_1.c_proj if dual else block.attn.c_proj
        mlp = block.post_1.mlp if dual else block.mlp
        qkv_w = _fuse_params(attn.c_qk.weight, attn.c_v.weight)
        gu_w = _fuse_params(mlp.gate_proj.weight, mlp.up_proj.weight)
        zeros = attn.c_qk.weight.new_zeros
        qkv_b = torch.cat([zeros(attn.c_qk.out_features), _bias(attn.c_v)])
        gu_b = torch.cat([_bias(mlp.gate_proj), _bias(mlp.up_proj)])
        return LayerWeights(qkv_w, qkv_b, attn.q_norm.weight, attn.k_norm.weight, proj.weight, _bias(proj),
                            gu_w, gu_b, mlp.down_proj.weight, _bias(mlp.down_proj), block.kv_cache,
                            self.cfg.cond_len if dual else 0)

    def decode_step(self, x: Tensor, pos: Tensor, ops: DecodeOps) -> Tensor:
        """One shape token for each row, reading and extending the caches.

        x: [R, D] embeddings of the tokens at shape position `pos` ([1] int64 on the device, so a captured
        graph advances it without the host). Returns logits over the shape codes: [R, vocab_size - 3].
        """
        return ops.linear(self.decode_hidden(x, pos, ops), self.shape_head())

    def shape_head(self) -> Tensor:
        """The lm_head rows of the shape codes: [vocab_size - 3, D]."""
        return self.lm_head.weight[: self.cfg.shape_model_vocab_size]

    def decode_hidden(self, x: Tensor, pos: Tensor, ops: DecodeOps) -> Tensor:
        """`decode_step` up to the final LayerNorm, [R, D]: the engine's fused greedy path applies the head itself."""
        eps, rows, layers = self.cfg.eps, x.shape[0], self.decode_layers()
        x = x.clone()                                           # residual stream [R, D]
        h = ops.fused_layers(x, pos, layers, self.rope_cos, self.rope_sin, eps, self.cfg.qk_norm_eps)
        if h is not None:
            return h
        h = ops.layer_norm(x, eps)
        for lw in layers:
            qkv = ops.linear_parts(h, lw.qkv_w)                 # [S, R, 3D] split-K parts, bias added below
            a = ops.qkv_attention(qkv, lw, rows, self.rope_cos, self.rope_sin, pos, self.cfg.qk_norm_eps)  # [R, D]
            h = ops.residual_layer_norm(x, ops.linear_parts(a, lw.proj_w), lw.proj_b, eps)     # x += a Wp^T + b
            act = ops.linear_swiglu(h, lw.gu_w, lw.gu_b)        # [R, F]
            h = ops.residual_layer_norm(x, ops.linear_parts(act, lw.down_w), lw.down_b, eps)
        return h


def _bias(linear: nn.Linear) -> Tensor:
    if linear.bias is not None:
        return linear.bias
    return linear.weight.new_zeros(linear.out_features)


def _fuse_params(*params: nn.Parameter) -> Tensor:
    """Concatenate parameters along dim 0 and make each one a view of the result (no extra memory kept)."""
    fused = torch.cat([p.data for p in params])
    start = 0
    for p in params:
        p.data = fused[start:start + p.shape[0]]
        start += p.shape[0]
    return fused
