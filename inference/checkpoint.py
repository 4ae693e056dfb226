"""Loading safetensors checkpoints under the released parameter names, strictly, tensor by tensor."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterable, Mapping

import torch
from torch import Tensor, nn

from inference.errors import CheckpointError

log = logging.getLogger(__name__)


def expected_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every persistent parameter and buffer name of `module` with its shape."""
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def released_shapes(path: str | Path, version: str) -> dict[str, tuple[int, ...]]:
    """The names and shapes listed in a `*_state_dict_shapes.json` file (tests/data/cube3d/) for one version."""
    table = json.loads(Path(path).read_text())
    return {k: tuple(v) for k, v in table[version].items()}


def check_names(path: str, want: Mapping[str, tuple[int, ...]], have: Mapping[str, tuple[int, ...]]) -> None:
    """Raise `CheckpointError` unless `have` holds exactly the names of `want`, with the same shapes."""
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    mismatched = sorted(f"{k} {list(have[k])} != {list(want[k])}" for k in set(want) & set(have)
                        if tuple(have[k]) != tuple(want[k]))
    if missing or unexpected or mismatched:
        raise CheckpointError(path, missing, unexpected, mismatched)


def _selected(keys: Iterable[str], prefix: str, ignore: tuple[str, ...]) -> dict[str, str]:
    """Checkpoint key -> model name, for keys under `prefix` that no `ignore` prefix covers."""
    out = {}
    for key in keys:
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if ignore and name.startswith(ignore):
            continue
        out[key] = name
    return out


@torch.no_grad()
def load_safetensors(module: nn.Module, path: str | Path, prefix: str = "", ignore: tuple[str, ...] = ()) -> None:
    """Copy every tensor of a safetensors file into `module`, casting to the parameter's dtype and device.

    Keys outside `prefix` are skipped (e.g. a test vector's `input.*` / `expected.*`); keys under one of the
    `ignore` prefixes too (e.g. the shape tokenizer's encoder, which generation does not need). Everything else must
    match the module's names and shapes exactly, checked from the file's header before any tensor is read.
    """
    from safetensors import safe_open

    state = module.state_dict()
    with safe_open(str(path), framework="pt", device="cpu") as f:
        names = _selected(f.keys(), prefix, ignore)
        have = {name: tuple(f.get_slice(key).get_shape()) for key, name in names.items()}
        check_names(str(path), expected_shapes(module), have)
        for key, name in names.items():
            state[name].copy_(f.get_tensor(key))
    log.info("loaded %d tensors from %s", len(names), path)


@torch.no_grad()
def load_state_dict_strict(module: nn.Module, tensors: Mapping[str, Tensor], source: str = "state dict") -> None:
    """Like `load_safetensors` for tensors already in memory."""
    check_names(source, expected_shapes(module), {k: tuple(v.shape) for k, v in tensors.items()})
    state = module.state_dict()
    for name, value in tensors.items():
        state[name].copy_(value)


@torch.no_grad()
def init_random_(module: nn.Module, std: float = 0.02, seed: int = 0) -> None:
    """Small random weights for speed runs: normal(0, std) matrices, zero biases, unit 1-d weights (norms)."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in module.named_parameters():
        if p.ndim == 1:
            p.fill_(1.0 if name.endswith("weight") else 0.0)
        else:
            p.normal_(0.0, std, generator=gen)
