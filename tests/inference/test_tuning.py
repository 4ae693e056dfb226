"""`bench cube3d --tune` starts from the launch parameters in use, so it can only keep or beat the tables; the
parameters are the engine's own value, never module state."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_tuning_baseline_is_the_launch_in_use_and_applying_it_changes_nothing():
    from inference import triton_ops as T
    from inference import tuning
    from inference.config import Cube3DConfig

    cfg = Cube3DConfig.from_name("v0.1")
    launch = T.Launch()
    current = tuning._current(cfg, launch, 132)
    assert current["qkv"] == {b: T.H200_GEMV[(T.PARTIAL, 3 * cfg.n_embd, cfg.n_embd, b)] for b in (2, 16)}
    assert current["attn"] == {2: T.H200_ATTN[2], 16: T.H200_ATTN[16]}
    assert tuning._applied(cfg, launch, current) == launch

    changed = tuning._applied(cfg, launch, dict(current, attn={2: (32, 4, 2, 8), 16: (32, 4, 2, 8)}))
    assert changed.attn_config(1) == (32, 4, 2, 8) and launch.attn_config(1) == T.H200_ATTN[2]
    assert T.Launch().attn == T.H200_ATTN, "a tuned value leaves the defaults as they were"

    tiny = Cube3DConfig.from_name("tiny")  # shapes the tables do not hold: the heuristic is the baseline
    assert tuning._current(tiny, launch, 132)["down"][2] == launch.gemv_config(T.PARTIAL, 2, tiny.n_embd,
                                                                               tiny.mlp_hidden, 132)
