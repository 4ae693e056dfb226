"""The decoder computes the released model's function: names, shapes and the reference test vector."""

from __future__ import annotations

import json

import pytest
import torch

from inference.checkpoint import check_names, expected_shapes, load_safetensors, released_shapes
from inference.config import Cube3DConfig, ShapeTokenizerConfig
from inference.engine import Engine
from inference.errors import CheckpointError, UnknownConfigError
from inference.mesh import ENCODER_PREFIXES
from inference.model import Cube3DDecoder
from inference.shape_tokenizer import ShapeTokenizer


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("version,params", [("v0.1", 1_793_525_376), ("v0.5", 1_793_531_520)])
def test_released_names_and_shapes(cube3d_data, version, params):
    with torch.device("meta"):
        model = Cube3DDecoder(Cube3DConfig.from_name(version))
    check_names(version, released_shapes(cube3d_data / "gpt_state_dict_shapes.json", version), expected_shapes(model))
    assert sum(p.numel() for p in model.parameters()) == params


def test_shape_tokenizer_names_are_the_released_generation_parts(cube3d_data):
    want = released_shapes(cube3d_data / "shape_tokenizer_state_dict_shapes.json", "v0.1")
    with torch.device("meta"):
        model = ShapeTokenizer(ShapeTokenizerConfig.from_name("v0.1"))
    check_names("v0.1", {k: v for k, v in want.items() if not k.startswith(ENCODER_PREFIXES)}, expected_shapes(model))


def test_tiny_config_matches_the_reference_json(cube3d_data):
    ref = json.loads((cube3d_data / "tiny_reference.json").read_text())
    cfg = Cube3DConfig.from_name("tiny")
    for key in ("n_layer", "n_single_layer", "n_head", "n_embd", "shape_model_vocab_size", "text_model_embed_dim",
                "shape_model_embed_dim", "use_bbox", "bos_id", "eos_id", "padding_id", "n_generated"):
        assert getattr(cfg, key) == ref[key], key
    assert cfg.eps == ref["eps"] and cfg.guidance_scale == ref["guidance_scale"]


@pytest.fixture(scope="module")
def tiny_model(cube3d_data) -> Cube3DDecoder:
    model = Cube3DDecoder(Cube3DConfig.from_name("tiny")).eval()
    load_safetensors(model, cube3d_data / "tiny_reference.safetensors", prefix="model.")
    return model


@torch.no_grad()
def test_condition_tokens(tiny_model, tiny_reference):
    cond = tiny_model.condition(tiny_reference["input.text_embed"], tiny_reference["input.bbox"])
    assert _rel(cond, tiny_reference["expected.cond"]) < 1e-6


@torch.no_grad()
def test_teacher_forced_logits(tiny_model, tiny_reference):
    x = tiny_model.embed(tiny_reference["input.token_ids"])
    logits = tiny_model(tiny_reference["expected.cond"], x)
    assert _rel(logits, tiny_reference["expected.teacher_forced_logits"]) < 1e-4


@pytest.mark.parametrize("mode", ["eager", "nocache"])
def test_greedy_guided_ids(cube3d_data, tiny_reference, mode):
    engine = Engine("tiny", cube3d_data / "tiny_reference.safetensors", weights_prefix="model.", mode=mode)
    cond = tiny_reference["expected.cond"]
    ids = engine.generate(cond[0:1], cond[1:2])
    assert torch.equal(ids, tiny_reference["expected.greedy_cfg_ids"])


def test_unknown_config_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown cube3d config `v9`.*`v0.1`, `v0.5`, `tiny`"):
        Cube3DConfig.from_name("v9")
    with pytest.raises(UnknownConfigError, match="shape tokenizer"):
        ShapeTokenizerConfig.from_name("big")


def test_checkpoint_for_another_config_is_refused(cube3d_data):
    with torch.device("meta"):
        model = Cube3DDecoder(Cube3DConfig.from_name("v0.1"))
    with pytest.raises(CheckpointError, match="wrong shape") as err:
        load_safetensors(model, cube3d_data / "tiny_reference.safetensors", prefix="model.")
    assert "transformer.wte.weight" in " ".join(err.value.mismatched)
    assert any(k.startswith("transformer.dual_blocks.2.") for k in err.value.missing)
