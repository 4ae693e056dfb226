"""Tokens to mesh on the CPU with a tiny tokenizer; marching cubes and export on known fields."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inference.errors import MeshError
from inference.mesh import Mesh, ShapeDecoder, grid_points, marching_cubes


def test_grid_points_span_the_bounds_in_ij_order():
    pts = grid_points(2, 1.05, 0, 5 ** 3, torch.device("cpu"))
    assert pts.shape == (125, 3)
    assert torch.allclose(pts[0], torch.tensor([-1.05] * 3)) and torch.allclose(pts[-1], torch.tensor([1.05] * 3))
    assert torch.allclose(pts[1], torch.tensor([-1.05, -1.05, -0.525]))          # last axis moves fastest
    assert torch.equal(grid_points(2, 1.05, 60, 10, torch.device("cpu")), pts[60:70])


def test_marching_cubes_of_a_sphere():
    g = 33
    ax = np.linspace(-1.05, 1.05, g, dtype=np.float32)
    x, y, z = np.meshgrid(ax, ax, ax, indexing="ij")
    verts, faces = marching_cubes(0.5 - np.sqrt(x * x + y * y + z * z), 1.05)
    radius = np.linalg.norm(verts + 1.05 / g, axis=1)                           # the released scaling: / G
    assert faces.shape[1] == 3 and faces.max() < len(verts)
    assert abs(np.median(radius) - 0.5) < 0.05


def test_empty_volume_is_an_error():
    with pytest.raises(MeshError, match="no zero crossing"):
        marching_cubes(np.ones((9, 9, 9), dtype=np.float32), 1.05)


def test_tiny_tokens_to_glb_and_obj(tmp_path):
    trimesh = pytest.importorskip("trimesh")
    dec = ShapeDecoder("tiny", None, init_std=0.3, seed=1)
    ids = torch.randint(0, dec.cfg.num_codes, (dec.cfg.num_latents,), generator=torch.Generator().manual_seed(0))
    grid = dec.occupancy_grid(ids, resolution=4)
    assert grid.shape == (17, 17, 17) and torch.isfinite(grid).all()
    with torch.no_grad():                                    # random weights: put the zero level inside the volume
        dec.model.occupancy_decoder.c_head.bias -= grid.median()
    mesh = dec.decode_mesh(ids, resolution=4)
    assert len(mesh.faces) > 0 and {"latents", "occupancy", "to_host", "marching_cubes"} <= set(mesh.stages)
    for suffix in ("glb", "obj"):
        path = mesh.export(tmp_path / f"object.{suffix}")
        loaded = trimesh.load(path, force="mesh")
        assert len(loaded.faces) == len(mesh.faces)
        assert f"export_{suffix}" in mesh.stages


def test_unsupported_mesh_suffix(tmp_path):
    mesh = Mesh(np.zeros((3, 3), np.float32), np.array([[0, 1, 2]]))
    with pytest.raises(MeshError, match="use a `.glb` or `.obj` suffix"):
        mesh.export(tmp_path / "object.stl")


def test_codebook_feeds_the_decoder_embedding():
    from inference.engine import Engine

    dec = ShapeDecoder("tiny", None, init_std=0.3)
    engine = Engine("tiny", None, codebook=dec.codebook(), init_std=0.1)
    with torch.no_grad():
        want = engine.model.shape_proj(dec.codebook())
    assert torch.allclose(engine.model.transformer.wte.weight[: dec.cfg.num_codes], want)


def test_tokenizer_checkpoint_loads_strictly_and_skips_the_encoder(tmp_path):
    from safetensors.torch import save_file

    from inference.errors import CheckpointError

    src = ShapeDecoder("tiny", None, init_std=0.3, seed=2)
    tensors = {k: v.contiguous() for k, v in src.model.state_dict().items()}
    tensors["encoder.query"] = torch.zeros(13, 32)                  # the released file also holds the encoder
    tensors["embedder.weight"] = tensors["occupancy_decoder.embedder.weight"].clone()
    path = tmp_path / "shape.safetensors"
    save_file(tensors, str(path))
    loaded = ShapeDecoder("tiny", path)
    assert torch.equal(loaded.codebook(), src.codebook())
    tensors["decoder.extra"] = torch.zeros(1)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="1 unexpected: decoder.extra"):
        ShapeDecoder("tiny", path)
