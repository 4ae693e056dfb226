"""The Triton kernels compute what the PyTorch ops compute (on the CPU through Triton's interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("triton")

PRELUDE = textwrap.dedent("""
    import torch
    from inference.ops import TorchOps
    from inference.sampling import guide
    from inference.triton_ops import TritonOps

    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()


    def check_pick(tr, w, wte, prompts, guided, at, prompt_rows):
        # the fused lm_head pick: guidance + argmax + id + next embedding, the position advanced once
        width = w.shape[1]
        h = torch.randn(prompts * (2 if guided else 1), width)
        pos, n_total, scale = torch.tensor([at]), torch.tensor([12]), torch.tensor([3.0], dtype=torch.float64)
        ids, x_next = torch.zeros(prompt_rows, 12, dtype=torch.long), torch.zeros(2 * prompt_rows, width)
        tr.lm_head_pick(h, w, wte, prompts, guided, scale, n_total, pos, ids, x_next)
        want = guide(TorchOps().linear(h, w), prompts, guided, scale, torch.tensor([at]), n_total).argmax(-1)
        assert torch.equal(ids[:prompts, at], want) and torch.equal(x_next[:prompts], wte[want])
        assert torch.equal(x_next[prompts:2 * prompts], wte[want] if guided else torch.zeros(prompts, width))
        assert pos.item() == at + 1 and tr._ticket.item() == 0
""")

SCRIPT = PRELUDE + textwrap.dedent("""
    from inference.engine import Engine

    torch.manual_seed(0)
    engine = Engine("tiny", None, mode="eager", batch_buckets=(1, 2), init_std=0.05)
    m, cfg, rows = engine.model, engine.cfg, 4
    to, tr = TorchOps(), TritonOps()
    tr.attn_block_n = 8                  # several splits: the split + combine path runs too
    for lw in m.decode_layers():
        lw.cache.k.normal_(); lw.cache.v.normal_()
    d, f = cfg.n_embd, cfg.mlp_hidden
    x = torch.randn(rows, d)
    assert rel(tr.layer_norm(x, 1e-6), to.layer_norm(x, 1e-6)) < 1e-5
    w, b = torch.randn(3 * d, d), torch.randn(d)
    assert rel(tr.linear(x, w), to.linear(x, w)) < 1e-5
    xk, wk = torch.randn(rows, 1024), torch.randn(64, 1024)
    parts = tr.linear_parts(xk, wk)
    assert parts.shape[0] > 1 and rel(parts.sum(0), to.linear(xk, wk)) < 1e-5    # split-K parts
    parts = torch.randn(3, rows, d)
    x1, x2 = x.clone(), x.clone()
    assert rel(tr.residual_layer_norm(x1, parts, b, 1e-6), to.residual_layer_norm(x2, parts, b, 1e-6)) < 1e-5
    assert rel(x1, x2) < 1e-6
    wgu, bgu = torch.randn(2 * f, d) / d ** 0.5, torch.randn(2 * f)
    assert rel(tr.linear_swiglu(x, wgu, bgu), to.linear_swiglu(x, wgu, bgu)) < 1e-5
    for lw in (m.decode_layers()[0], m.decode_layers()[-1]):          # a dual layer and the single one
        for p in (1, 11):
            pos, qkv = torch.tensor([p]), torch.randn(2, rows, 3 * cfg.n_embd)
            saved = lw.cache.k.clone(), lw.cache.v.clone()
            q1 = tr.qk_norm_rope_cache(qkv, lw, rows, m.rope_cos, m.rope_sin, pos, 1e-5)
            k1, v1 = lw.cache.k.clone(), lw.cache.v.clone()
            lw.cache.k.copy_(saved[0]); lw.cache.v.copy_(saved[1])
            q2 = to.qk_norm_rope_cache(qkv, lw, rows, m.rope_cos, m.rope_sin, pos, 1e-5)
            assert rel(q1, q2) < 1e-5 and rel(k1, lw.cache.k) < 1e-6 and rel(v1, lw.cache.v) < 1e-6
            assert rel(tr.attention_output(q2, lw, rows, pos), to.attention(q2, lw, rows, pos)) < 1e-5
            tr.launch.fuse_qk_rows = rows
            for attn in (None, (32, 4, 2, 0)):       # fused q/k norm + RoPE: split over the cache, or one program
                tr.attn = attn
                lw.cache.k.copy_(saved[0]); lw.cache.v.copy_(saved[1])
                got = tr._merged(tr.qkv_attention(qkv, lw, rows, m.rope_cos, m.rope_sin, pos, 1e-5))
                k1, v1 = lw.cache.k.clone(), lw.cache.v.clone()
                lw.cache.k.copy_(saved[0]); lw.cache.v.copy_(saved[1])
                want = to.qkv_attention(qkv, lw, rows, m.rope_cos, m.rope_sin, pos, 1e-5)
                assert rel(got, want) < 1e-5 and rel(k1, lw.cache.k) < 1e-6 and rel(v1, lw.cache.v) < 1e-6
            tr.attn = None
            wp = torch.randn(cfg.n_embd, cfg.n_embd)
            for fuse in (False, True):                                     # combine kernel, or inside the GEMM
                tr.launch.fuse_combine = fuse
                got = tr.linear_parts(tr.attention(q2, lw, rows, pos), wp).sum(0)
                assert rel(got, to.linear(to.attention(q2, lw, rows, pos), wp)) < 1e-5
    x = torch.randn(rows, d)
    caches = [(lw.cache.k.clone(), lw.cache.v.clone()) for lw in m.decode_layers()]
    ref = m.decode_step(x, torch.tensor([5]), to)
    for lw, (k, v) in zip(m.decode_layers(), caches):
        lw.cache.k.copy_(k); lw.cache.v.copy_(v)
    assert rel(m.decode_step(x, torch.tensor([5]), tr), ref) < 1e-5
    w, wte = torch.randn(256, d) / d ** 0.5, torch.randn(300, d)           # four column blocks of the head
    for prompts, guided in ((1, True), (4, True), (5, False)):
        check_pick(tr, w, wte, prompts, guided, at=7, prompt_rows=8)
    print("kernels ok")
