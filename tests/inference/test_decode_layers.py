"""The persistent decode-layers kernel: compiled with NVRTC on the CPU (its host-side layout checked against the
kernel's structs), and on a Hopper GPU the same step as the per-layer kernels and the PyTorch ops."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from inference import decode_layers
from inference.config import Cube3DConfig
from inference.decode_layers import PersistentLayers, compile_cubin
from inference.errors import GenerationError
from inference.layers import KVCache, rope_tables
from inference.model import LayerWeights
from inference.ops import TorchOps

hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                            reason="needs a Hopper GPU (sm_90); run through the device tool")


def test_kernel_compiles_for_hopper_with_nvrtc_alone():
    cubin = compile_cubin()
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 10_000


def test_host_layout_matches_the_kernel(tmp_path, monkeypatch):
    """The Params bytes the host packs, the layer table's columns and the shared memory it asks for are what the
    kernel's structs and buffers take: static assertions compiled into the kernel source."""
    checks = (f"\nstatic_assert(sizeof(Params) == 96 && sizeof(LayerW) == 14 * 8, \"host packing\");\n"
              f"static_assert(Shape<2>::SMEM == {decode_layers.smem_bytes(2)} && "
              f"Shape<16>::SMEM == {decode_layers.smem_bytes(16)}, \"shared memory\");\n"
              f"static_assert(THREADS == {decode_layers.THREADS} && SPLITS == {decode_layers.CLUSTER} && "
              f"MAXSLOTS == {decode_layers.MAX_SPLIT_SLOTS} && MIN_CLUSTERS * SPLITS == {decode_layers.MIN_GRID} && "
              f"D == {decode_layers.D} && F == {decode_layers.F} && H == {decode_layers.H}, \"constants\");\n")
    source = tmp_path / "decode_layers.cu"
    source.write_text(decode_layers.SOURCE.read_text() + checks)
    monkeypatch.setattr(decode_layers, "SOURCE", source)
    compile_cubin()
    source.write_text(decode_layers.SOURCE.read_text() + "\nstatic_assert(sizeof(Params) == 88, \"wrong\");\n")
    with pytest.raises(Exception, match="static assertion|wrong"):
        compile_cubin()


def test_without_nvrtc_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setattr(decode_layers, "_nvrtc_candidates", lambda: [])
    with pytest.raises(GenerationError, match="no loadable NVRTC library.*nvidia-cuda-nvrtc"):
        compile_cubin()


def test_one_instance_refuses_another_layer_count():
    """Its barrier counter assumes one layer count: a launch with another would hang, so it is refused first."""
    kernel = PersistentLayers.__new__(PersistentLayers)   # the check needs no device
    kernel._n_layers = {}
    kernel._check_layer_count(2, 24)
    kernel._check_layer_count(2, 24)
    kernel._check_layer_count(16, 4)   # the 16-row kernel has its own counter
    with pytest.raises(GenerationError, match="runs 24 layers a launch for 2 rows, not 2"):
        kernel._check_layer_count(2, 2)


def _layers(n: int, cache_len: int, device: str, dtype=torch.bfloat16, seed: int = 0,
            rows: int = 2) -> list[LayerWeights]:
    cfg = Cube3DConfig.from_name("v0.1")
    d, f, h, hd = cfg.n_embd, cfg.mlp_hidden, cfg.n_head, cfg.head_dim
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)
    out = []
    for i in range(n):
        cache = KVCache(rows, h, cache_len - (0 if i < n - 1 else 80), hd, dtype, device)
        cache.k.copy_(rnd(*cache.k.shape, std=1.0))
        cache.v.copy_(rnd(*cache.v.shape, std=1.0))
        qkv_b = torch.cat([torch.zeros(2 * d, device=device, dtype=dtype), rnd(d)])
        out.append(LayerWeights(rnd(3 * d, d), qkv_b, 1 + rnd(hd, std=0.1), 1 + rnd(hd, std=0.1), rnd(d, d), rnd(d),
                                rnd(2 * f, d), rnd(2 * f), rnd(d, f), rnd(d), cache, 77 if i < n - 1 else 0))
    return out


def test_applies_only_to_the_shapes_it_was_compiled_for():
    layers = _layers(2, 592, "cpu")
    x = torch.zeros(2, 1536, dtype=torch.bfloat16)
    cos = torch.zeros(512, 64)
    assert PersistentLayers.applies(x, layers, cos)
    assert not PersistentLayers.applies(x.float(), layers, cos)
    assert not PersistentLayers.applies(torch.zeros(16, 1536, dtype=torch.bfloat16), layers, cos)   # 2-row caches
    assert PersistentLayers.applies(torch.zeros(16, 1536, dtype=torch.bfloat16), _layers(1, 592, "cpu", rows=16), cos)
    assert not PersistentLayers.applies(torch.zeros(8, 1536, dtype=torch.bfloat16), _layers(1, 592, "cpu", rows=16),
                                        cos)
    too_long = _layers(1, 4 * decode_layers.MAX_SPLIT_SLOTS + 80, "cpu")
    assert not PersistentLayers.applies(x, too_long, cos)
    one_row = [lw._replace(cache=KVCache(1, 12, 592, 128, torch.bfloat16, "cpu")) for lw in layers]
    assert not PersistentLayers.applies(x, one_row, cos)   # the kernel writes and reads 2 cache rows
    assert PersistentLayers.create(torch.device("cpu")) is None


