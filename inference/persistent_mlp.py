"""One layer's MLP half as one persistent Triton launch (issue 21's experiment, not on the engine's path).

The engine runs residual + LayerNorm, gate/up + SwiGLU, down (split-K) and the next residual + LayerNorm as four
chained kernels; under PDL each boundary still drains one kernel's weight stream before the next starts. Here one
program per multiprocessor (at most) does all four, with grid-wide barriers in place of the boundaries, and each
program issues the loads of its first two weight chunks of the next phase before it waits at the barrier, so only
the small activation vector is read after it (each chunk's loads, weights and activations, go out two ahead). The
LayerNorm before gate/up is computed by every program (no barrier); program 0 does the last residual + LayerNorm
after the second barrier.

The barrier counter only grows (int64): a barrier's target is the next multiple of the grid size above the value a
program's arrival returned, so CUDA graph replays need no reset. Triton's CPU interpreter runs programs one after
another, where a grid barrier cannot work: there (`launches=(1, 2, 4)`) the three phases run as three launches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.triton_ops import _dot, _wait_previous, sm_count


@dataclass(frozen=True)
class MlpPlan:
    """Tiles of the persistent MLP half: every program gets the same number of gate/up and down tiles."""

    programs: int = 128
    gu_cols: int = 16       # gate (and as many up) columns a gate/up tile
    gu_k: int = 512         # K chunk a load of the gate/up tile
    down_cols: int = 16
    down_k: int = 512
    down_splits: int = 4    # split-K of down, summed in a fixed order by the last phase
    warps: int = 8
    dot: bool = True        # tl.dot (rows padded to 16) or multiply-adds on the CUDA cores
    stages: int = 0         # 0: loads two chunks ahead by hand (across the barriers); else Triton's pipeline depth

    def check(self, d: int, f: int, sms: int) -> None:
        """Raise ValueError where the tiles do not divide the shapes or the grid could outgrow the chip."""
        gu_tiles, down_tiles = f // self.gu_cols, (d // self.down_cols) * self.down_splits
        if self.programs > sms:
            raise ValueError(f"MlpPlan.programs {self.programs} exceeds the {sms} multiprocessors: a grid barrier "
                             "needs every program resident; use at most that many")
        if (f % self.gu_cols or d % self.gu_k or gu_tiles % self.programs or d % self.down_cols
                or f % (self.down_splits * self.down_k) or down_tiles % self.programs):
            raise ValueError(f"MlpPlan {self} does not tile D={d}, F={f} evenly over its programs; pick tile sizes "
                             "that divide the shapes and tile counts divisible by `programs`")


class MlpScratch:
    """Buffers of one MLP half for `rows` rows, allocated once (outside graph capture)."""

    def __init__(self, rows: int, d: int, f: int, plan: MlpPlan, dtype: torch.dtype, device: torch.device):
        self.h_own = torch.empty(plan.programs, rows, d, dtype=dtype, device=device)   # each program's LayerNorm
        self.act = torch.empty(rows, f, dtype=dtype, device=device)
        self.down_parts = torch.empty(plan.down_splits, rows, d, dtype=torch.float32, device=device)
        self.barrier = torch.zeros(1, dtype=torch.int64, device=device)


@triton.jit
def _grid_barrier(bar_ptr, NPROG: tl.constexpr, WAIT):
    # every program arrives; with WAIT it leaves once all NPROG have arrived (the counter only grows)
    tl.debug_barrier()
    seen = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
    if WAIT:
        target = ((seen + NPROG - 1) // NPROG) * NPROG
        while seen < target:
            seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _residual_ln(x_ptr, p_ptr, b_ptr, M, S, eps, D: tl.constexpr, M_PAD: tl.constexpr, D_PAD: tl.constexpr,
                 S_PAD: tl.constexpr, CG: tl.constexpr):
    # x + sum_s parts[s] + b rounded to x's dtype, and its LayerNorm (float32), as `_layer_norm_kernel` computes
    r = tl.arange(0, M_PAD)[:, None]
    c = tl.arange(0, D_PAD)[None, :]
    m = (r < M) & (c < D)
    sp = tl.arange(0, S_PAD)[:, None, None]
    pm = (sp < S) & m[None, :, :]
    if CG:      # written by other programs of this launch: past L1
        parts = tl.load(p_ptr + (sp * M + r[None]) * D + c[None], mask=pm, other=0.0, cache_modifier=".cg")
    else:
        parts = tl.load(p_ptr + (sp * M + r[None]) * D + c[None], mask=pm, other=0.0)
    y = tl.sum(parts.to(tl.float32), axis=0) + tl.load(b_ptr + c, mask=c < D, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + r * D + c, mask=m, other=0.0).to(tl.float32)
    xs = (x + y).to(x_ptr.dtype.element_ty)
    xf = xs.to(tl.float32)
    mean = tl.sum(xf, axis=1) / D
    xc = tl.where(m, xf - mean[:, None], 0.0)
    var = tl.sum(xc * xc, axis=1) / D
    return xs, xc / tl.sqrt(var + eps)[:, None], r * D + c, m


@triton.jit
def _mac(x, w, acc, DOT: tl.constexpr, IEEE: tl.constexpr):
    # acc += x w^T: tensor cores (x padded to 16 rows), or with DOT off one multiply-add a weight on the CUDA cores
    if DOT:
        return _dot(x, w, acc, IEEE)
    return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)


@triton.jit
def _gu_chunk(w_ptr, hs_ptr, it, pid, M, rows, mrow, D: tl.constexpr, F: tl.constexpr, GU_N: tl.constexpr,
              GU_K: tl.constexpr, NPROG: tl.constexpr, LOAD_X: tl.constexpr):
    # iteration `it` of a program's gate/up work (tile pid + (it // chunks) * NPROG, one K chunk): gate and up
    # weights, and with LOAD_X the program's LayerNorm chunk; nothing past the program's last iteration
    n_it: tl.constexpr = (F // GU_N // NPROG) * (D // GU_K)
    t = pid + (it // (D // GU_K)) * NPROG
    k0 = (it % (D // GU_K)) * GU_K
    ks = k0 + tl.arange(0, GU_K)
    wp = w_ptr + (t * GU_N + tl.arange(0, GU_N))[:, None] * D + ks[None, :]
    live = it < n_it
    h = tl.zeros([rows.shape[0], GU_K], hs_ptr.dtype.element_ty)
    if LOAD_X:
        h = tl.load(hs_ptr + (pid * M + rows[:, None]) * D + ks[None, :], mask=mrow[:, None] & live, other=0.0)
    return tl.load(wp, mask=live, other=0.0), tl.load(wp + F * D, mask=live, other=0.0), h


@triton.jit
def _down_chunk(w_ptr, act_ptr, it, pid, rows, mrow, D: tl.constexpr, F: tl.constexpr, DN_N: tl.constexpr,
                DN_K: tl.constexpr, DN_S: tl.constexpr, NPROG: tl.constexpr, LOAD_X: tl.constexpr):
    # iteration `it` of a program's down work: weights of (column block, split) of tile pid + (it // chunks) *
    # NPROG at one K chunk, and with LOAD_X that chunk of act (written by other programs: past L1)
    chunks: tl.constexpr = F // DN_S // DN_K
    n_it: tl.constexpr = (D // DN_N * DN_S // NPROG) * chunks
    t = pid + (it // chunks) * NPROG
    ks = (t // (D // DN_N)) * (F // DN_S) + (it % chunks) * DN_K + tl.arange(0, DN_K)
    cols = (t % (D // DN_N)) * DN_N + tl.arange(0, DN_N)
    live = it < n_it
    a = tl.zeros([rows.shape[0], DN_K], act_ptr.dtype.element_ty)
    if LOAD_X:
        a = tl.load(act_ptr + rows[:, None] * F + ks[None, :], mask=mrow[:, None] & live, other=0.0,
                    cache_modifier=".cg")
    return tl.load(w_ptr + cols[:, None] * F + ks[None, :], mask=live, other=0.0), a


@triton.jit
def _swiglu_store(acc_g, acc_u, b_ptr, act_ptr, it, pid, rows, mrow, D: tl.constexpr, F: tl.constexpr,
                  GU_N: tl.constexpr, GU_K: tl.constexpr, NPROG: tl.constexpr):
    # the tile that iteration `it` ends: biases, silu(gate) * up into act
    cols = (pid + (it // (D // GU_K)) * NPROG) * GU_N + tl.arange(0, GU_N)
    g = acc_g + tl.load(b_ptr + cols).to(tl.float32)[None, :]
    u = acc_u + tl.load(b_ptr + F + cols).to(tl.float32)[None, :]
    tl.store(act_ptr + rows[:, None] * F + cols[None, :], (g * tl.sigmoid(g) * u).to(act_ptr.dtype.element_ty),
             mask=mrow[:, None])


@triton.jit
def _gate_up(hs_ptr, w_ptr, b_ptr, act_ptr, wg0, wu0, wg1, wu1, pid, M, rows, mrow, D: tl.constexpr,
             F: tl.constexpr, GU_N: tl.constexpr, GU_K: tl.constexpr, NPROG: tl.constexpr, DOT: tl.constexpr,
             IEEE: tl.constexpr, STAGES: tl.constexpr):
    # this program's gate/up tiles, SwiGLU into act. STAGES 0: the weights of iterations 0 and 1 are already
    # loaded and each iteration issues the loads of the one two ahead (weights and LayerNorm chunk) before its own
    # product; else Triton's software pipeline over the iterations (the early loads unused)
    chunks: tl.constexpr = D // GU_K
    n_it: tl.constexpr = (F // GU_N // NPROG) * chunks
    acc_g = tl.zeros([rows.shape[0], GU_N], tl.float32)
    acc_u = tl.zeros([rows.shape[0], GU_N], tl.float32)
    if STAGES:
        for it in tl.range(n_it, num_stages=STAGES):
            wg, wu, h = _gu_chunk(w_ptr, hs_ptr, it, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, True)
            acc_g = _mac(h, wg, acc_g, DOT, IEEE)
            acc_u = _mac(h, wu, acc_u, DOT, IEEE)
            if it % chunks == chunks - 1:
                _swiglu_store(acc_g, acc_u, b_ptr, act_ptr, it, pid, rows, mrow, D, F, GU_N, GU_K, NPROG)
                acc_g = tl.zeros([rows.shape[0], GU_N], tl.float32)
                acc_u = tl.zeros([rows.shape[0], GU_N], tl.float32)
    else:
        _, _, h0 = _gu_chunk(w_ptr, hs_ptr, 0, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, True)
        _, _, h1 = _gu_chunk(w_ptr, hs_ptr, 1, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, True)
        for it in range(n_it):
            wg2, wu2, h2 = _gu_chunk(w_ptr, hs_ptr, it + 2, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, True)
            acc_g = _mac(h0, wg0, acc_g, DOT, IEEE)
            acc_u = _mac(h0, wu0, acc_u, DOT, IEEE)
            if it % chunks == chunks - 1:
                _swiglu_store(acc_g, acc_u, b_ptr, act_ptr, it, pid, rows, mrow, D, F, GU_N, GU_K, NPROG)
                acc_g = tl.zeros([rows.shape[0], GU_N], tl.float32)
                acc_u = tl.zeros([rows.shape[0], GU_N], tl.float32)
            wg0, wu0, h0, wg1, wu1, h1 = wg1, wu1, h1, wg2, wu2, h2


@triton.jit
def _down_store(acc, dp_ptr, it, pid, M, rows, mrow, D: tl.constexpr, F: tl.constexpr, DN_N: tl.constexpr,
                DN_K: tl.constexpr, DN_S: tl.constexpr, NPROG: tl.constexpr):
    # the tile that iteration `it` ends: its split's partial sums
    t = pid + (it // (F // DN_S // DN_K)) * NPROG
    cols = (t % (D // DN_N)) * DN_N + tl.arange(0, DN_N)
    tl.store(dp_ptr + ((t // (D // DN_N)) * M + rows[:, None]) * D + cols[None, :], acc, mask=mrow[:, None])


@triton.jit
def _down(act_ptr, w_ptr, dp_ptr, w0, w1, pid, M, rows, mrow, D: tl.constexpr, F: tl.constexpr, DN_N: tl.constexpr,
          DN_K: tl.constexpr, DN_S: tl.constexpr, NPROG: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
          STAGES: tl.constexpr):
    # this program's down tiles into the split-K partial sums. STAGES 0: w0, w1 are the weights of iterations 0
    # and 1, loaded before the barrier, and each iteration loads the weights and act chunk two ahead before its
    # own product; else Triton's software pipeline
    chunks: tl.constexpr = F // DN_S // DN_K
    n_it: tl.constexpr = (D // DN_N * DN_S // NPROG) * chunks
    acc = tl.zeros([rows.shape[0], DN_N], tl.float32)
    if STAGES:
        for it in tl.range(n_it, num_stages=STAGES):
            w, a = _down_chunk(w_ptr, act_ptr, it, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, True)
            acc = _mac(a, w, acc, DOT, IEEE)
            if it % chunks == chunks - 1:
                _down_store(acc, dp_ptr, it, pid, M, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG)
                acc = tl.zeros([rows.shape[0], DN_N], tl.float32)
    else:
        _, a0 = _down_chunk(w_ptr, act_ptr, 0, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, True)
        _, a1 = _down_chunk(w_ptr, act_ptr, 1, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, True)
        for it in range(n_it):
            w2, a2 = _down_chunk(w_ptr, act_ptr, it + 2, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, True)
            acc = _mac(a0, w0, acc, DOT, IEEE)
            if it % chunks == chunks - 1:
                _down_store(acc, dp_ptr, it, pid, M, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG)
                acc = tl.zeros([rows.shape[0], DN_N], tl.float32)
            w0, a0, w1, a1 = w1, a1, w2, a2


@triton.jit
def _mlp_half_kernel(x_ptr, pp_ptr, pb_ptr, gw_ptr, gb_ptr, dw_ptr, db_ptr, hs_ptr, act_ptr, dp_ptr, h_ptr, bar_ptr,
                     M, S, eps, D: tl.constexpr, F: tl.constexpr, M_PAD: tl.constexpr, D_PAD: tl.constexpr,
                     S_PAD: tl.constexpr, DS_PAD: tl.constexpr, GU_N: tl.constexpr, GU_K: tl.constexpr,
                     DN_N: tl.constexpr, DN_K: tl.constexpr, DN_S: tl.constexpr, NPROG: tl.constexpr,
                     PHASES: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr,
                     PDL: tl.constexpr):
    # PHASES (bits): 1 residual + LayerNorm and gate/up, 2 down, 4 the last residual + LayerNorm; 7 is the whole
    # MLP half in one launch with grid barriers between the phases, anything else one phase alone (interpreter)
    pid = tl.program_id(0)
    rows = tl.arange(0, 16 if DOT else M_PAD)      # tl.dot needs at least 16 rows
    mrow = rows < M
    barriers: tl.constexpr = PHASES == 7
    if PHASES & 1:      # the first two gate/up chunks: weights, no kernel writes them, so before the PDL wait
        wg0, wu0, _ = _gu_chunk(gw_ptr, hs_ptr, 0, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, False)
        wg1, wu1, _ = _gu_chunk(gw_ptr, hs_ptr, 1, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG, False)
    if PHASES & 2 and not barriers:
        wd0, _ = _down_chunk(dw_ptr, act_ptr, 0, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, False)
        wd1, _ = _down_chunk(dw_ptr, act_ptr, 1, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, False)
    _wait_previous(PDL)
    x1, h1, at, m = _residual_ln(x_ptr, pp_ptr, pb_ptr, M, S, eps, D, M_PAD, D_PAD, S_PAD, False)
    if PHASES & 1:
        tl.store(hs_ptr + pid * M * D + at, h1.to(hs_ptr.dtype.element_ty), mask=m)
        tl.debug_barrier()
        _gate_up(hs_ptr, gw_ptr, gb_ptr, act_ptr, wg0, wu0, wg1, wu1, pid, M, rows, mrow, D, F, GU_N, GU_K, NPROG,
                 DOT, IEEE, STAGES)
    if barriers:        # the first two down chunks in flight while the others finish gate/up
        wd0, _ = _down_chunk(dw_ptr, act_ptr, 0, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, False)
        wd1, _ = _down_chunk(dw_ptr, act_ptr, 1, pid, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, False)
        _grid_barrier(bar_ptr, NPROG, True)
    if PHASES & 2:
        _down(act_ptr, dw_ptr, dp_ptr, wd0, wd1, pid, M, rows, mrow, D, F, DN_N, DN_K, DN_S, NPROG, DOT, IEEE,
              STAGES)
    if barriers:
        _grid_barrier(bar_ptr, NPROG, pid == 0)
    if PHASES & 4:
        if pid == 0:
            tl.store(x_ptr + at, x1, mask=m)
            tl.debug_barrier()
            last = _residual_ln(x_ptr, dp_ptr, db_ptr, M, DN_S, eps, D, M_PAD, D_PAD, DS_PAD, True)
            tl.store(x_ptr + at, last[0], mask=m)
            tl.store(h_ptr + at, last[1].to(h_ptr.dtype.element_ty), mask=m)


def _pdl(device: torch.device) -> dict:
    ok = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
    return dict(launch_pdl=True, PDL=True) if ok else dict(PDL=False)


def mlp_half(x: Tensor, proj_parts: Tensor, proj_b: Tensor, gu_w: Tensor, gu_b: Tensor, down_w: Tensor,
             down_b: Tensor, eps: float, plan: MlpPlan, scratch: MlpScratch,
             launches: tuple[int, ...] = (7,)) -> Tensor:
    """x += sum(proj_parts) + proj_b; x += down(SwiGLU(gate/up(LayerNorm(x)))) + down_b, in place; returns
    LayerNorm(x): what `residual_layer_norm`, `linear_swiglu`, `linear_parts` and `residual_layer_norm` compute.
    x: [R, D]; proj_parts: [S, R, D] float32; gu_w: [2F, D]; down_w: [D, F]. launches: the phases (bits 1, 2, 4)
    of each launch: (7,) all in one with grid barriers; (1, 2, 4) one launch each (the interpreter; timing one)."""
    rows, d = x.shape
    f = down_w.shape[1]
    plan.check(d, f, sm_count(x.device))
    h = torch.empty_like(x)
    consts = dict(D=d, F=f, M_PAD=triton.next_power_of_2(rows), D_PAD=triton.next_power_of_2(d),
                  S_PAD=triton.next_power_of_2(proj_parts.shape[0]),
                  DS_PAD=triton.next_power_of_2(plan.down_splits), GU_N=plan.gu_cols, GU_K=plan.gu_k,
                  DN_N=plan.down_cols, DN_K=plan.down_k, DN_S=plan.down_splits, NPROG=plan.programs, DOT=plan.dot,
                  STAGES=plan.stages,
                  IEEE=x.dtype == torch.float32, num_warps=plan.warps, num_stages=1, **_pdl(x.device))
    for phases in launches:
        _mlp_half_kernel[(plan.programs,)](x, proj_parts, proj_b, gu_w, gu_b, down_w, down_b, scratch.h_own,
                                           scratch.act, scratch.down_parts, h, scratch.barrier, rows,
                                           proj_parts.shape[0], eps, PHASES=phases, **consts)
    return h
