"""Triton kernels of the token-level (LLM post-training) estimators.

One program scans one response (a row of the right-padded ``[N, T]`` data, or one
sequence of the packed stream between ``cu_seqlens[i]`` and ``cu_seqlens[i + 1]``)
from its end, ``BT`` tokens at a time: each chunk is one ``tl.associative_scan`` of
(alpha, beta) pairs, ``h_t = alpha_t + beta_t h_{t+1}``, whose carry goes to the next
chunk. verl's skip semantics are two such recurrences, the next valid value first:

    nv_{t+1} = m_{t+1} V_{t+1} + (1 - m_{t+1}) nv_{t+2}
    A_t      = m_t (r_t + gamma nv_{t+1} - V_t + gamma lambda A_{t+1}) + (1 - m_t) A_{t+1}

Whitening needs the mean and variance over every valid token of the batch: each
program keeps its row's (count, mean, M2) (Chan et al.'s pairwise update per chunk),
the last program to finish (an atomic ticket) combines the rows in a fixed order and
writes (mean, 1/std); :func:`whiten_kernel` then normalises in place. No host sync.
"""

from __future__ import annotations

import triton
import triton.language as tl

MODE_GAE_SKIP = tl.constexpr(0)  # verl: advantages and next values carried over masked tokens
MODE_GAE_MUL = tl.constexpr(1)  # OpenRLHF: rewards and values multiplied by the mask
MODE_RET_SKIP = tl.constexpr(2)  # verl REINFORCE++: masked tokens carry the return, output 0
MODE_RET_MUL = tl.constexpr(3)  # OpenRLHF: rewards multiplied by the mask
MODE_STATS = tl.constexpr(4)  # whitening statistics of x only


@triton.jit
def _combine(a1, b1, a2, b2):
    # (a1, b1) is applied first, then (a2, b2): h -> a2 + b2 * (a1 + b1 * h)
    return a2 + b2 * a1, b1 * b2


@triton.jit
def _chan(n1, m1, q1, n2, m2, q2):
    """(count, mean, M2) of the union of two sets (Chan, Golub and LeVeque 1979)."""
    n = n1 + n2
    w = tl.where(n > 0, n2 / tl.maximum(n, 1.0), 0.0)
    d = m2 - m1
    return n, m1 + d * w, q1 + q2 + d * d * n1 * w


@triton.jit
def _num(hi, lo, FP64: tl.constexpr):
    """A Python float passed as float32 hi + lo parts: exact enough for float64 data."""
    if FP64:
        one = tl.full([], 1.0, tl.float64)  # (not .to: the interpreter passes floats)
        return hi * one + lo * one
    else:
        return hi


@triton.jit
def _ld(P, off, ok, FP64: tl.constexpr):
    x = tl.load(P + off, mask=ok, other=0)
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def _valid(M, off, ok):
    """The mask as a bool: nonzero means a valid token; past the row's end, False."""
    x = tl.load(M + off, mask=ok, other=0)
    if x.dtype.is_fp16() or x.dtype.is_bf16():
        x = x.to(tl.float32)
    return (x != 0) & ok


@triton.jit
def _first(h, lane):
    """h at lane 0 (the chunk's first token: the carry of the chunk before it)."""
    return tl.sum(tl.where(lane == 0, h, 0.0), axis=0)