def _decode(ops, x0: torch.Tensor, layers: list[LayerWeights], pos: torch.Tensor, cos, sin) -> tuple:
    from inference.triton_ops import TritonOps

    x = x0.clone()
    fused = ops.fused_layers(x, pos, layers, cos, sin, 1e-6, 1e-5) if isinstance(ops, TritonOps) else None
    if fused is not None:
        return fused, x
    h = ops.layer_norm(x, 1e-6)
    for lw in layers:
        a = ops.qkv_attention(ops.linear_parts(h, lw.qkv_w), lw, x.shape[0], cos, sin, pos, 1e-5)
        h = ops.residual_layer_norm(x, ops.linear_parts(a, lw.proj_w), lw.proj_b, 1e-6)
        h = ops.residual_layer_norm(x, ops.linear_parts(ops.linear_swiglu(h, lw.gu_w, lw.gu_b), lw.down_w),
                                    lw.down_b, 1e-6)
    return h, x


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@hopper
@pytest.mark.parametrize("rows, position", [(2, 0), (2, 2), (2, 255), (2, 511), (16, 0), (16, 300), (16, 511)])
def test_one_launch_equals_the_per_layer_kernels_and_the_torch_ops(rows, position):
    """Hidden state, residual and the new cache slots after 4 layers (3 with the condition tokens first, the last
    without), one prompt or eight: as close to the PyTorch ops as the per-layer kernels are, in bf16."""
    from inference.triton_ops import Launch, TritonOps

    dev = torch.device("cuda")
    layers = _layers(4, 592, "cuda", seed=position, rows=rows)
    cos, sin = rope_tables(128, 512, 10000.0, dev)
    pos = torch.tensor([position], device=dev)
    x0 = torch.randn(rows, 1536, device=dev, generator=torch.Generator(device=dev).manual_seed(1)).bfloat16()
    fused_ops = TritonOps()
    h_f, x_f = _decode(fused_ops, x0, layers, pos, cos, sin)
    assert fused_ops.runs_persistent_layers
    new_f = [(lw.cache.k[:, :, lw.offset + position].clone(), lw.cache.v[:, :, lw.offset + position].clone())
             for lw in layers]
    per_layer = TritonOps(dataclasses.replace(Launch(), persistent_layers=False))
    h_k, x_k = _decode(per_layer, x0, layers, pos, cos, sin)
    assert not per_layer.runs_persistent_layers
    h_t, x_t = _decode(TorchOps(), x0, layers, pos, cos, sin)
    assert _rel(h_f, h_k) < 2e-2 and _rel(x_f, x_k) < 2e-2
    assert _rel(h_f, h_t) < 1.5 * _rel(h_k, h_t) + 1e-3
    assert _rel(x_f, x_t) < 1.5 * _rel(x_k, x_t) + 1e-3
    for lw, (k_f, v_f) in zip(layers, new_f):
        k_t, v_t = lw.cache.k[:, :, lw.offset + position], lw.cache.v[:, :, lw.offset + position]
        assert _rel(k_f, k_t) < 2e-2 and _rel(v_f, v_t) < 2e-2


@hopper
@pytest.mark.parametrize("rows", [2, 16])
def test_the_same_step_twice_is_bit_identical(rows):
    """24 layers, six times from the same residual: every run the same bits. A ring stage released before the warp's
    loads of it had returned made 16-row runs differ from the third layer on (each of six runs distinct)."""
    from inference.triton_ops import TritonOps

    dev = torch.device("cuda")
    layers = _layers(24, 592, "cuda", seed=5, rows=rows)
    cos, sin = rope_tables(128, 512, 10000.0, dev)
    x0 = torch.randn(rows, 1536, device=dev, generator=torch.Generator(device=dev).manual_seed(2)).bfloat16()
    ops = TritonOps()
    for position in (3, 300):
        pos = torch.tensor([position], device=dev)
        first = torch.cat(_decode(ops, x0, layers, pos, cos, sin))
        for _ in range(5):
            assert torch.equal(torch.cat(_decode(ops, x0, layers, pos, cos, sin)), first), f"position {position}"
    assert ops.runs_persistent_layers


@hopper
def test_engine_generates_through_the_persistent_layers_in_a_graph():
    """A v0.1-shaped bf16 engine decodes one prompt and a batch of eight with the kernels inside its CUDA graphs,
    as many tokens as asked, each a shape code, the same ids when asked again; a bucket of 2 prompts (4 rows)
    keeps the per-layer kernels."""
    from inference.engine import Engine

    cfg = Cube3DConfig.from_name("v0.1")
    engine = Engine("v0.1", None, "cuda", torch.bfloat16, mode="fast", batch_buckets=(1, 2, 8), init_std=0.02)
    text = torch.randn(9, cfg.text_tokens, cfg.text_model_embed_dim, generator=torch.Generator().manual_seed(0))
    cond = engine.condition(text)
    for prompts in (1, 8, 2):
        ids = engine.generate(cond[:prompts], cond[8:], n_tokens=40)
        assert ids.shape == (prompts, 40) and 0 <= int(ids.min()) and int(ids.max()) < cfg.shape_model_vocab_size
        assert torch.equal(ids, engine.generate(cond[:prompts], cond[8:], n_tokens=40)), f"{prompts} prompts"
    assert engine.ops.runs_persistent_layers
