"""Choose the fast path's launch parameters on the current GPU by timing whole decode steps in context.

`featurectl bench cube3d --tune` runs this before measuring and applies the choices in-process; the tables in
`inference.triton_ops` (GEMV_TABLE, ATTN_TABLE) hold what it chose on an H200. Isolated kernel timings were tried
first and misled (a kernel that wins alone can lose inside the step), so only whole-step graph replays decide.
"""

from __future__ import annotations

import logging

from torch import Tensor

from inference import triton_ops as T

log = logging.getLogger(__name__)


# ---- in context: whole decode steps, one factor at a time --------------------------------------------------------
# options tried per factor against the tables as they are (`_current`); GEMV entries are (BLOCK_N, BLOCK_K, warps,
# stages, splits) or None (cuBLAS); attention entries (BLOCK_N, warps, stages, waves)
FACTORS: dict[str, list] = {
    "qkv": [None, (64, 128, 4, 5, 1), (32, 128, 4, 3, 3), (32, 128, 4, 3, 2)],
    "proj": [(16, 512, 4, 3, 1), (32, 128, 4, 3, 6), (32, 256, 4, 3, 2), None],
    "down": [None, (32, 128, 4, 4, 8), (32, 256, 4, 4, 4), (16, 512, 4, 3, 2)],
    "attn": [(32, 4, 2, 4), (128, 4, 2, 2), (64, 4, 2, 4), (32, 4, 2, 8), (128, 4, 3, 8), (64, 4, 3, 8)],
    "fuse": [False, True],
}
BUCKETS = (2, 16)


def _gemv_keys(cfg) -> dict[str, tuple[int, int, int]]:
    d, f = cfg.n_embd, cfg.mlp_hidden
    return {"qkv": (T.PARTIAL, 3 * d, d), "proj": (T.PARTIAL, d, d), "down": (T.PARTIAL, d, f)}


def _current(cfg) -> dict:
    """The launch parameters in use now (the committed tables, or the heuristic where a shape has no entry): the
    baseline, so that tuning can only keep or beat what the tables already hold."""
    setting = {name: {b: T.gemv_config(epi, b, n, k) for b in BUCKETS}
               for name, (epi, n, k) in _gemv_keys(cfg).items()}
    setting["attn"] = {b: T.ATTN_TABLE.get(b, T.ATTN_DEFAULT) for b in BUCKETS}
    setting["fuse"] = {b: T.FUSE_COMBINE for b in BUCKETS}
    return setting


def _set(cfg, setting: dict) -> None:
    for name, (epi, n, k) in _gemv_keys(cfg).items():
        for bucket in BUCKETS:
            T.GEMV_TABLE[(epi, n, k, bucket)] = setting[name][bucket]
    T.ATTN_TABLE[2], T.ATTN_TABLE[16] = setting["attn"][2], setting["attn"][16]
    T.FUSE_COMBINE = setting["fuse"][2]


def _measure(engine, cond: Tensor, uncond: Tensor, setting: dict, positions: tuple[int, ...]) -> tuple[float, float]:
    """Mean graph-replayed step time (ms) at `positions`, for one prompt (rows 2) and for eight (rows 16)."""
    _set(engine.cfg, setting)
    engine.set_mode("fast")
    out = []
    for prompts in (1, cond.shape[0]):
        engine.generate(cond[:prompts], uncond, n_tokens=8)              # capture this bucket's graphs
        out.append(1e3 * sum(engine.time_step(p, prompts, repeats=11) for p in positions) / len(positions))
    return out[0], out[1]


def tune_in_context(engine, cond: Tensor, uncond: Tensor, positions: tuple[int, ...] = (100, 300, 500)) -> dict:
    """Choose each factor's option by the whole step's time, separately for rows 2 and rows 16, then measure the
    combination; leaves the chosen tables applied (this process) and returns what was measured."""
    base = _current(engine.cfg)
    t_base = _measure(engine, cond, uncond, base, positions)
    report: dict = {"base": t_base}
    best = {name: {b: (t, base[name][b]) for b, t in zip(BUCKETS, t_base)} for name in FACTORS}
    for name, opts in FACTORS.items():
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
    chosen = {name: {b: best[name][b][1] for b in BUCKETS} for name in FACTORS}
    report["chosen"] = {name: {str(b): v for b, v in c.items()} for name, c in chosen.items()}
    report["chosen_ms"] = _measure(engine, cond, uncond, chosen, positions)
    if sum(report["chosen_ms"]) > sum(t_base):          # interactions made it worse: keep the baseline
        _set(engine.cfg, base)
        report["kept"] = "base"
    log.info("in-context tuning: base %s, chosen %s -> %s", t_base, report["chosen"], report["chosen_ms"])
    return report
