"""Fixtures for the Cube 3D tests: the test vectors and checkpoint layouts in tests/data/cube3d/ (copied from the
model facts, see FACTS.md there), so a clone passes its tests with nothing beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

CUBE3D_DATA = Path(__file__).resolve().parents[1] / "data" / "cube3d"


@pytest.fixture(scope="session")
def cube3d_data() -> Path:
    return CUBE3D_DATA


@pytest.fixture(scope="session")
def tiny_reference(cube3d_data: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(cube3d_data / "tiny_reference.safetensors"))


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> list[Path]:
    """Two decoder checkpoints of the tiny config (random weights, seeds 0 and 1), naming their config in their
    metadata as `featurectl models register` reads it: two versions of a model that answer differently."""
    import torch
    from safetensors.torch import save_file

    from inference.config import Cube3DConfig
    from inference.engine import build_decoder

    folder = tmp_path_factory.mktemp("checkpoints")
    paths = []
    for seed in (0, 1):
        model = build_decoder(Cube3DConfig.from_name("tiny"), None, torch.device("cpu"), torch.float32, seed=seed,
                              init_std=0.1)
        path = folder / f"tiny_seed{seed}.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
                  metadata={"cube3d_config": "tiny"})
        paths.append(path)
    return paths
