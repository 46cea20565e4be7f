"""Triton kernels of the token-level (LLM post-training) estimators.

One program scans one response (a row of the right-padded ``[N, T]`` data, or one
sequence of the packed stream between ``cu_seqlens[i]`` and ``cu_seqlens[i + 1]``)
from its end, ``BT`` tokens at a time, the carry going to the next chunk. verl's skip
semantics are two coupled recurrences, scanned together as one affine map of the pair
(A, nv) per token (nv: the next valid value):

    A_t  = m_t (r_t - V_t) + m_t gamma nv_{t+1} + (m_t gamma lambda + 1 - m_t) A_{t+1}
    nv_t = m_t V_t + (1 - m_t) nv_{t+1}

The maps compose associatively (5 numbers each). A chunk is rows of 4 tokens, one row
per thread: each thread composes its row's maps in registers, and one forward
``tl.associative_scan`` over the rows joins them (see the loop's comment for why not a
reverse scan).

Whitening needs the mean and variance over every valid token of the batch: each
program keeps its response's (count, mean, M2) (per row of 4 tokens, combined by Chan et al.'s
pairwise update at its end); :func:`whiten_kernel`'s programs each combine them in
the same fixed order, then normalise in place. No host sync, no atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rl_triton_core._launch import _sm_count

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
def _combine2(p1, q1, x1, y1, z1, p2, q2, x2, y2, z2):
    # the map (A, n) -> (x A + y n + p, z n + q); (.1) is applied first, then (.2)
    return (x2 * p1 + y2 * q1 + p2, z2 * q1 + q2, x2 * x1, x2 * y1 + y2 * z1, z2 * z1)


@triton.jit
def _cols(x):
    """The four columns of a [RW, 4] tensor held whole by each thread (no shuffles)."""
    a, b = tl.split(tl.reshape(x, [x.shape[0], 2, 2]))  # columns (0, 2) and (1, 3)
    c0, c2 = tl.split(a)
    c1, c3 = tl.split(b)
    return c0, c1, c2, c3


@triton.jit
def _loads(R, V, M, t, ok, srt, svt, smt, MODE: tl.constexpr, FP64: tl.constexpr):
    """(mask, reward or x, value) at tokens t (0 where not loaded): rewards are read at
    valid tokens only, values at every token of the row (verl and OpenRLHF use the
    value at masked tokens too)."""
    m = _valid(M, t * smt, ok)
    r = _ld(R, t * srt, m, FP64)
    if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
        v = _ld(V, t * svt, ok, FP64)
    else:
        v = r
    return m, r, v


@triton.jit
def _coefs(m, r, v, ok, g, gl, zero, MODE: tl.constexpr):
    """(p, q, x, y, z): the map (A, n) -> (x A + y n + p, z n + q) of each token, the
    identity where not ``ok``; n is the next valid value (verl), the next masked value
    (OpenRLHF), or unused (returns, statistics)."""
    one = zero + 1.0
    if MODE == MODE_STATS:
        return zero, zero, one, zero, one
    if MODE == MODE_RET_SKIP:
        return tl.where(m, r, 0.0), zero, tl.where(m, g + zero, 1.0), zero, one
    if MODE == MODE_RET_MUL:
        return tl.where(m, r, 0.0), zero, tl.where(ok, g + zero, 1.0), zero, one
    p = tl.where(m, r - v, 0.0)
    q = tl.where(m, v, 0.0)
    if MODE == MODE_GAE_SKIP:
        return (p, q, tl.where(m, gl + zero, 1.0), tl.where(m, g + zero, 0.0),
                tl.where(m, zero, 1.0))
    return (p, q, tl.where(ok, gl + zero, 1.0), tl.where(ok, g + zero, 0.0),
            tl.where(ok, zero, 1.0))


@triton.jit
def _suffixes(p, q, x, y, z):
    """The maps of a row of 4 tokens from each token to the row's end (token 3 applied
    first), sequentially in the thread: ((p, q, x, y, z) of tokens 0..3)."""
    p0, p1, p2, p3 = _cols(p)
    q0, q1, q2, q3 = _cols(q)
    x0, x1, x2, x3 = _cols(x)
    y0, y1, y2, y3 = _cols(y)
    z0, z1, z2, z3 = _cols(z)
    s2 = _combine2(p3, q3, x3, y3, z3, p2, q2, x2, y2, z2)
    s1 = _combine2(s2[0], s2[1], s2[2], s2[3], s2[4], p1, q1, x1, y1, z1)
    s0 = _combine2(s1[0], s1[1], s1[2], s1[3], s1[4], p0, q0, x0, y0, z0)
    return s0, s1, s2, (p3, q3, x3, y3, z3)


@triton.jit
def _chunk(m, r, v, ok, carry, carry_nv, g, gl, zero, MODE: tl.constexpr):
    """The states of a chunk's tokens (RW rows of 4, row 0 the latest) given the state
    (carry, carry_nv) after the later tokens, and the state after the whole chunk.
    Each thread composes its row's maps in registers (token 3 first); a FORWARD scan
    over the rows gives the state after every row, and the state entering row i is the
    one after row i - 1, moved one lane by a gather. (A reverse tl.associative_scan
    flips every operand through five warp shuffles per element: shuffle throughput
    bound the kernel.)"""
    RW: tl.constexpr = zero.shape[0]
    lane = tl.arange(0, RW)
    j = tl.arange(0, 4)[None, :]
    p, q, x, y, zz = _coefs(m, r, v, ok, g, gl, zero, MODE)
    w0, w1, w2, w3 = _suffixes(p, q, x, y, zz)
    pr, qr, xr, yr, zr = tl.associative_scan(w0, 0, _combine2)
    oa = pr + xr * carry + yr * carry_nv  # the state after each row
    on = qr + zr * carry_nv
    prev = tl.maximum(lane - 1, 0)
    ea = tl.where(lane == 0, carry, tl.gather(oa, prev, 0))  # ... and entering it
    en = tl.where(lane == 0, carry_nv, tl.gather(on, prev, 0))
    h1 = w1[0] + w1[2] * ea + w1[3] * en
    h2 = w2[0] + w2[2] * ea + w2[3] * en
    h3 = w3[0] + w3[2] * ea + w3[3] * en
    h = tl.where(j == 0, oa[:, None], tl.where(j == 1, h1[:, None],
                 tl.where(j == 2, h2[:, None], h3[:, None])))
    last = lane == RW - 1  # the chunk's first token: row RW-1, token 0
    return h, tl.sum(tl.where(last, oa, 0.0), axis=0), tl.sum(tl.where(last, on, 0.0), axis=0)


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
def token_scan_kernel(R, V, M, CU, ADV, RET, WS, srn, srt, svn, svt, smn, smt, T, N,
                      g_hi, g_lo, gl_hi, gl_lo,
                      MODE: tl.constexpr, PACKED: tl.constexpr, WHITEN: tl.constexpr,
                      FP64: tl.constexpr, BT: tl.constexpr):
    """One response per program, scanned from its end BT tokens at a time (chunks
    aligned to BT from its start, so loads vectorise). Row bases are 64-bit scalars,
    token offsets 32-bit (the launcher checks a row's extent fits). Inputs by
    (row, token) strides; outputs contiguous (padded: row * T + t; packed: the
    stream's position). WS: the whitening statistics of each response (count, mean,
    M2: [3, N])."""
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
    RW: tl.constexpr = BT // 4
    if FP64:
        zero = tl.zeros([RW, 4], dtype=tl.float64)
    else:
        zero = tl.zeros([RW, 4], dtype=tl.float32)
    g = _num(g_hi, g_lo, FP64)
    gl = _num(gl_hi, gl_lo, FP64)
    i = tl.arange(0, RW)[:, None]
    j = tl.arange(0, 4)[None, :]
    z1 = tl.sum(zero, axis=1)
    z = tl.sum(z1, axis=0)
    carry_nv = z
    carry = z
    # whitening statistics per row of 4 tokens, reduced once at the end: count, and the
    # sum and sum of squares of (h - k), k a shift near the data (no cancellation): the
    # first nonzero carry out of a chunk, an output of the scan itself
    s0 = z1
    s1 = z1
    s2 = z1
    k = z
    n_chunks = tl.cdiv(L, BT)
    t = n_chunks * BT - 4 * (i + 1) + j  # the last chunk's tokens
    ok = t < L
    m, r, v = _loads(R, V, M, t, ok, srt, svt, smt, MODE, FP64)
    for _ in range(0, n_chunks):
        # A chunk is RW rows of 4 consecutive tokens, row 0 the latest, one row per
        # thread (its loads vectorise), scanned by _chunk. The next chunk's loads are
        # issued first, so they are in flight while this one is scanned (one program
        # per response leaves few loads in flight per SM otherwise; past the response's
        # start they load nothing).
        tn = t - BT
        okn = (tn >= 0) & (tn < L)
        mn, rn, vn = _loads(R, V, M, tn, okn, srt, svt, smt, MODE, FP64)
        if MODE == MODE_STATS:
            h = v
        else:
            h, carry, carry_nv = _chunk(m, r, v, ok, carry, carry_nv, g, gl, zero, MODE)
            if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
                tl.store(ADV + t, h.to(ADV.dtype.element_ty), mask=ok)
                if MODE == MODE_GAE_SKIP:
                    tl.store(RET + t, (h + v).to(RET.dtype.element_ty), mask=ok)
                else:
                    tl.store(RET + t, (h + tl.where(m, v, 0.0)).to(RET.dtype.element_ty),
                             mask=ok)
            elif MODE == MODE_RET_SKIP:
                tl.store(ADV + t, tl.where(m, h, 0.0).to(ADV.dtype.element_ty), mask=ok)
            else:
                tl.store(ADV + t, h.to(ADV.dtype.element_ty), mask=ok)
        if WHITEN:
            if MODE == MODE_STATS:  # the chunk's first token (0 where masked)
                pick = tl.sum(tl.sum(tl.where((i == RW - 1) & (j == 0), h, 0.0), axis=1),
                              axis=0)
            else:
                pick = carry
            kn = tl.where(k != 0, k, pick)
            if kn != k:  # once: re-shift what earlier chunks summed with k = 0
                s2 = s2 - 2.0 * kn * s1 + s0 * kn * kn
                s1 = s1 - s0 * kn
                k = kn
            d = tl.where(m, h - k, 0.0)
            s0 += tl.sum(m.to(zero.dtype), axis=1)  # per row of 4: in the thread
            s1 += tl.sum(d, axis=1)
            s2 += tl.sum(d * d, axis=1)
        m, r, v, t, ok = mn, rn, vn, tn, okn
    if WHITEN:
        n_l = s0
        mean_l = tl.where(n_l > 0, k + s1 / tl.maximum(n_l, 1.0), 0.0)
        q_l = tl.maximum(s2 - s1 * s1 / tl.maximum(n_l, 1.0), 0.0)
        cnt, mean, m2 = tl.reduce((n_l, mean_l, q_l), 0, _chan)
    if WHITEN:
        tl.store(WS + row, cnt)
        tl.store(WS + N + row, mean)
        tl.store(WS + 2 * N + row, m2)


@triton.jit
def _whitening(WS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED: tl.constexpr,
               FP64: tl.constexpr, RB: tl.constexpr):
    """Combine the N responses' (count, mean, M2) in a fixed order into the whitening's
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
        nb = tl.load(WS + i, mask=ok, other=0.0)
        mb = tl.load(WS + N + i, mask=ok, other=0.0)
        qb = tl.load(WS + 2 * N + i, mask=ok, other=0.0)
        nb, mb, qb = tl.reduce((nb, mb, qb), 0, _chan)
        cnt, mean, m2 = _chan(cnt, mean, m2, nb, mb, qb)
    ce = _num(ce_hi, ce_lo, FP64)
    eps = _num(eps_hi, eps_lo, FP64)
    mu = mean * cnt / (cnt + ce)
    d = mean - mu
    var = (m2 + cnt * d * d) / (cnt + ce)
    if UNBIASED:
        var = var * (cnt / (cnt - 1.0))
    return mu, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _block(X, M, Y, b, sxn, sxt, smn, smt, T, numel, t_blocks, FILL: tl.constexpr,
           FLAT: tl.constexpr, FP64: tl.constexpr, BLOCK: tl.constexpr):
    """Block b's data, validity (if FILL), output pointers and bounds: FLAT (X and M
    contiguous), blocks of the flat data; else (row, token block) pairs, by strides."""
    if FLAT:
        t = (tl.zeros([BLOCK], tl.int64) + b) * BLOCK + tl.arange(0, BLOCK)  # 64-bit
        ok = t < numel
        x = _ld(X, t, ok, FP64)
        valid = ok
        if FILL:
            valid = _valid(M, t, ok)
        out = Y + t
    else:
        row = tl.zeros([], tl.int64) + b // t_blocks
        t = (b % t_blocks) * BLOCK + tl.arange(0, BLOCK)
        ok = t < tl.where(row * T < numel, T, 0)
        x = _ld(X + row * sxn, t * sxt, ok, FP64)
        valid = ok
        if FILL:
            valid = _valid(M + row * smn, t * smt, ok)
        out = Y + row * T + t
    return x, valid, out, ok


@triton.jit
def whiten_kernel(X, M, Y, WS, N, sxn, sxt, smn, smt, T, numel, n_blocks, t_blocks, fill,
                  ce_hi, ce_lo, eps_hi, eps_lo, NORM: tl.constexpr, SHIFT: tl.constexpr,
                  FILL: tl.constexpr, FLAT: tl.constexpr, UNBIASED: tl.constexpr,
                  FP64: tl.constexpr, BLOCK: tl.constexpr, RB: tl.constexpr):
    """Y = (X - mean) / std (+ mean if not SHIFT) where NORM, at masked tokens ``fill``
    if FILL; Y contiguous [rows, T] (Y may be X). Each program first combines the scan's
    N statistics (the same fixed order in every program: no atomics, no second launch),
    then whitens blocks of BLOCK elements, a grid's width apart. Each block's loads are
    issued before the previous block's (or the statistics') arithmetic, so they are in
    flight meanwhile."""
    b = tl.program_id(0)
    step = tl.num_programs(0)
    x, valid, out, ok = _block(X, M, Y, b, sxn, sxt, smn, smt, T, numel, t_blocks,
                               FILL, FLAT, FP64, BLOCK)
    if NORM:
        mu, rstd = _whitening(WS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED, FP64, RB)
    while b < n_blocks:
        bn = b + step
        lim = tl.where(bn < n_blocks, numel, 0)  # past the last block: nothing loaded
        xn, validn, outn, okn = _block(X, M, Y, bn, sxn, sxt, smn, smt, T, lim, t_blocks,
                                       FILL, FLAT, FP64, BLOCK)
        y = x
        if NORM:
            y = (x - mu) * rstd
            if not SHIFT:
                y = y + mu
        if FILL:
            y = tl.where(valid, y, fill)
        tl.store(out, y.to(Y.dtype.element_ty), mask=ok)
        b = bn
        x, valid, out, ok = xn, validn, outn, okn


def _hilo(x: float):
    """float32 hi and lo parts of a Python float (hi + lo carries ~48 bits)."""
    import numpy as np
    hi = float(np.float32(x))
    return hi, float(np.float32(x - hi))


def config(n_rows: int, n_tokens: int) -> tuple[int, int]:
    """(BT, num_warps) of the scan of ``n_rows`` responses of about ``n_tokens``
    tokens: BT tokens per step."""
    # Measured on the H200 (scripts/token_sweep.py, device time; docs/notes.md): the
    # prefetch of the next chunk paid at every shape (4096x16384 unwhitened 493 -> 392
    # µs); 4096x16384 best at 256 tokens and 2 warps, 1024x8192 at 512 and 2, 256x4096
    # (256 programs, one per response) at 1024 and 8. At 1024 responses, 8 programs
    # must fit on each of the H200's 132 SMs for one wave: 128 registers a thread at
    # most. Splitting the time axis over programs (one chunk each, a look-back over the
    # later chunks' maps) was slower at every setting tried
    if n_rows >= 2048:
        bt, warps = 256, 2
    elif n_rows >= 512:
        bt, warps = 512, 2
    else:
        bt, warps = 1024, 8
    p2 = triton.next_power_of_2(max(int(n_tokens), 1))
    bt = max(128, min(bt, p2))
    return bt, max(1, min(warps, bt // 128))


# (programs per SM at most, BLOCK, num_warps) of the whitening pass: swept on the H200
# (scripts/token_sweep.py --whiten-tiles, docs/notes.md item 63), no setting faster
WHITEN_TILE = (16, 1024, 4)


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
    src = whiten_src if mode == MODE_STATS else r
    for name, t in (("rewards", src), ("values", v), ("mask", m)):
        if t is not None and (n_tok + 1) * t.stride(1) >= 2**31:
            raise ValueError(f"{name}: a response spans {n_tok} tokens of stride "
                             f"{t.stride(1)}, over 2^31 elements; pass it contiguous")
    bt, warps = config(n_rows, n_tok if not packed else n_tok // max(n_rows, 1))
    ws = torch.empty(3 * n_rows, dtype=acc, device=device) if whiten else None
    vv = v if v is not None else src
    if mode != MODE_STATS or whiten:
        token_scan_kernel[(n_rows,)](
            src, vv, m, cu, out0, out1 if out1 is not None else out0, ws,
            src.stride(0), src.stride(1), vv.stride(0), vv.stride(1), m.stride(0), m.stride(1),
            n_tok, n_rows, *_hilo(g), *_hilo(gl),
            MODE=mode, PACKED=packed, WHITEN=whiten, FP64=fp64, BT=bt,
            num_warps=warps)
    if how is None:
        return
    fill = how[4]
    x = whiten_src if mode == MODE_STATS else out0
    numel = out0.numel()
    per_sm, block, w_warps = WHITEN_TILE
    flat = x.is_contiguous() and (fill is None or m.is_contiguous())
    t_blocks = triton.cdiv(n_tok, block)
    n_blocks = triton.cdiv(numel, block) if flat else out0.shape[0] * t_blocks
    ce = _hilo(how[0] if whiten else 0.0)
    ep = _hilo(how[1] if whiten else 0.0)
    whiten_kernel[(max(1, min(n_blocks, per_sm * _sm_count(device))),)](
        x, m, out0, ws, n_rows, x.stride(0), x.stride(1), m.stride(0), m.stride(1), n_tok, numel,
        n_blocks, t_blocks, 0.0 if fill is None else fill, *ce, *ep, NORM=whiten,
        SHIFT=bool(how[3]), FILL=fill is not None, FLAT=flat,
        UNBIASED=bool(how[2]) if whiten else False, FP64=fp64, BLOCK=block,
        RB=max(128, min(2048, triton.next_power_of_2(n_rows))),
        num_warps=w_warps)
