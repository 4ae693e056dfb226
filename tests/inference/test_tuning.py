"""`bench cube3d --tune` starts from the launch parameters in use, so it can only keep or beat the tables."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_tuning_baseline_is_the_tables_in_use_and_setting_it_changes_nothing():
    from inference import triton_ops as T
    from inference import tuning
    from inference.config import Cube3DConfig

    cfg = Cube3DConfig.from_name("v0.1")
    before = (dict(T.GEMV_TABLE), dict(T.ATTN_TABLE), T.FUSE_COMBINE)
    current = tuning._current(cfg)
    assert current["qkv"] == {b: T.GEMV_TABLE[(T.PARTIAL, 3 * cfg.n_embd, cfg.n_embd, b)] for b in (2, 16)}
    assert current["attn"] == {2: T.ATTN_TABLE[2], 16: T.ATTN_TABLE[16]}
    tuning._set(cfg, current)
    assert (dict(T.GEMV_TABLE), dict(T.ATTN_TABLE), T.FUSE_COMBINE) == before

    tiny = Cube3DConfig.from_name("tiny")  # shapes the tables do not hold: the heuristic is the baseline
    assert tuning._current(tiny)["down"][2] == T.gemv_config(T.PARTIAL, 2, tiny.n_embd, tiny.mlp_hidden)
