"""Asset conditioning: the bbox input, the asset vector, the zero projection (released behaviour unchanged), the
text encoder loaded from a local folder only, and per-request seeds that survive batching."""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine
from inference.service.conditioning import (ASSET_VECTOR_DIM, AssetFeatureFetcher, AssetFeatures, AssetProjection,
                                            asset_vector, bbox_condition)
from inference.service.text_encoder import TextEncoder, TextEncoderError, random_clip

CHAIR = AssetFeatures("a1", (2.0, 1.0, 0.5), "furniture", "medieval", {"views_24h": 120.0, "likes_24h": 7.0})


def test_bbox_is_scaled_so_its_longest_side_is_the_v05_size():
    assert bbox_condition((2.0, 1.0, 0.5), 1.925).tolist() == pytest.approx([1.925, 0.9625, 0.48125])
    assert bbox_condition(None, 1.925).tolist() == [0.0, 0.0, 0.0]


def test_asset_vector_layout():
    v = asset_vector(CHAIR, 1.925)
    assert v.shape == (ASSET_VECTOR_DIM,) and v[3] == 1.0                       # has a bbox
    assert v[4:20].sum() == 1.0 and v[20:36].sum() == 1.0                        # category and style one-hot
    assert v[36].item() == pytest.approx(torch.log1p(torch.tensor(120.0)).item()) and v[-1] == 1.0
    assert torch.equal(asset_vector(None, 1.925), torch.zeros(ASSET_VECTOR_DIM))
    assert torch.equal(asset_vector(CHAIR, 1.925), v)                            # stable hashing


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine("tiny", None, mode="eager", batch_buckets=(1, 4), init_std=0.1, seed=3)


def test_zero_projection_leaves_the_released_tokens_unchanged_until_trained(engine, tmp_path):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    text = torch.randn(2, engine.cfg.text_tokens, engine.cfg.text_model_embed_dim, generator=gen)
    bbox = torch.stack([bbox_condition(CHAIR.bbox, 1.925), torch.zeros(3)])
    released = engine.condition(text, bbox)
    proj = AssetProjection(engine.cfg.n_embd)
    with torch.no_grad():
        ours = released + proj(torch.stack([asset_vector(CHAIR, 1.925), asset_vector(None, 1.925)])).unsqueeze(1)
    assert torch.equal(ours, released)
    assert torch.equal(engine.generate(ours[:1], released[1:]), engine.generate(released[:1], released[1:]))

    trained = {"asset_proj.weight": torch.randn(engine.cfg.n_embd, ASSET_VECTOR_DIM, generator=gen),
               "asset_proj.bias": torch.zeros(engine.cfg.n_embd)}
    save_file(trained, str(tmp_path / "assets.safetensors"))
    proj.load(tmp_path / "assets.safetensors")
    with torch.no_grad():
        assert not torch.equal(released + proj(asset_vector(CHAIR, 1.925)[None]).unsqueeze(1), released[:1])


def test_fetcher_without_a_store_falls_back_and_counts():
    fetcher = AssetFeatureFetcher(None)
    found = fetcher.fetch(["a1", "a2"])
    assert [f.fallback for f in found] == ["store_unavailable"] * 2 and found[0].bbox is None
    assert fetcher.fallbacks["store_unavailable"] == 2


def test_unreadable_registry_is_a_fallback_not_a_failure():
    def broken():
        raise RuntimeError("registry at sqlite:///nowhere.db cannot be read")

    fetcher = AssetFeatureFetcher(broken)
    assert fetcher.fetch(["a1"])[0].fallback == "store_unavailable"


def test_text_encoder_loads_a_local_folder_only(tmp_path):
    model, tokenizer = random_clip(["a", "wooden", "chair"], width=16, layers=1, max_length=5)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = TextEncoder.from_path(tmp_path, 5, torch.device("cpu"), torch.float32)
    direct = TextEncoder(model, tokenizer, 5, torch.device("cpu"), torch.float32)
    assert torch.equal(loaded.encode(["a wooden chair"]), direct.encode(["a wooden chair"]))
    assert loaded.encode(["a wooden chair", "a"]).shape == (2, 5, 16)
    assert loaded.empty() is loaded.empty()                                     # computed once
    with pytest.raises(TextEncoderError, match="nothing is downloaded at run time"):
        TextEncoder.from_path(tmp_path / "missing", 5, torch.device("cpu"), torch.float32)


def test_per_request_seeds_sample_the_same_tokens_alone_or_batched(engine):
    gen = torch.Generator().manual_seed(4)
    text = torch.randn(4, engine.cfg.text_tokens, engine.cfg.text_model_embed_dim, generator=gen)
    cond = engine.condition(text[:3], torch.rand(3, 3, generator=gen))
    uncond = engine.condition(text[3:], torch.zeros(1, 3))
    together = engine.generate(cond, uncond, top_p=0.9, seed=[11, 12, 13])
    alone = [engine.generate(cond[i:i + 1], uncond, top_p=0.9, seed=[s]) for i, s in enumerate([11, 12, 13])]
    assert torch.equal(together, torch.cat(alone))
    assert torch.equal(alone[1], engine.generate(cond[1:2], uncond, top_p=0.9, seed=12))   # int seed, same draw
    assert not torch.equal(together[0], engine.generate(cond[:1], uncond, top_p=0.9, seed=[99])[0])
