"""A decoder checkpoint checked before it is registered: readable to its last byte, the Cube 3D config it claims,
and exactly the parameter names and shapes of that config. Nothing is loaded onto a device."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.checkpoint import check_names, expected_shapes
from inference.config import CUBE3D_CONFIGS, Cube3DConfig
from inference.errors import Cube3DError

CONFIG_KEY = "cube3d_config"  # the safetensors metadata key naming the config (`v0.1`, `v0.5`, `tiny`)
_CHUNK = 8 << 20


class CheckpointRefusedError(Cube3DError):
    """A checkpoint that cannot be registered: unreadable, truncated, without a config, or of another shape."""


@dataclass(frozen=True)
class VerifiedCheckpoint:
    path: Path
    config: str            # a name of CUBE3D_CONFIGS
    sha256: str            # of the whole file: the server refuses the version if the file changes afterwards
    tensors: int
    size_bytes: int


def decoder_shapes(config: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the decoder of a named config, from a model built on the meta device (no memory)."""
    from inference.model import Cube3DDecoder

    with torch.device("meta"):
        return expected_shapes(Cube3DDecoder(Cube3DConfig.from_name(config)))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _header(path: Path) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """The metadata and tensor shapes of a safetensors file; the library refuses a file its header does not cover
    to the last byte, so a truncated copy fails here."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return f.metadata() or {}, {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as exc:
        raise CheckpointRefusedError(f"`{path}` is not a readable safetensors checkpoint ({exc}); a truncated "
                                     "copy or another format: copy the file again or save it with "
                                     "safetensors.torch.save_file") from None


def verify_checkpoint(path: str | Path, config: str | None = None) -> VerifiedCheckpoint:
    """The checkpoint at `path` checked against the config it claims (metadata `cube3d_config`) or `config`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointRefusedError(f"no checkpoint file at `{path}`: give the decoder's .safetensors file")
    metadata, have = _header(path)
    claimed = metadata.get(CONFIG_KEY)
    if config and claimed and config != claimed:
        raise CheckpointRefusedError(f"`{path}` says it is a `{claimed}` checkpoint but `--config {config}` was "
                                     "given: leave out --config or give the matching one")
    name = config or claimed
    if not name:
        raise CheckpointRefusedError(f"`{path}` does not say which Cube 3D config it is (no `{CONFIG_KEY}` in its "
                                     f"metadata): pass --config with one of {', '.join(CUBE3D_CONFIGS)}")
    check_names(str(path), decoder_shapes(name), have)
    return VerifiedCheckpoint(path.resolve(), name, file_sha256(path), len(have), path.stat().st_size)
