"""Fixtures for the Cube 3D tests: the shared test vectors (shared/cube3d/ beside or inside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _shared_dir() -> Path | None:
    candidates = [os.environ.get("CUBE3D_SHARED"), REPO.parent / "shared" / "cube3d", REPO / "shared" / "cube3d"]
    for c in candidates:
        if c and (Path(c) / "tiny_reference.safetensors").exists():
            return Path(c)
    return None


@pytest.fixture(scope="session")
def shared_cube3d() -> Path:
    path = _shared_dir()
    if path is None:
        pytest.fail("shared/cube3d test vectors not found beside or inside the checkout: "
                    "set CUBE3D_SHARED to the folder holding tiny_reference.safetensors")
    return path


@pytest.fixture(scope="session")
def tiny_reference(shared_cube3d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(shared_cube3d / "tiny_reference.safetensors"))
