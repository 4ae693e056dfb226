"""One exception hierarchy for the Cube 3D inference package; each class builds its own message."""

from __future__ import annotations

from typing import Iterable

from common.errors import FeaturectlError


class Cube3DError(FeaturectlError):
    """Base class of every error raised by `inference`."""


class UnknownConfigError(Cube3DError, ValueError):
    """A named configuration that does not exist."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        self.name = name
        names = ", ".join(f"`{v}`" for v in valid)
        super().__init__(f"unknown {kind} config `{name}`; valid names: {names}")


class InvalidConfigError(Cube3DError, ValueError):
    """Sizes no decoder can have (heads that do not divide the width, an odd head dimension for RoPE)."""


class CheckpointError(Cube3DError, ValueError):
    """A checkpoint whose parameter names or shapes differ from what the model expects."""

    def __init__(self, path: str, missing: list[str], unexpected: list[str], mismatched: list[str]):
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", mismatched)):
            if items:
                shown = ", ".join(items[:5]) + (f" (+{len(items) - 5} more)" if len(items) > 5 else "")
                parts.append(f"{len(items)} {label}: {shown}")
        super().__init__(f"checkpoint `{path}` does not match the model ({'; '.join(parts)}); "
                         "check that the config (v0.1, v0.5, tiny) matches the checkpoint")


class GenerationError(Cube3DError, ValueError):
    """A generation request the engine cannot serve as given."""


class MeshError(Cube3DError):
    """Occupancy that yields no surface, or a mesh that cannot be written."""
