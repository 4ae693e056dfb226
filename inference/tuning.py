"""Choose the fast path's launch parameters on the current GPU by timing whole decode steps in context.

`featurectl bench cube3d --tune` runs this before measuring and leaves the choice on the engine (its `Launch`);
the defaults in `inference.triton_ops` (H200_GEMV, H200_ATTN) hold what it chose on an H200. Isolated kernel timings
were tried first and misled (a kernel that wins alone can lose inside the step), so only whole-step graph replays
decide.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import Tensor

from inference import triton_ops as T

log = logging.getLogger(__name__)


# ---- in context: whole decode steps, one factor at a time --------------------------------------------------------
# options tried per factor against the tables as they are (`_current`); GEMV entries are (BLOCK_N, BLOCK_K, warps,
# stages, splits) or None (cuBLAS); attention entries (BLOCK_N, warps, stages, waves)
FACTORS: dict[str, list] = {
    "qkv": [None, (64, 128, 4, 5, 1), (32, 128, 4, 3, 3), (32, 128, 4, 3, 2)],
    "proj": [(16, 512, 4, 3, 1), (32, 128, 4, 3, 6), (32, 256, 4, 3, 2), (16, 256, 4, 3, 3), None],
    "down": [None, (32, 128, 4, 4, 8), (32, 256, 4, 4, 4), (32, 256, 4, 3, 4), (16, 512, 4, 3, 2)],
    "gu": [(32, 128, 4, 4, 1), (32, 64, 4, 6, 1), (64, 128, 8, 3, 1), (64, 256, 4, 3, 1)],
    "attn": [(32, 4, 2, 4), (128, 4, 2, 2), (64, 4, 2, 4), (64, 2, 2, 4), (32, 4, 2, 8), (128, 4, 3, 8),
             (64, 4, 3, 8)],
    "fuse": [False, True],
}
# weight-only FP8 (`inference.fp8`): a tile of BLOCK_K FP8 weights is half the bytes of a bf16 one, so wider K
# blocks (and gate/up, whose SwiGLU epilogue takes no K splits) are tried; attention is the same as in bf16
FP8_FACTORS: dict[str, list] = {
    "qkv": [(32, 256, 4, 3, 3), (32, 512, 4, 3, 3), (64, 256, 4, 3, 2), (32, 256, 4, 4, 6)],
    "proj": [(32, 256, 4, 3, 6), (32, 512, 4, 3, 3), (16, 512, 4, 3, 3), (32, 256, 4, 3, 3)],
    "down": [(32, 512, 4, 4, 4), (32, 256, 4, 4, 8), (32, 512, 4, 4, 6), (16, 512, 4, 4, 4)],
    "gu": [(32, 256, 4, 4, 1), (64, 256, 4, 3, 1), (32, 512, 4, 3, 1), (16, 512, 4, 4, 1)],
}
BUCKETS = (2, 16)


def _gemv_keys(cfg) -> dict[str, tuple[int, int, int]]:
    d, f = cfg.n_embd, cfg.mlp_hidden
    return {"qkv": (T.PARTIAL, 3 * d, d), "proj": (T.PARTIAL, d, d), "down": (T.PARTIAL, d, f),
            "gu": (T.SWIGLU, f, d)}


def _current(cfg, launch: T.Launch, sms: int) -> dict:
    """The launch parameters in use now (the tables, or the heuristic for a chip of `sms` multiprocessors where a
    shape has no entry): the baseline, so that tuning can only keep or beat what the tables already hold."""
    setting = {name: {b: launch.gemv_config(epi, b, n, k, sms) for b in BUCKETS}
               for name, (epi, n, k) in _gemv_keys(cfg).items()}
    setting["attn"] = {b: launch.attn_config(b) for b in BUCKETS}
    setting["fuse"] = {b: launch.fuse_combine for b in BUCKETS}
    return setting


def _applied(cfg, launch: T.Launch, setting: dict) -> T.Launch:
    """`launch` with `setting`'s choices (a new value; `launch` is left as it was)."""
    gemv = dict(launch.gemv)
    for name, (epi, n, k) in _gemv_keys(cfg).items():
        for bucket in BUCKETS:
            gemv[(epi, n, k, bucket)] = setting[name][bucket]
    return dataclasses.replace(launch, gemv=gemv, attn={b: setting["attn"][b] for b in BUCKETS},
                               fuse_combine=setting["fuse"][2])


def _measure(engine, cond: Tensor, uncond: Tensor, setting: dict, positions: tuple[int, ...]) -> tuple[float, float]:
    """Mean graph-replayed step time (ms) at `positions`, for one prompt (rows 2) and for eight (rows 16)."""
    engine.launch = _applied(engine.cfg, engine.launch or T.Launch(), setting)
    engine.set_mode("fast")
    out = []
    for prompts in (1, cond.shape[0]):
        engine.generate(cond[:prompts], uncond, n_tokens=8)              # capture this bucket's graphs
        out.append(1e3 * sum(engine.time_step(p, prompts, repeats=11) for p in positions) / len(positions))
    return out[0], out[1]


def tune_in_context(engine, cond: Tensor, uncond: Tensor, positions: tuple[int, ...] = (100, 300, 500),
                    factors: dict[str, list] = FACTORS) -> dict:
    """Choose each factor's option by the whole step's time, separately for rows 2 and rows 16, then measure the
    combination; leaves the chosen launch on the engine and returns what was measured. Settings that `factors`
    does not name stay as the tables have them."""
    base = _current(engine.cfg, engine.launch or T.Launch(), T.sm_count(engine.device))
    t_base = _measure(engine, cond, uncond, base, positions)
    report: dict = {"base": t_base}
    best = {name: {b: (t, base[name][b]) for b, t in zip(BUCKETS, t_base)} for name in factors}
    for name, opts in factors.items():
        for opt in opts:
            if all(opt == base[name][b] for b in BUCKETS):
                continue
            setting = dict(base, **{name: {2: opt, 16: opt}})
            try:
                t2, t16 = _measure(engine, cond, uncond, setting, positions)
            except Exception as exc:  # an option that does not compile or fit is skipped
                log.warning("%s=%s failed: %s", name, opt, exc)
                continue
            report[f"{name}={opt}"] = (round(t2, 4), round(t16, 4))
            log.info("%s=%s: rows 2 %.4f ms, rows 16 %.4f ms (base %.4f, %.4f)", name, opt, t2, t16, *t_base)
            for bucket, t in zip(BUCKETS, (t2, t16)):
                if t < best[name][bucket][0]:
                    best[name][bucket] = (t, opt)
    chosen = dict(base, **{name: {b: best[name][b][1] for b in BUCKETS} for name in factors})
    report["chosen"] = {name: {str(b): v for b, v in chosen[name].items()} for name in factors}
    report["chosen_ms"] = _measure(engine, cond, uncond, chosen, positions)
    if sum(report["chosen_ms"]) > sum(t_base):          # interactions made it worse: keep the baseline
        engine.launch = _applied(engine.cfg, engine.launch, base)
        engine.set_mode("fast")
        report["kept"] = "base"
    log.info("in-context tuning: base %s, chosen %s -> %s", t_base, report["chosen"], report["chosen_ms"])
    return report
