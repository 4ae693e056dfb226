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
