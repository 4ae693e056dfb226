"""Triton kernels for the decode step: skinny GEMMs (M <= 16 rows) with fused epilogues, split-K decode attention
over the filled part of the cache, q/k RMSNorm + RoPE + cache write, residual add + LayerNorm, and the lm_head
with guidance and argmax folded in (greedy decoding).

Each kernel reads the shape position from a device tensor, so a CUDA graph replays the same launches for every
token. `inference.ops.TorchOps` computes the same functions in PyTorch (tests compare the two, on the CPU through
Triton's interpreter, `TRITON_INTERPRET=1`).

On Hopper and later every kernel is launched with programmatic dependent launch (PDL): it is scheduled while the
previous kernel still runs and waits (`griddepcontrol.wait`) at its top, then lets the next one launch, so the
launch and the program setup overlap the previous kernel. The decode step is a chain of about 200 short kernels,
and that latency, not the bytes, was much of the gap to the bandwidth floor. Every kernel waits before any memory
access that a kernel of the step writes, so none overtakes one it depends on, directly or through the chain. Before
the wait a kernel reads only what no kernel of the step writes (`Launch.early_loads`): the position, constants, and
in the one-prompt attention the cached keys and values of earlier tokens, whose DRAM latency then overlaps the q/k/v
GEMM (3% of the step on an H200). (Loading the first weight block, or prefetching the weights to L2, before the wait was
measured slower.)

Launch parameters and switches are one `Launch` value per `TritonOps` (the engine's), starting from what `bench
cube3d --tune` chose on an H200; tuning changes an engine's value, never this module.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.decode_layers import PersistentLayers
from inference.fp8 import Fp8Weights
from inference.model import LayerWeights

INTERPRETER_SMS = 132  # Triton's CPU interpreter has no multiprocessors: plan as on an H100/H200


@triton.jit
def _wait_previous(PDL: tl.constexpr):
    # PDL: wait until the previous kernel has finished (its writes visible), then let the next one launch
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _layer_norm_kernel(x_ptr, p_ptr, b_ptr, h_ptr, M, D, S, eps, ADD: tl.constexpr, S_PAD: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    # one program per row: [x += sum_s parts[s] + b, in place]; h = LayerNorm(x) (no affine), float32 inside
    row = tl.program_id(0)
    _wait_previous(PDL)
    offs = tl.arange(0, BLOCK)
    m = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
    if ADD:
        sp = tl.arange(0, S_PAD)                    # all splits in one load, summed in a fixed order
        parts = tl.load(p_ptr + (sp[:, None] * M + row) * D + offs[None, :], mask=(sp[:, None] < S) & m[None, :],
                        other=0.0).to(tl.float32)
        y = tl.sum(parts, axis=0) + tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
        xs = (x + y).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * D + offs, xs, mask=m)
        x = xs.to(tl.float32)
    mean = tl.sum(x, axis=0) / D
    xc = tl.where(m, x - mean, 0.0)
    var = tl.sum(xc * xc, axis=0) / D
    tl.store(h_ptr + row * D + offs, (xc / tl.sqrt(var + eps)).to(h_ptr.dtype.element_ty), mask=m)


PLAIN, SWIGLU, PARTIAL = 0, 2, 3


@triton.jit
def _merge_splits(p_ptr, rows, mrow, head, H, NS, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    # [BLOCK_M, HEAD_DIM]: sum_s exp2(m_s - max) acc_s / sum_s exp2(m_s - max) l_s for each row's `head`
    base = p_ptr + (rows * H + head) * NS * (HEAD_DIM + 2)
    d = tl.arange(0, HEAD_DIM)
    mx = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for sp in range(NS):
        mx = tl.maximum(mx, tl.load(base + sp * (HEAD_DIM + 2) + HEAD_DIM, mask=mrow, other=0.0))
    num = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    for sp in range(NS):
        cell = base + sp * (HEAD_DIM + 2)
        wgt = tl.exp2(tl.load(cell + HEAD_DIM, mask=mrow, other=0.0) - mx)    # empty splits: exp2(-inf) = 0
        num += wgt[:, None] * tl.load(cell[:, None] + d[None, :], mask=mrow[:, None], other=0.0)
        den += wgt * tl.load(cell + HEAD_DIM + 1, mask=mrow, other=0.0)
    return num / tl.where(den > 0, den, 1.0)[:, None]


@triton.jit
def _dot(x, w, acc, IEEE: tl.constexpr):
    if IEEE:                                        # float32 weights: no TF32 rounding
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _gemv_block(x_ptr, w, w2, acc, acc2, rows, mrow, k0, K, H, NS, EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_K: tl.constexpr, IEEE: tl.constexpr, ATTN_X: tl.constexpr):
    # one K block: x[:, k0:k0 + BLOCK_K] (loaded, or merged from attention splits) times the loaded weight tiles
    if ATTN_X:
        x = _merge_splits(x_ptr, rows, mrow, k0 // BLOCK_K, H, NS, BLOCK_M, BLOCK_K).to(w.dtype)
    else:
        x = tl.load(x_ptr + rows[:, None] * K + (k0 + tl.arange(0, BLOCK_K))[None, :], mask=mrow[:, None], other=0.0)
    acc = _dot(x, w, acc, IEEE)
    if EPILOGUE == 2:
        acc2 = _dot(x, w2, acc2, IEEE)
    return acc, acc2


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, s_ptr, out_ptr, M, N, K, K_SPLIT, H, NS, EPILOGUE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
                 ATTN_X: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr, W_SCALE: tl.constexpr):
    # skinny GEMM for decode (M <= 16 rows): y[M, BLOCK_N] = x[M, K] @ W[cols, K]^T, one column block per
    # program, the whole K in the program (N % BLOCK_N == 0, K % BLOCK_K == 0). Epilogues:
    #   PLAIN:    out[M, N] = y
    #   SWIGLU:   W = [gate; up] (2N rows), out[M, N] = silu(y_gate + b_gate) * (y_up + b_up)
    #   PARTIAL:  split-K, program (n, s) sums K range s*K_SPLIT.. and writes float32 out[s, M, N]; the next kernel
    #             (qk-norm/RoPE, residual + LayerNorm) adds the splits up, in a fixed order (deterministic)
    # ATTN_X: x is split-K attention's partials [M*H, NS, BLOCK_K + 2] (acc, max, sum; BLOCK_K == head dim), and
    # each K block (one head) of x is the merge of its NS splits: the attention's combine step, done on load.
    # The SwiGLU biases are loaded first (EARLY: before the PDL wait; no kernel writes them).
    # W_SCALE: W is float8_e4m3fn with one float32 scale per row at s_ptr (`inference.fp8`): tiles are widened to
    # bf16 on load and each column's sum is multiplied by its row's scale before the epilogue.
    pid = tl.program_id(0)
    ksp = tl.program_id(1)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    mrow = rows < M
    if not EARLY:
        _wait_previous(PDL)
    if EPILOGUE == 2:
        bg = tl.load(b_ptr + cols).to(tl.float32)[None, :]
        bu = tl.load(b_ptr + N + cols).to(tl.float32)[None, :]
    if EARLY:
        _wait_previous(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(ksp * K_SPLIT, (ksp + 1) * K_SPLIT, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + cols[:, None] * K + ks[None, :])
        if W_SCALE:
            w = w.to(tl.bfloat16)
        w2 = w
        if EPILOGUE == 2:
            w2 = tl.load(w_ptr + (cols[:, None] + N) * K + ks[None, :])
            if W_SCALE:
                w2 = w2.to(tl.bfloat16)
        acc, acc2 = _gemv_block(x_ptr, w, w2, acc, acc2, rows, mrow, k0, K, H, NS, EPILOGUE, BLOCK_M, BLOCK_K, IEEE,
                                ATTN_X)
    if W_SCALE:
        acc = acc * tl.load(s_ptr + cols)[None, :]
        if EPILOGUE == 2:
            acc2 = acc2 * tl.load(s_ptr + N + cols)[None, :]
    dst = out_ptr + (ksp * M + rows[:, None]) * N + cols[None, :]
    if EPILOGUE == 0 or EPILOGUE == 3:
        tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mrow[:, None])
    else:
        g = acc + bg
        u = acc2 + bu
        tl.store(dst, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=mrow[:, None])


@triton.jit
def _qk_rope_cache_kernel(qkv_ptr, b_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr,
                          offset, M, S, D, s_row, s_head, s_pos, eps, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                          S_PAD: tl.constexpr, PDL: tl.constexpr):
    # one program per (row, head): sum of the S split-K parts of [q k v] + bias, RMSNorm of q and k, RoPE on
    # adjacent pairs, k and v into the cache (pairs padded to a power of two, the padding masked)
    row = tl.program_id(0)
    head = tl.program_id(1)
    _wait_previous(PDL)
    i = tl.arange(0, HALF_PAD)
    mi = i < HALF
    ev, od = 2 * i, 2 * i + 1
    pos = tl.load(pos_ptr)
    bb = b_ptr + head * 2 * HALF
    sp = tl.arange(0, S_PAD)
    base = qkv_ptr + (sp[:, None] * M + row) * 3 * D + head * 2 * HALF      # [S_PAD, 1]: every split at once
    ms = (sp[:, None] < S) & mi[None, :]
    qe = tl.sum(tl.load(base + ev[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    qo = tl.sum(tl.load(base + od[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    ke = tl.sum(tl.load(base + D + ev[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    ko = tl.sum(tl.load(base + D + od[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    ve = tl.sum(tl.load(base + 2 * D + ev[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    vo = tl.sum(tl.load(base + 2 * D + od[None, :], mask=ms, other=0.0).to(tl.float32), axis=0)
    qe += tl.load(bb + ev, mask=mi, other=0.0).to(tl.float32)
    qo += tl.load(bb + od, mask=mi, other=0.0).to(tl.float32)
    ke += tl.load(bb + D + ev, mask=mi, other=0.0).to(tl.float32)
    ko += tl.load(bb + D + od, mask=mi, other=0.0).to(tl.float32)
    ve += tl.load(bb + 2 * D + ev, mask=mi, other=0.0).to(tl.float32)
    vo += tl.load(bb + 2 * D + od, mask=mi, other=0.0).to(tl.float32)
    rq = 1.0 / tl.sqrt((tl.sum(qe * qe, axis=0) + tl.sum(qo * qo, axis=0)) / (2 * HALF) + eps)
    rk = 1.0 / tl.sqrt((tl.sum(ke * ke, axis=0) + tl.sum(ko * ko, axis=0)) / (2 * HALF) + eps)
    qe = qe * rq * tl.load(qw_ptr + ev, mask=mi, other=0.0).to(tl.float32)
    qo = qo * rq * tl.load(qw_ptr + od, mask=mi, other=0.0).to(tl.float32)
    ke = ke * rk * tl.load(kw_ptr + ev, mask=mi, other=0.0).to(tl.float32)
    ko = ko * rk * tl.load(kw_ptr + od, mask=mi, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + pos * HALF + i, mask=mi, other=0.0)
    s = tl.load(sin_ptr + pos * HALF + i, mask=mi, other=0.0)
    out = q_ptr + (row * (D // (2 * HALF)) + head) * 2 * HALF
    tl.store(out + ev, (qe * c - qo * s).to(q_ptr.dtype.element_ty), mask=mi)
    tl.store(out + od, (qe * s + qo * c).to(q_ptr.dtype.element_ty), mask=mi)
    dst = row * s_row + head * s_head + (offset + pos) * s_pos
    tl.store(kc_ptr + dst + ev, (ke * c - ko * s).to(kc_ptr.dtype.element_ty), mask=mi)
    tl.store(kc_ptr + dst + od, (ke * s + ko * c).to(kc_ptr.dtype.element_ty), mask=mi)
    tl.store(vc_ptr + dst + ev, ve.to(vc_ptr.dtype.element_ty), mask=mi)
    tl.store(vc_ptr + dst + od, vo.to(vc_ptr.dtype.element_ty), mask=mi)


@triton.jit
def _kv_block(kb, vb, n0, end, s_pos, d, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    # keys and values of cache positions n0 .. n0 + BLOCK_N (masked at `end`, and past the head dimension where
    # it is padded to a power of two), both loads in flight
    n = n0 + tl.arange(0, BLOCK_N)
    mn = n < end
    mask = mn[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(kb + n[:, None] * s_pos + d[None, :], mask=mask, other=0.0)
    v = tl.load(vb + n[:, None] * s_pos + d[None, :], mask=mask, other=0.0)
    return k, v, mn


@triton.jit
def _softmax_block(k, v, mn, q, m_i, l_i, acc):
    # online softmax (log2 domain) over one block of at least one position
    sc = tl.where(mn, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))  # [BLOCK_N]
    m_new = tl.maximum(m_i, tl.max(sc, axis=0))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(sc - m_new)
    acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    return m_new, l_i * alpha + tl.sum(p, axis=0), acc


@triton.jit
def _attend_cached(kb, vb, q, start, end, s_pos, d, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    # (max, sum, acc) of the online softmax over cache positions [start, end)
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_PAD], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        k, v, mn = _kv_block(kb, vb, n0, end, s_pos, d, HEAD_DIM, BLOCK_N)
        m_i, l_i, acc = _softmax_block(k, v, mn, q, m_i, l_i, acc)
    return m_i, l_i, acc


@triton.jit
def _store_attention(out_ptr, part_ptr, bh, sp, n_splits, d, acc, m_i, l_i, HEAD_DIM: tl.constexpr,
                     DIRECT: tl.constexpr):
    # one split's result: the output itself when there is one split, else (acc, max, sum) for the combine kernel
    one = tl.arange(0, 1)
    md = d < HEAD_DIM
    if DIRECT:
        tl.store(out_ptr + bh * HEAD_DIM + d, (acc / l_i).to(out_ptr.dtype.element_ty), mask=md)
    else:
        pb = part_ptr + (bh * n_splits + sp) * (HEAD_DIM + 2)
        tl.store(pb + d, acc, mask=md)
        tl.store(pb + HEAD_DIM + one, m_i)
        tl.store(pb + HEAD_DIM + 1 + one, l_i)


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, part_ptr, out_ptr, offset, H, s_row, s_head, s_pos,
                       split_len, n_splits, qk_scale, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
                       BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, PDL: tl.constexpr):
    # program (row*head, split): online softmax over cache positions [split*len, min(next, filled)) only
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    row = bh // H
    head = bh % H
    length = tl.load(pos_ptr) + offset + 1          # the position moves only between steps: safe before the wait
    start = sp * split_len
    end = tl.minimum(start + split_len, length)
    d = tl.arange(0, HEAD_PAD)
    kb = k_ptr + row * s_row + head * s_head
    vb = v_ptr + row * s_row + head * s_head
    _wait_previous(PDL)
    q = tl.load(q_ptr + bh * HEAD_DIM + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32) * qk_scale  # log2 domain
    m_i, l_i, acc = _attend_cached(kb, vb, q, start, end, s_pos, d, HEAD_DIM, HEAD_PAD, BLOCK_N)
    _store_attention(out_ptr, part_ptr, bh, sp, n_splits, d, acc, m_i, l_i, HEAD_DIM, DIRECT)


@triton.jit
def _head_consts(b_ptr, w_ptr, d, md):
    # one head's bias and norm weight at d and at d ^ 1 (its RoPE partners), float32; 0 where not `md`
    return (tl.load(b_ptr + d, mask=md, other=0.0).to(tl.float32),
            tl.load(b_ptr + (d ^ 1), mask=md, other=0.0).to(tl.float32),
            tl.load(w_ptr + d, mask=md, other=0.0).to(tl.float32),
            tl.load(w_ptr + (d ^ 1), mask=md, other=0.0).to(tl.float32))


@triton.jit
def _norm_rope(xa, xb, ba, bb, wa, wb, cos, sin, d, eps, HEAD_DIM: tl.constexpr):
    # a head vector from its split-K parts loaded at d (xa) and d ^ 1 (xb), [S_PAD, d], plus the bias; RMSNorm,
    # then RoPE on adjacent pairs: out[d] = x[d] cos +- x[d ^ 1] sin (- for even d)
    x = tl.sum(xa, axis=0) + ba
    xp = tl.sum(xb, axis=0) + bb
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
    x = x * r * wa
    xp = xp * r * wb
    return x * cos + tl.where(d % 2 == 0, -xp, xp) * sin


@triton.jit
def _qkv_attn_kernel(qkv_ptr, b_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, part_ptr, out_ptr,
                     offset, M, S, D, H, s_row, s_head, s_pos, split_len, n_splits, eps, qk_scale,
                     HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr, S_PAD: tl.constexpr,
                     DIRECT: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    # program (row*head, split): q from the split-K parts of [q k v] (+ bias, RMSNorm, RoPE), then online softmax
    # over the cached positions of this split. The split holding the new token's slot also computes its k and v,
    # writes them to the cache and counts them in; no other program reads that slot. DIRECT: one split, the
    # output itself; else (acc, max, sum) for the combine kernel. Every load is issued before the first use: the
    # first key/value block and the constants (EARLY: before the PDL wait, as nothing in this step writes them),
    # then the parts the q/k/v GEMM wrote.
    bh = tl.program_id(0)
    sp = tl.program_id(1)
    row = bh // H
    head = bh % H
    pos = tl.load(pos_ptr)                          # the position moves only between steps: safe before the wait
    new = pos + offset                              # the new token's cache slot
    start = sp * split_len
    end = tl.minimum(start + split_len, new)
    own = (new >= start) & (new < start + split_len)
    d = tl.arange(0, HEAD_PAD)                      # padded to a power of two; lanes from HEAD_DIM on masked
    md = d < HEAD_DIM
    kb = k_ptr + row * s_row + head * s_head
    vb = v_ptr + row * s_row + head * s_head
    if not EARLY:
        _wait_previous(PDL)
    k0, v0, mn0 = _kv_block(kb, vb, start, end, s_pos, d, HEAD_DIM, BLOCK_N)  # slots < new: earlier steps'
    cos = tl.load(cos_ptr + pos * (HEAD_DIM // 2) + d // 2, mask=md, other=0.0)
    sin = tl.load(sin_ptr + pos * (HEAD_DIM // 2) + d // 2, mask=md, other=0.0)
    bqa, bqb, wqa, wqb = _head_consts(b_ptr + head * HEAD_DIM, qw_ptr, d, md)
    bka, bkb, wka, wkb = _head_consts(b_ptr + D + head * HEAD_DIM, kw_ptr, d, md)
    bv = tl.load(b_ptr + 2 * D + head * HEAD_DIM + d, mask=md, other=0.0).to(tl.float32)
    if EARLY:
        _wait_previous(PDL)
    sp_ = tl.arange(0, S_PAD)
    base = qkv_ptr + (sp_[:, None] * M + row) * 3 * D + head * HEAD_DIM       # [S_PAD, 1]: every split at once
    ms = (sp_[:, None] < S) & md[None, :]
    mo = ms & own                                                             # k and v: the owning split only
    qa = tl.load(base + d[None, :], mask=ms, other=0.0)
    qb = tl.load(base + (d ^ 1)[None, :], mask=ms, other=0.0)
    ka = tl.load(base + D + d[None, :], mask=mo, other=0.0)
    kp = tl.load(base + D + (d ^ 1)[None, :], mask=mo, other=0.0)
    va = tl.load(base + 2 * D + d[None, :], mask=mo, other=0.0)
    q = _norm_rope(qa, qb, bqa, bqb, wqa, wqb, cos, sin, d, eps, HEAD_DIM)
    q = q.to(k_ptr.dtype.element_ty).to(tl.float32) * qk_scale                # as stored; log2 domain
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD_PAD], tl.float32)
    if start < end:
        m_i, l_i, acc = _softmax_block(k0, v0, mn0, q, m_i, l_i, acc)
    for n0 in range(start + BLOCK_N, end, BLOCK_N):                          # splits longer than one block
        k, v, mn = _kv_block(kb, vb, n0, end, s_pos, d, HEAD_DIM, BLOCK_N)
        m_i, l_i, acc = _softmax_block(k, v, mn, q, m_i, l_i, acc)
    if own:
        k_new = _norm_rope(ka, kp, bka, bkb, wka, wkb, cos, sin, d, eps, HEAD_DIM).to(k_ptr.dtype.element_ty)
        v_new = (tl.sum(va, axis=0) + bv).to(v_ptr.dtype.element_ty)
        tl.store(kb + new * s_pos + d, k_new, mask=md)
        tl.store(vb + new * s_pos + d, v_new, mask=md)
        sc = tl.sum(k_new.to(tl.float32) * q, axis=0)
        m_new = tl.maximum(m_i, sc)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new)
        acc = acc * alpha + p * v_new.to(tl.float32)
        l_i = l_i * alpha + p
        m_i = m_new
    _store_attention(out_ptr, part_ptr, bh, sp, n_splits, d, acc, m_i, l_i, HEAD_DIM, DIRECT)


@triton.jit
def _attn_combine_kernel(part_ptr, out_ptr, n_splits, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr,
                         SPLITS: tl.constexpr, PDL: tl.constexpr):
    # one program per row*head: merge the splits' (acc, max, sum) into the attention output
    bh = tl.program_id(0)
    _wait_previous(PDL)
    s = tl.arange(0, SPLITS)
    ms = s < n_splits
    d = tl.arange(0, HEAD_PAD)
    md = d < HEAD_DIM
    pb = part_ptr + bh * n_splits * (HEAD_DIM + 2) + s * (HEAD_DIM + 2)
    m = tl.load(pb + HEAD_DIM, mask=ms, other=float("-inf"))
    l = tl.load(pb + HEAD_DIM + 1, mask=ms, other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))                                          # empty splits: weight 0
    acc = tl.load(pb[:, None] + d[None, :], mask=ms[:, None] & md[None, :], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(out_ptr + bh * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=md)


@triton.jit
def _lm_head_best_kernel(h_ptr, w_ptr, best_ptr, arg_ptr, scale_ptr, n_total_ptr, pos_ptr, P, N, K,
                         GUIDED: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         IEEE: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    # one column block per program: logits of the conditional rows (0..P-1) and, with guidance, of the
    # unconditional rows (P..2P-1) as two dots, so row p meets row P + p in registers; guided logits
    # (1 + g) * c - g * u as `sampling.guide` computes them (logits rounded to the activation dtype first, g in
    # float64, launched without FMA contraction); writes each prompt's block maximum and its first column. The
    # guidance weight is read first (EARLY: before the PDL wait; only the host and the step's end change it)
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mc = cols < N                                   # the last block may pass the vocabulary's end: masked
    p = tl.arange(0, BLOCK_P)
    mp = p < P
    if not EARLY:
        _wait_previous(PDL)
    if GUIDED:
        n_total = tl.load(n_total_ptr).to(tl.float64)
        gamma = tl.load(scale_ptr) * (n_total - tl.load(pos_ptr).to(tl.float64)) / n_total
    if EARLY:
        _wait_previous(PDL)
    acc_c = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_P, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        mk = ks < K
        w = tl.trans(tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=mc[:, None] & mk[None, :], other=0.0))
        xc = tl.load(h_ptr + p[:, None] * K + ks[None, :], mask=mp[:, None] & mk[None, :], other=0.0)
        if IEEE:
            acc_c = tl.dot(xc, w, acc_c, input_precision="ieee")
        else:
            acc_c = tl.dot(xc, w, acc_c)
        if GUIDED:
            xu = tl.load(h_ptr + (P + p)[:, None] * K + ks[None, :], mask=mp[:, None] & mk[None, :], other=0.0)
            if IEEE:
                acc_u = tl.dot(xu, w, acc_u, input_precision="ieee")
            else:
                acc_u = tl.dot(xu, w, acc_u)
    g = acc_c.to(h_ptr.dtype.element_ty).to(tl.float32)
    if GUIDED:
        u = acc_u.to(h_ptr.dtype.element_ty).to(tl.float32)
        g = (1.0 + gamma).to(tl.float32) * g - gamma.to(tl.float32) * u
    g = tl.where(mc[None, :], g, float("-inf"))
    best, arg = tl.max(g, axis=1, return_indices=True, return_indices_tie_break_left=True)
    n_blocks = tl.num_programs(0)
    tl.store(best_ptr + p * n_blocks + pid, best, mask=mp)
    tl.store(arg_ptr + p * n_blocks + pid, pid * BLOCK_N + arg, mask=mp)


@triton.jit
def _pick_kernel(best_ptr, arg_ptr, wte_ptr, ids_ptr, x_ptr, pos_ptr, ticket_ptr, P, NB, D, ids_stride,
                 GUIDED: tl.constexpr, NB_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    # one program per prompt: the first column of the largest guided logit over the blocks; ids[p, pos] = it;
    # its embedding into the next step's input rows p (and P + p); the last program to finish advances pos
    p = tl.program_id(0)
    _wait_previous(PDL)
    b = tl.arange(0, NB_PAD)
    mb = b < NB
    best = tl.load(best_ptr + p * NB + b, mask=mb, other=float("-inf"))
    arg = tl.load(arg_ptr + p * NB + b, mask=mb, other=2147483647)
    tok = tl.min(tl.where(best == tl.max(best, axis=0), arg, 2147483647), axis=0)
    pos = tl.load(pos_ptr)
    tl.store(ids_ptr + p * ids_stride + pos, tok.to(tl.int64))
    d = tl.arange(0, BLOCK_D)
    md = d < D
    e = tl.load(wte_ptr + tok.to(tl.int64) * D + d, mask=md)
    tl.store(x_ptr + p * D + d, e, mask=md)
    if GUIDED:
        tl.store(x_ptr + (P + p) * D + d, e, mask=md)
    tl.debug_barrier()                                              # every warp of this program has read pos
    if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == P - 1:       # ... and every other program too
        tl.store(pos_ptr, pos + 1)
        tl.store(ticket_ptr, 0)


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The device's multiprocessors, asked once per device (the launches of every step need it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SMS


def split_plan(rows_heads: int, cache_len: int, sms: int, block_n: int, waves: int = 4) -> tuple[int, int]:
    """(split length, number of splits): enough programs to cover the chip `waves` times over."""
    want = max(1, min(math.ceil(waves * sms / rows_heads), triton.cdiv(cache_len, block_n)))
    split_len = triton.cdiv(triton.cdiv(cache_len, want), block_n) * block_n
    return split_len, triton.cdiv(cache_len, split_len)


# (epilogue, N, K, rows <= 2 ? 2 : 16) -> (BLOCK_N, BLOCK_K, num_warps, num_stages, splits), or None where cuBLAS
# was faster. Measured on an H200 with `featurectl bench cube3d --tune` (see docs/cube3d.md).
H200_GEMV: dict[tuple[int, int, int, int], tuple[int, int, int, int, int] | None] = {
    (2, 6144, 1536, 2): (32, 64, 4, 6, 1), (2, 6144, 1536, 16): (64, 128, 8, 3, 1),          # gate/up + SwiGLU
    (0, 16384, 1536, 2): (64, 128, 4, 3, 1), (0, 16384, 1536, 16): (64, 128, 4, 3, 1),      # lm_head
    (3, 4608, 1536, 2): (32, 128, 4, 3, 3), (3, 4608, 1536, 16): (32, 128, 4, 3, 2),        # q/k/v
    (3, 1536, 1536, 2): (16, 256, 4, 3, 3), (3, 1536, 1536, 16): (32, 256, 4, 3, 2),        # attention output
    (3, 1536, 6144, 2): (32, 256, 4, 3, 4), (3, 1536, 6144, 16): (32, 256, 4, 4, 4),        # MLP down
}


# rows <= 2 ? 2 : 16 -> (BLOCK_N, num_warps, num_stages, waves of programs over the chip); measured on an H200
# (one prompt: 64 keys a block, each split one block loaded before the PDL wait: 10 splits over the dual layers;
# 2 warps a program: 3% off the step against 4, 2026-12-02)
H200_ATTN: dict[int, tuple[int, int, int, int]] = {2: (64, 2, 2, 4), 16: (64, 4, 3, 8)}
ATTN_DEFAULT = (32, 4, 2, 4)


@dataclass
class Launch:
    """How the fast path launches its kernels: tables and switches, one value per engine."""

    gemv: dict[tuple[int, int, int, int], tuple[int, int, int, int, int] | None] = field(
        default_factory=lambda: dict(H200_GEMV))
    attn: dict[int, tuple[int, int, int, int]] = field(default_factory=lambda: dict(H200_ATTN))
    # the lm_head with guidance + argmax (`lm_head_pick`): (BLOCK_N, BLOCK_K, num_warps, num_stages)
    lm_head_pick: tuple[int, int, int, int] = (64, 128, 4, 3)
    # greedy steps: guidance + argmax inside the lm_head GEMM, one small kernel picks the id
    fuse_pick: bool = True
    # merge the attention's splits inside the output projection's GEMM instead of a combine kernel: one launch
    # less, but each GEMM program re-merges its heads serially; measured 3x slower per step on an H200, so off
    fuse_combine: bool = False
    # q/k RMSNorm + RoPE + cache write inside the attention kernel for steps of at most this many rows (one prompt
    # with guidance); with more rows, every split program recomputing q cost more than the kernel it saves (H200)
    fuse_qk_rows: int = 2
    # load before the PDL wait what no kernel of the step writes: constants (biases, norm weights, RoPE tables,
    # the guidance weight) and, in the one-prompt attention, the keys and values earlier steps wrote. False: the
    # same loads issued first after the wait, measured slower than both (more registers, the same wait)
    early_loads: bool = True
    pdl: bool = True  # programmatic dependent launch where the device supports it (compute capability >= 9)
    # bf16 steps of one prompt or eight with guidance (2 or 16 rows) at the v0.1/v0.5 widths on a Hopper chip: every
    # layer in one persistent CUDA launch (`inference.decode_layers`, compiled with NVRTC) instead of 8 kernels a
    # layer; False, or where it cannot run: the kernels here
    persistent_layers: bool = True

    def gemv_config(self, epilogue: int, m: int, n: int, k: int,
                    sms: int) -> tuple[int, int, int, int, int] | None:
        """Tuned launch parameters if measured for this shape (None: use cuBLAS), else a heuristic for a chip of
        `sms` multiprocessors: the widest column block that gives every one about two programs, and for split-K
        enough splits to cover the chip about three times."""
        key = (epilogue, n, k, 2 if m <= 2 else 16)
        if key in self.gemv:
            return self.gemv[key]
        block_n = 16
        for bn in (64, 32):
            if n % bn == 0 and n // bn >= 2 * sms:
                block_n = bn
                break
        block_k, splits = min(256, k), 1
        if epilogue == PARTIAL:
            for sp in (8, 6, 4, 3, 2):
                if k % (sp * block_k) == 0 and (n // block_n) * sp <= 3 * sms:
                    splits = sp
                    break
        return block_n, block_k, 4, 4, splits

    def attn_config(self, rows: int) -> tuple[int, int, int, int]:
        return self.attn.get(2 if rows <= 2 else 16, ATTN_DEFAULT)


class AttnParts(NamedTuple):
    """Split-K attention before its combine step: [R*H, splits, head dim + 2] float32 (acc, max, sum)."""

    parts: Tensor
    rows: int
    n_head: int
    head_dim: int
    dtype: torch.dtype


class TritonOps:
    """The decode step's pieces as fused Triton kernels (same signatures as `TorchOps`)."""

    name = "triton"

    def __init__(self, launch: Launch | None = None, attn: tuple[int, int, int, int] | None = None,
                 gemv: bool = True, fp8: Fp8Weights | None = None):
        self.launch = launch or Launch()
        self.fp8 = fp8                      # weight-only FP8 (`inference.fp8`); bf16 activations
        self.attn = attn                    # fixed attention launch parameters (tests); None: the launch table
        self.gemv = gemv
        self.attn_block_n = None            # tests may force a small block to exercise several splits
        self._ticket: Tensor | None = None  # [1] int32, the pick kernel's count of finished programs
        self._persistent: PersistentLayers | None | bool = None   # False: tried, cannot run here

    @property
    def fuse_pick(self) -> bool:
        return self.launch.fuse_pick

    @property
    def runs_persistent_layers(self) -> bool:
        """Whether steps have run every layer in one launch (`fused_layers`) on this device."""
        return isinstance(self._persistent, PersistentLayers)

    @property
    def early(self) -> bool:
        return self.launch.early_loads

    def _pdl(self, device: torch.device) -> dict:
        """Launch options and the kernels' PDL flag for `device`."""
        ok = self.launch.pdl and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
        return dict(launch_pdl=True, PDL=True) if ok else dict(PDL=False)

    def fused_layers(self, x: Tensor, pos: Tensor, layers: Sequence[LayerWeights], cos: Tensor, sin: Tensor,
                     eps: float, qk_eps: float) -> Tensor | None:
        """Every layer in one persistent launch where it applies (`Launch.persistent_layers`): updates x in place
        and returns LayerNorm(x) after the last layer; None: run the layers with the kernels below."""
        if not self.launch.persistent_layers or self.fp8 is not None or self._persistent is False:
            return None
        if not PersistentLayers.applies(x, layers, cos):
            return None
        if self._persistent is None:
            self._persistent = PersistentLayers.create(x.device) or False
            if self._persistent is False:
                return None
        return self._persistent(x, pos, layers, cos, sin, eps, qk_eps, pdl=bool(self._pdl(x.device)["PDL"]))

    def layer_norm(self, x: Tensor, eps: float) -> Tensor:
        h = torch.empty_like(x)
        rows, d = x.shape
        _layer_norm_kernel[(rows,)](x, x, x, h, rows, d, 0, eps, ADD=False, S_PAD=1,
                                    BLOCK=triton.next_power_of_2(d), num_warps=8, **self._pdl(x.device))
        return h

    def residual_layer_norm(self, x: Tensor, parts: Tensor, bias: Tensor, eps: float) -> Tensor:
        """x += sum(parts) + bias in place (parts: [S, R, D] split-K sums); returns LayerNorm(x)."""
        h = torch.empty_like(x)
        rows, d = x.shape
        _layer_norm_kernel[(rows,)](x, parts, bias, h, rows, d, parts.shape[0], eps, ADD=True,
                                    S_PAD=triton.next_power_of_2(parts.shape[0]), BLOCK=triton.next_power_of_2(d),
                                    num_warps=8, **self._pdl(x.device))
        return h

    def _gemv(self, x: Tensor | AttnParts, w: Tensor, b: Tensor | None, n: int, epilogue: int):
        """Launch the skinny GEMM; None when the shape does not fit it (the caller falls back to cuBLAS)."""
        attn = isinstance(x, AttnParts)
        m, k = (x.rows, x.n_head * x.head_dim) if attn else x.shape
        cfg = self.launch.gemv_config(epilogue, m, n, k, sm_count(w.device))
        if cfg is not None and attn:
            cfg = (cfg[0], x.head_dim) + cfg[2:]          # one head per K block: the merge works head by head
        if (cfg is None or not self.gemv or m > 16 or n % cfg[0] or k % (cfg[1] * cfg[4])
                or not (_power_of_two(cfg[0]) and _power_of_two(cfg[1])) or not (attn or x.is_contiguous())):
            return None                                   # a shape the kernel's blocks do not tile
        block_n, block_k, warps, stages, splits = cfg
        dtype = x.dtype
        quantized = self.fp8.get(w) if self.fp8 is not None else None
        w, scale = quantized if quantized is not None else (w, w)
        shape = (splits, m, n) if epilogue == PARTIAL else (m, n)
        out = torch.empty(shape, dtype=torch.float32 if epilogue == PARTIAL else dtype, device=w.device)
        src = x.parts if attn else x
        heads, n_splits = (x.n_head, x.parts.shape[1]) if attn else (1, 1)
        _gemv_kernel[(n // block_n, splits)](src, w, w if b is None else b, scale, out, m, n, k, k // splits, heads,
                                             n_splits, EPILOGUE=epilogue, BLOCK_M=16, BLOCK_N=block_n,
                                             BLOCK_K=block_k, IEEE=dtype == torch.float32, ATTN_X=attn,
                                             EARLY=self.early, W_SCALE=quantized is not None, num_warps=warps,
                                             num_stages=stages, **self._pdl(w.device))
        return out

    def _merged(self, a: Tensor | AttnParts) -> Tensor:
        """The attention output [R, D] (runs the combine kernel when the GEMM could not take the parts)."""
        if not isinstance(a, AttnParts):
            return a
        out = torch.empty(a.rows, a.n_head * a.head_dim, dtype=a.dtype, device=a.parts.device)
        n_splits = a.parts.shape[1]
        _attn_combine_kernel[(a.rows * a.n_head,)](a.parts, out, n_splits, HEAD_DIM=a.head_dim,
                                                  HEAD_PAD=triton.next_power_of_2(a.head_dim),
                                                  SPLITS=triton.next_power_of_2(n_splits), num_warps=4,
                                                  **self._pdl(out.device))
        return out

    def _dense(self, w: Tensor) -> Tensor:
        """The matrix cuBLAS multiplies by where the GEMV does not fit: FP8 weights dequantized, as in `TorchOps`."""
        return w if self.fp8 is None else self.fp8.dense(w)

    def linear(self, x: Tensor, w: Tensor) -> Tensor:
        out = self._gemv(x, w, None, w.shape[0], PLAIN)
        return torch.nn.functional.linear(x, self._dense(w)) if out is None else out

    def linear_parts(self, x: Tensor | AttnParts, w: Tensor) -> Tensor:
        """x W^T as split-K partial sums [S, R, N] (float32), or [1, R, N] from cuBLAS. x may be `AttnParts`."""
        if isinstance(x, AttnParts) and not self.launch.fuse_combine:
            x = self._merged(x)
        out = self._gemv(x, w, None, w.shape[0], PARTIAL)
        return torch.nn.functional.linear(self._merged(x), self._dense(w)).unsqueeze(0) if out is None else out

    def linear_swiglu(self, h: Tensor, w: Tensor, b: Tensor) -> Tensor:
        out = self._gemv(h, w, b, w.shape[0] // 2, SWIGLU)
        if out is not None:
            return out
        g, u = torch.nn.functional.linear(h, self._dense(w), b).chunk(2, dim=-1)
        return torch.nn.functional.silu(g) * u

    def qk_norm_rope_cache(self, qkv: Tensor, lw: LayerWeights, rows: int, cos: Tensor, sin: Tensor,
                           pos: Tensor, eps: float) -> Tensor:
        kc, vc = lw.cache.k, lw.cache.v                                           # [R_max, H, L, d]
        n_head, head_dim = kc.shape[1], kc.shape[3]
        q = torch.empty(rows, n_head, head_dim, dtype=kc.dtype, device=qkv.device)
        _qk_rope_cache_kernel[(rows, n_head)](
            qkv, lw.qkv_b, lw.q_norm, lw.k_norm, cos, sin, pos, q, kc, vc, lw.offset, rows, qkv.shape[0],
            n_head * head_dim, kc.stride(0), kc.stride(1), kc.stride(2), eps, HALF=head_dim // 2,
            HALF_PAD=triton.next_power_of_2(head_dim // 2), S_PAD=triton.next_power_of_2(qkv.shape[0]), num_warps=1,
            **self._pdl(q.device))
        return q

    def attention(self, q: Tensor, lw: LayerWeights, rows: int, pos: Tensor) -> AttnParts:
        """Split-K attention over the filled cache; the combine step runs inside the next GEMM (`linear_parts`)."""
        kc, vc = lw.cache.k, lw.cache.v
        n_head, cache_len, head_dim = kc.shape[1], kc.shape[2], kc.shape[3]
        block_n, warps, stages, waves = self.attn or self.launch.attn_config(rows)
        block_n = self.attn_block_n or block_n
        split_len, n_splits = split_plan(rows * n_head, cache_len, sm_count(q.device), block_n, waves)
        part = torch.empty(rows * n_head, n_splits, head_dim + 2, dtype=torch.float32, device=q.device)
        qk_scale = (1.0 / math.sqrt(head_dim)) * math.log2(math.e)
        _attn_split_kernel[(rows * n_head, n_splits)](
            q, kc, vc, pos, part, part, lw.offset, n_head, kc.stride(0), kc.stride(1), kc.stride(2),
            split_len, n_splits, qk_scale, HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim),
            BLOCK_N=block_n, DIRECT=False,
            num_warps=warps, num_stages=stages, **self._pdl(q.device))
        return AttnParts(part, rows, n_head, head_dim, q.dtype)

    def lm_head_pick(self, h: Tensor, w: Tensor, wte: Tensor, prompts: int, guided: bool, scale: Tensor,
                     n_total: Tensor, pos: Tensor, ids: Tensor, x_next: Tensor) -> None:
        """Greedy token choice without logits in memory: guidance and argmax inside the lm_head GEMM (per column
        block), then one program per prompt picks the id, writes `ids[:, pos]` and the next step's embeddings
        (rows p and prompts + p of `x_next`) and advances `pos`: what `Engine._advance` does in about 20 launches.
        h: [R, D] after the final LayerNorm; w: [V, D] lm_head rows of the shape codes; wte: [vocab, D]."""
        n, k = w.shape
        block_n, block_k, warps, stages = self.launch.lm_head_pick
        n_blocks = triton.cdiv(n, block_n)
        if self._ticket is None or self._ticket.device != h.device:
            self._ticket = torch.zeros(1, dtype=torch.int32, device=h.device)
        best = torch.empty(prompts, n_blocks, dtype=torch.float32, device=h.device)
        arg = torch.empty(prompts, n_blocks, dtype=torch.int32, device=h.device)
        _lm_head_best_kernel[(n_blocks,)](h, w, best, arg, scale, n_total, pos, prompts, n, k, GUIDED=guided,
                                          BLOCK_P=max(16, triton.next_power_of_2(prompts)), BLOCK_N=block_n,
                                          BLOCK_K=block_k, IEEE=h.dtype == torch.float32, EARLY=self.early,
                                          num_warps=warps, num_stages=stages, enable_fp_fusion=False,
                                          **self._pdl(h.device))
        _pick_kernel[(prompts,)](best, arg, wte, ids, x_next, pos, self._ticket, prompts, n_blocks, k, ids.stride(0),
                                 GUIDED=guided, NB_PAD=triton.next_power_of_2(n_blocks),
                                 BLOCK_D=triton.next_power_of_2(k), num_warps=4, **self._pdl(h.device))

    def qkv_attention(self, qkv: Tensor, lw: LayerWeights, rows: int, cos: Tensor, sin: Tensor, pos: Tensor,
                      eps: float) -> Tensor | AttnParts:
        """q/k norm + RoPE + cache write + attention in one kernel: [R, D], or `AttnParts` when split over the
        cache (then merged by `linear_parts`). qkv: [S, R, 3D] split-K parts, no bias yet."""
        if rows > self.launch.fuse_qk_rows:
            return self.attention(self.qk_norm_rope_cache(qkv, lw, rows, cos, sin, pos, eps), lw, rows, pos)
        kc, vc = lw.cache.k, lw.cache.v
        n_head, cache_len, head_dim = kc.shape[1], kc.shape[2], kc.shape[3]
        block_n, warps, stages, waves = self.attn or self.launch.attn_config(rows)
        block_n = self.attn_block_n or block_n
        split_len, n_splits = split_plan(rows * n_head, cache_len, sm_count(qkv.device), block_n, waves)
        direct = n_splits == 1
        part = torch.empty(rows * n_head, n_splits, head_dim + 2, dtype=torch.float32, device=qkv.device)
        out = torch.empty(rows, n_head * head_dim, dtype=kc.dtype, device=qkv.device) if direct else part
        _qkv_attn_kernel[(rows * n_head, n_splits)](
            qkv, lw.qkv_b, lw.q_norm, lw.k_norm, cos, sin, pos, kc, vc, part, out, lw.offset, rows, qkv.shape[0],
            n_head * head_dim, n_head, kc.stride(0), kc.stride(1), kc.stride(2), split_len, n_splits, eps,
            (1.0 / math.sqrt(head_dim)) * math.log2(math.e), HEAD_DIM=head_dim,
            HEAD_PAD=triton.next_power_of_2(head_dim), BLOCK_N=block_n,
            S_PAD=triton.next_power_of_2(qkv.shape[0]), DIRECT=direct, EARLY=self.early, num_warps=warps,
            num_stages=stages, **self._pdl(qkv.device))
        return out if direct else AttnParts(part, rows, n_head, head_dim, kc.dtype)

    def attention_output(self, q: Tensor, lw: LayerWeights, rows: int, pos: Tensor) -> Tensor:
        """The merged attention output [R, D] (tests and tools)."""
        return self._merged(self.attention(q, lw, rows, pos))