@triton.jit
def token_scan_kernel(R, V, M, CU, ADV, RET, WS, TICKET, STATS,
                      srn, srt, svn, svt, smn, smt, T, N,
                      g_hi, g_lo, gl_hi, gl_lo, ce_hi, ce_lo, eps_hi, eps_lo,
                      MODE: tl.constexpr, PACKED: tl.constexpr, WHITEN: tl.constexpr,
                      UNBIASED: tl.constexpr, FP64: tl.constexpr, BT: tl.constexpr,
                      RB: tl.constexpr, STAGES: tl.constexpr):
    """One response per program, scanned from its end BT tokens at a time (chunks
    aligned to BT from its start, so loads vectorise). Row bases are 64-bit scalars,
    token offsets 32-bit (the launcher checks a row's extent fits). Inputs by
    (row, token) strides; outputs contiguous (padded: row * T + t; packed: the
    stream's position)."""
    row = tl.program_id(0)
    if PACKED:
        start = tl.load(CU + row).to(tl.int64)
        L = (tl.load(CU + row + 1).to(tl.int64) - start).to(tl.int32)
        R += start * srt
        M += start * smt
        ADV += start
        if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
            V += start * svt
            RET += start
    else:
        L = T
        r64 = row.to(tl.int64)
        R += r64 * srn
        M += r64 * smn
        ADV += r64 * T
        if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
            V += r64 * svn
            RET += r64 * T
    if FP64:
        zero = tl.zeros([BT], dtype=tl.float64)
    else:
        zero = tl.zeros([BT], dtype=tl.float32)
    g = _num(g_hi, g_lo, FP64)
    gl = _num(gl_hi, gl_lo, FP64)
    lane = tl.arange(0, BT)
    z = tl.sum(zero, axis=0)
    carry_nv = z
    carry = z
    cnt = z
    mean = z
    m2 = z
    n_chunks = tl.cdiv(L, BT)
    for c in tl.range(0, n_chunks, num_stages=STAGES):
        t = (n_chunks - 1 - c) * BT + lane
        ok = t < L
        m = _valid(M, t * smt, ok)
        if MODE == MODE_STATS:
            h = _ld(R, t * srt, m, FP64)
        else:
            r = _ld(R, t * srt, m, FP64)
            if MODE == MODE_RET_SKIP:
                alpha = tl.where(m, r, 0.0)
                beta = tl.where(m, g + zero, 1.0)
            elif MODE == MODE_RET_MUL:
                alpha = tl.where(m, r, 0.0)
                beta = tl.where(ok, g + zero, 1.0)
            else:
                ok1 = t + 1 < L
                v = _ld(V, t * svt, ok, FP64)
                m1 = _valid(M, (t + 1) * smt, ok1)
                v1 = _ld(V, (t + 1) * svt, m1, FP64)
                if MODE == MODE_GAE_SKIP:
                    # the next valid value after t: a recurrence of its own, scanned first
                    na, nb = tl.associative_scan((tl.where(m1, v1, 0.0), tl.where(m1, 0.0, 1.0)),
                                                 0, _combine, reverse=True)
                    nv1 = na + nb * carry_nv
                    carry_nv = _first(nv1, lane)  # nv at the chunk's second token
                    alpha = tl.where(m, r + g * nv1 - v, 0.0)
                    beta = tl.where(m, gl + zero, 1.0)
                else:
                    v = tl.where(m, v, 0.0)
                    alpha = tl.where(ok, tl.where(m, r, 0.0) + g * v1 - v, 0.0)
                    beta = tl.where(ok, gl + zero, 1.0)
            a, b = tl.associative_scan((alpha, beta), 0, _combine, reverse=True)
            h = a + b * carry
            carry = _first(h, lane)
            if MODE == MODE_RET_SKIP:
                tl.store(ADV + t, tl.where(m, h, 0.0).to(ADV.dtype.element_ty), mask=ok)
            elif MODE == MODE_RET_MUL:
                tl.store(ADV + t, h.to(ADV.dtype.element_ty), mask=ok)
            else:
                tl.store(ADV + t, h.to(ADV.dtype.element_ty), mask=ok)
                tl.store(RET + t, (h + v).to(RET.dtype.element_ty), mask=ok)
        if WHITEN:
            nc = tl.sum(m.to(zero.dtype), axis=0)
            mc = tl.sum(tl.where(m, h, 0.0), axis=0) / tl.maximum(nc, 1.0)
            d = h - mc
            qc = tl.sum(tl.where(m, d * d, 0.0), axis=0)
            cnt, mean, m2 = _chan(cnt, mean, m2, nc, mc, qc)
    if WHITEN:
        tl.store(WS + row, cnt)
        tl.store(WS + N + row, mean)
        tl.store(WS + 2 * N + row, m2)
        if tl.atomic_add(TICKET, 1) == N - 1:  # the last program: every row's stats are out
            _finish(WS, STATS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED, FP64, RB)


@triton.jit
def _finish(WS, STATS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED: tl.constexpr,
            FP64: tl.constexpr, RB: tl.constexpr):
    """Combine the rows' (count, mean, M2) in a fixed order; store the whitening's
    mean and 1/std as the frameworks define them:
    mean = S / (n + count_eps), var = sum (x - mean)^2 / (n + count_eps) [* n / (n - 1)]."""
    lane = tl.arange(0, RB)
    if FP64:
        zero = tl.zeros([RB], dtype=tl.float64)
    else:
        zero = tl.zeros([RB], dtype=tl.float32)
    cnt = tl.sum(zero, axis=0)
    mean = tl.sum(zero, axis=0)
    m2 = tl.sum(zero, axis=0)
    for s in range(0, N, RB):
        i = s + lane
        ok = i < N
        nb = tl.load(WS + i, mask=ok, other=0.0, cache_modifier=".cg")
        mb = tl.load(WS + N + i, mask=ok, other=0.0, cache_modifier=".cg")
        qb = tl.load(WS + 2 * N + i, mask=ok, other=0.0, cache_modifier=".cg")
        nb, mb, qb = tl.reduce((nb, mb, qb), 0, _chan)
        cnt, mean, m2 = _chan(cnt, mean, m2, nb, mb, qb)
    ce = _num(ce_hi, ce_lo, FP64)
    eps = _num(eps_hi, eps_lo, FP64)
    mu = mean * cnt / (cnt + ce)
    d = mean - mu
    var = (m2 + cnt * d * d) / (cnt + ce)
    if UNBIASED:
        var = var * (cnt / (cnt - 1.0))
    tl.store(STATS, mu)
    tl.store(STATS + 1, 1.0 / tl.sqrt(var + eps))