""")


ODD_SHAPES = PRELUDE + textwrap.dedent("""
    from inference.config import Cube3DConfig, with_overrides
    from inference.engine import Engine

    torch.manual_seed(1)
    # a vocabulary under one lm_head block and off any multiple of it; head sizes of no power of two (24, 40)
    for vocab, width, heads in ((40, 96, 4), (48, 80, 2)):
        cfg = with_overrides(Cube3DConfig.from_name("tiny"), shape_model_vocab_size=vocab, n_embd=width,
                             n_head=heads)
        m = Engine(cfg, None, mode="eager", batch_buckets=(1, 2), init_std=0.05).model
        to, tr = TorchOps(), TritonOps()
        tr.attn_block_n = 8                  # several splits: the combine step runs too
        for lw in m.decode_layers():
            lw.cache.k.normal_(); lw.cache.v.normal_()
        caches = [(lw.cache.k.clone(), lw.cache.v.clone()) for lw in m.decode_layers()]

        def reset():
            for lw, (k, v) in zip(m.decode_layers(), caches):
                lw.cache.k.copy_(k); lw.cache.v.copy_(v)

        x = torch.randn(4, width)
        ref = m.decode_step(x, torch.tensor([5]), to)
        for fused_rows in (2, 4):            # q/k norm + RoPE apart (4 rows > 2) and inside the attention
            tr.launch.fuse_qk_rows = fused_rows
            reset()
            assert rel(m.decode_step(x, torch.tensor([5]), tr), ref) < 1e-5, (vocab, width, heads, fused_rows)
        w, wte = m.shape_head(), m.transformer.wte.weight
        for prompts, guided in ((1, True), (2, False)):
            check_pick(tr, w, wte, prompts, guided, at=3, prompt_rows=2)
    print("odd shapes ok")
""")


@pytest.mark.parametrize("script, done", [(SCRIPT, "kernels ok"), (ODD_SHAPES, "odd shapes ok")],
                         ids=["kernels", "odd_shapes"])
def test_triton_kernels_match_torch_ops_in_the_interpreter(script, done):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert done in proc.stdout
