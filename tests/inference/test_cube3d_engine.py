"""KV-cache decoding equals full recomputation; batching, sampling and request checks; GPU paths on a GPU."""

from __future__ import annotations

import pytest
import torch

from inference.config import Cube3DConfig, with_overrides
from inference.engine import Engine
from inference.errors import GenerationError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; run through the device tool")


def _prompts(engine: Engine, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    cfg, gen = engine.cfg, torch.Generator().manual_seed(seed)
    text = torch.randn(n + 1, cfg.text_tokens, cfg.text_model_embed_dim, generator=gen)
    bbox = torch.rand(n + 1, 3, generator=gen)
    cond = engine.condition(text, bbox)
    return cond[:n], cond[n:]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine("tiny", None, mode="eager", batch_buckets=(1, 4), init_std=0.1, seed=3)


@torch.no_grad()
def test_decode_step_logits_equal_full_recomputation(engine):
    model, cfg = engine.model, engine.cfg
    cond, uncond = _prompts(engine, 1)
    rows = torch.cat([cond, uncond])
    tokens = torch.randint(0, cfg.shape_model_vocab_size, (2, cfg.n_generated - 1))
    x = model.embed(torch.cat([torch.full((2, 1), cfg.bos_id), tokens], dim=1))     # [2, N, D]
    full = model(rows, x)[..., : cfg.shape_model_vocab_size]                        # [2, N, V]
    prefill = model(rows, x[:, :1], fill_cache=True)[:, -1, : cfg.shape_model_vocab_size]
    torch.testing.assert_close(prefill, full[:, 0], rtol=1e-5, atol=1e-5)
    for i in range(1, cfg.n_generated):
        step = model.decode_step(x[:, i], torch.tensor([i]), engine.ops)
        torch.testing.assert_close(step, full[:, i], rtol=1e-4, atol=1e-4)


def test_kv_cache_ids_equal_no_cache_ids(engine):
    cond, uncond = _prompts(engine, 2, seed=1)
    cached = engine.generate(cond, uncond)
    engine.set_mode("nocache")
    try:
        assert torch.equal(engine.generate(cond, uncond), cached)
    finally:
        engine.set_mode("eager")


def test_batch_equals_one_prompt_at_a_time(engine):
    cond, uncond = _prompts(engine, 3, seed=2)
    together = engine.generate(cond, uncond, n_tokens=8)
    alone = torch.cat([engine.generate(cond[i:i + 1], uncond, n_tokens=8) for i in range(3)])
    assert together.shape == (3, 8) and torch.equal(together, alone)
    # more prompts than the largest bucket run in chunks
    assert torch.equal(engine.generate(cond.repeat(2, 1, 1), uncond, n_tokens=8), together.repeat(2, 1))


def test_top_p_is_seeded_and_tiny_top_p_is_greedy(engine):
    cond, uncond = _prompts(engine, 2, seed=4)
    a = engine.generate(cond, uncond, top_p=0.95, seed=11)
    assert torch.equal(a, engine.generate(cond, uncond, top_p=0.95, seed=11))
    assert not torch.equal(a, engine.generate(cond, uncond, top_p=0.95, seed=12))
    assert torch.equal(engine.generate(cond, uncond, top_p=1e-9, seed=5), engine.generate(cond, uncond))


def test_without_guidance(engine):
    cond, _ = _prompts(engine, 2, seed=5)
    ids = engine.generate(cond, guidance_scale=0.0, n_tokens=6)
    assert ids.shape == (2, 6) and engine.last_stats.rows == 4          # the bucket of 4, no unconditional rows


@pytest.mark.parametrize("kwargs,match", [
    (dict(cond=torch.zeros(1, 3, 128)), r"`cond` must be \[prompts, 6, 128\]"),
    (dict(uncond=None), "guidance needs `uncond`"),
    (dict(n_tokens=13), r"`n_tokens` must be within 1..12"),
    (dict(top_p=0.0), r"`top_p` must be in \(0, 1\]"),
])
def test_bad_requests_say_what_to_fix(engine, kwargs, match):
    cond, uncond = _prompts(engine, 1)
    args = dict(cond=cond, uncond=uncond) | kwargs
    with pytest.raises(GenerationError, match=match):
        engine.generate(**args)


def test_graph_modes_need_cuda():
    with pytest.raises(GenerationError, match="needs a CUDA device"):
        Engine("tiny", None, device="cpu", mode="fast")
    with pytest.raises(GenerationError, match="valid modes"):
        Engine("tiny", None, device="cpu", mode="turbo")


def test_parameters_stay_views_of_the_fused_weights(engine):
    lw = engine.model.decode_layers()[0]
    attn = engine.model.transformer.dual_blocks[0].attn.pre_x
    assert attn.c_qk.weight.data_ptr() == lw.qkv_w.data_ptr()
    assert torch.equal(lw.qkv_w[-attn.c_v.weight.shape[0]:], attn.c_v.weight)
    assert set(engine.model.state_dict()) == set(Engine("tiny", None).model.state_dict())


@needs_cuda
def test_fast_path_reproduces_the_reference_on_gpu(cube3d_data, tiny_reference):
    cond = tiny_reference["expected.cond"]
    for mode in ("fast", "graph"):
        engine = Engine("tiny", cube3d_data / "tiny_reference.safetensors", "cuda", weights_prefix="model.", mode=mode)
        ids = engine.generate(cond[0:1], cond[1:2])
        assert torch.equal(ids, tiny_reference["expected.greedy_cfg_ids"]), mode


@needs_cuda
@torch.no_grad()
def test_fast_step_matches_eager_step_with_real_head_dim():
    cfg = with_overrides(Cube3DConfig.from_name("tiny"), n_head=2, n_embd=256, text_tokens=77, n_generated=300)
    engine = Engine(cfg, None, "cuda", torch.float32, mode="eager", batch_buckets=(1, 8), init_std=0.05)
    cond, uncond = _prompts(engine, 8, seed=6)
    eager = engine.generate(cond, uncond)
    engine.set_mode("fast")
    assert torch.equal(engine.generate(cond, uncond), eager)
    assert torch.equal(engine.generate(cond[:1], uncond), eager[:1])
    sampled = engine.generate(cond, uncond, top_p=0.9, seed=3)
    engine.set_mode("eager")
    assert torch.equal(engine.generate(cond, uncond, top_p=0.9, seed=3), sampled)


# (vocabulary, width, heads): a vocabulary under one lm_head block and off any block multiple, head sizes that
# are no power of two (24, 40, 20), widths the skinny GEMM cannot tile (cuBLAS then)
ODD_SHAPES = [(40, 96, 4), (48, 80, 2), (37, 160, 8)]


@needs_cuda
@torch.no_grad()
@pytest.mark.parametrize("vocab, width, heads", ODD_SHAPES)
def test_every_mode_takes_any_valid_shape_with_the_eager_ids(vocab, width, heads):
    cfg = with_overrides(Cube3DConfig.from_name("tiny"), shape_model_vocab_size=vocab, n_embd=width, n_head=heads,
                         n_generated=40)
    engine = Engine(cfg, None, "cuda", torch.float32, mode="eager", batch_buckets=(1, 4), init_std=0.05)
    cond, uncond = _prompts(engine, 4, seed=vocab)
    eager = engine.generate(cond, uncond)
    for mode in ("fast", "graph", "nocache"):
        engine.set_mode(mode)
        assert torch.equal(engine.generate(cond, uncond), eager), mode
        assert torch.equal(engine.generate(cond[:1], uncond), eager[:1]), mode


def _h200_gemv_entries() -> list:
    from inference.triton_ops import H200_GEMV

    return sorted(key for key, cfg in H200_GEMV.items() if cfg is not None)


@needs_cuda
@torch.no_grad()
@pytest.mark.parametrize("key", _h200_gemv_entries())
def test_every_h200_gemv_table_entry_computes_the_product_in_float32(key):
    from inference.ops import TorchOps
    from inference.triton_ops import H200_GEMV, PARTIAL, SWIGLU, TritonOps

    epilogue, n, k, rows = key
    gen = torch.Generator(device="cuda").manual_seed(n + k + rows)
    x = torch.randn(rows, k, device="cuda", generator=gen)
    w = torch.randn(2 * n if epilogue == SWIGLU else n, k, device="cuda", generator=gen) / k ** 0.5
    b = torch.randn(w.shape[0], device="cuda", generator=gen)
    fast, ref = TritonOps(), TorchOps()
    if epilogue == SWIGLU:
        got, want = fast.linear_swiglu(x, w, b), ref.linear_swiglu(x, w, b)
    elif epilogue == PARTIAL:
        parts = fast.linear_parts(x, w)
        assert parts.shape[0] == H200_GEMV[key][4], "the Triton kernel ran, with the table's K splits"
        got, want = parts.sum(0), ref.linear_parts(x, w).sum(0)
    else:
        got, want = fast.linear(x, w), torch.nn.functional.linear(x, w)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