@triton.jit
def whiten_kernel(X, M, Y, STATS, sxn, sxt, smn, smt, T, numel, fill, NORM: tl.constexpr,
                  SHIFT: tl.constexpr, FILL: tl.constexpr, FLAT: tl.constexpr,
                  FP64: tl.constexpr, BLOCK: tl.constexpr):
    """Y = (X - mean) / std (+ mean if not SHIFT) where NORM, at masked tokens ``fill``
    if FILL; Y contiguous [rows, T] (Y may be X). FLAT: X and M contiguous too, one
    1-D grid over every element; else a grid of (token block, row) and strides."""
    if FLAT:
        t = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = t < numel
        x = _ld(X, t, ok, FP64)
        if FILL:
            valid = _valid(M, t, ok)
        Y += 0
    else:
        t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        row = tl.program_id(1).to(tl.int64)
        ok = t < T
        x = _ld(X + row * sxn, t * sxt, ok, FP64)
        if FILL:
            valid = _valid(M + row * smn, t * smt, ok)
        Y += row * T
    y = x
    if NORM:
        mu = tl.load(STATS)
        rstd = tl.load(STATS + 1)
        y = (x - mu) * rstd
        if not SHIFT:
            y = y + mu
    if FILL:
        y = tl.where(valid, y, fill)
    tl.store(Y + t, y.to(Y.dtype.element_ty), mask=ok)


def _hilo(x: float):
    """float32 hi and lo parts of a Python float (hi + lo carries ~48 bits)."""
    import numpy as np
    hi = float(np.float32(x))
    return hi, float(np.float32(x - hi))


def config(n_rows: int, n_tokens: int) -> tuple[int, int, int]:
    """(BT, num_warps, num_stages) of the scan of ``n_rows`` responses of about
    ``n_tokens`` tokens: BT tokens per step."""
    # measured on the H200 (scripts/token_sweep.py): few responses want long chunks over
    # many warps (more of the row in flight); many want 1024 tokens over two warps
    if n_rows < 512:
        bt, warps = 2048, 8
    else:
        bt, warps = 1024, 2
    p2 = triton.next_power_of_2(max(int(n_tokens), 1))
    if p2 < bt:
        bt, warps = max(16, p2), max(1, min(warps, max(16, p2) // 256))
    return bt, warps, 1


def run(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src):
    """Launch the scan (and the whitening) on ``[R, P]`` views; outputs ``[R, P]``
    contiguous. ``how``: None or (count_eps, eps, unbiased, shift, fill)."""
    import torch

    fp64 = any(t is not None and t.dtype == torch.float64 for t in (r, v, out0))
    acc = torch.float64 if fp64 else torch.float32
    packed = cu is not None
    n_rows = cu.shape[0] - 1 if packed else r.shape[0]
    n_tok = r.shape[1]
    whiten = how is not None and how[0] is not None
    device = r.device
    if whiten:
        ws = torch.empty(3 * n_rows, dtype=acc, device=device)
        ticket = torch.zeros(1, dtype=torch.int32, device=device)
        stats = torch.empty(2, dtype=acc, device=device)
    else:
        ws = ticket = stats = None
    src = whiten_src if mode == MODE_STATS else r
    for name, t in (("rewards", src), ("values", v), ("mask", m)):
        if t is not None and (n_tok + 1) * t.stride(1) >= 2**31:
            raise ValueError(f"{name}: a response spans {n_tok} tokens of stride "
                             f"{t.stride(1)}, over 2^31 elements; pass it contiguous")
    bt, warps, stages = config(n_rows, n_tok if not packed else n_tok // max(n_rows, 1))
    ce = _hilo(how[0] if whiten else 0.0)
    ep = _hilo(how[1] if whiten else 0.0)
    vv = v if v is not None else src
    if mode != MODE_STATS or whiten:
        token_scan_kernel[(n_rows,)](
            src, vv, m, cu, out0, out1 if out1 is not None else out0, ws, ticket, stats,
            src.stride(0), src.stride(1), vv.stride(0), vv.stride(1), m.stride(0), m.stride(1),
            n_tok, n_rows, *_hilo(g), *_hilo(gl), *ce, *ep,
            MODE=mode, PACKED=packed, WHITEN=whiten, UNBIASED=bool(how[2]) if whiten else False,
            FP64=fp64, BT=bt, RB=1024, STAGES=stages,
            num_warps=warps)
    if how is None:
        return
    fill = how[4]
    x = whiten_src if mode == MODE_STATS else out0
    numel = out0.numel()
    block = 1024
    flat = x.is_contiguous() and (fill is None or m.is_contiguous())
    if flat:
        grid = (triton.cdiv(numel, block),)
    else:
        if out0.shape[0] > 65535:
            raise ValueError(f"x or mask with {out0.shape[0]} rows must be contiguous "
                             "(strided inputs take at most 65535 rows)")
        grid = (triton.cdiv(n_tok, block), out0.shape[0])
    whiten_kernel[grid](
        x, m, out0, stats, x.stride(0), x.stride(1), m.stride(0), m.stride(1), n_tok, numel,
        0.0 if fill is None else fill, NORM=whiten, SHIFT=bool(how[3]), FILL=fill is not None,
        FLAT=flat, FP64=fp64, BLOCK=block, num_warps=4)
