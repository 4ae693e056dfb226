"""Weight-only FP8 (`inference.fp8`): the rounding, one model for prefill and decode, the kernel's epilogue."""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine
from inference.fp8 import FP8, dequantize, quantize, teacher_forced_error


def test_per_row_scales_keep_each_rows_largest_weight_and_three_mantissa_bits():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 1, 64)[:, None]
    q, scale = quantize(w)
    assert q.dtype == FP8 and scale.shape == (64,)
    back = dequantize(q, scale, torch.float32)
    rows = torch.arange(64)
    top = w.abs().argmax(1)
    assert torch.allclose(back[rows, top], w[rows, top], rtol=1e-6)
    normal = w.abs() >= scale[:, None] * 2.0 ** -6                 # e4m3's normal range: at most 2^-4 rounding
    assert ((back - w).abs() <= w.abs() / 16 * 1.0001)[normal].all()
    assert ((back - w).abs() <= scale[:, None] * 2.0 ** -10 * 1.0001)[~normal].all()


def test_decode_steps_and_the_whole_sequence_forward_use_the_same_fp8_weights(cube3d_data, tiny_reference):
    path, cond = cube3d_data / "tiny_reference.safetensors", tiny_reference["expected.cond"]
    plain = Engine("tiny", path, weights_prefix="model.", mode="eager")
    fp8 = {mode: Engine("tiny", path, weights_prefix="model.", mode=mode, fp8_weights=True)
           for mode in ("eager", "nocache")}
    ids = {mode: engine.generate(cond[0:1], cond[1:2]) for mode, engine in fp8.items()}
    assert torch.equal(ids["eager"], ids["nocache"])            # KV-cached steps == full recomputation
    err = teacher_forced_error(plain.model, fp8["eager"].model, cond[0:1], tiny_reference["expected.greedy_cfg_ids"])
    assert 1e-4 < err["logits_rel_err"] < 0.1                    # the weights did change, and not by much
    matrices = [w for lw in plain.model.decode_layers() for w in (lw.qkv_w, lw.proj_w, lw.gu_w, lw.down_w)]
    assert fp8["eager"].fp8.nbytes == sum(w.numel() + 4 * w.shape[0] for w in matrices)   # 1 byte + row scales


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the FP8 GEMV runs on a CUDA device (bf16, fp8 loads)")
def test_fp8_gemv_computes_the_dequantized_product():
    from inference.ops import TorchOps
    from inference.triton_ops import TritonOps

    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    engine = Engine("v0.1", None, "cuda", torch.bfloat16, mode="fast", batch_buckets=(1, 8), fp8_weights=True)
    lw = engine.model.decode_layers()[0]
    to, tr = TorchOps(engine.fp8), TritonOps(fp8=engine.fp8)
    for rows in (2, 16):
        h = torch.randn(rows, engine.cfg.n_embd, device="cuda", dtype=torch.bfloat16)
        for w in (lw.qkv_w, lw.proj_w):
            parts = tr.linear_parts(h, w)
            assert parts.shape[0] > 1, "the split-K GEMV ran, not the cuBLAS fallback"
            assert rel(parts.sum(0), to.linear_parts(h, w).sum(0)) < 1e-2, rows
        assert rel(tr.linear_swiglu(h, lw.gu_w, lw.gu_b), to.linear_swiglu(h, lw.gu_w, lw.gu_b)) < 1e-2, rows
        a = torch.randn(rows, lw.down_w.shape[1], device="cuda", dtype=torch.bfloat16)
        assert rel(tr.linear_parts(a, lw.down_w).sum(0), to.linear_parts(a, lw.down_w).sum(0)) < 1e-2, rows
        plain = TritonOps().linear_parts(h, lw.qkv_w).sum(0)        # the bf16 copy holds the same FP8 values
        assert rel(plain, to.linear_parts(h, lw.qkv_w).sum(0)) < 1e-2
