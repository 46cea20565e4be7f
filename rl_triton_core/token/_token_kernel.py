"""Triton kernels of the token-level (LLM post-training) estimators.

One program scans one response (a row of the right-padded ``[N, T]`` data, or one
sequence of the packed stream between ``cu_seqlens[i]`` and ``cu_seqlens[i + 1]``)
from its end, ``BT`` tokens at a time, the carry going to the next chunk. verl's skip
semantics are two coupled recurrences, scanned together as one affine map of the pair
(A, nv) per token (nv: the next valid value):

    A_t  = m_t (r_t - V_t) + m_t gamma nv_{t+1} + (m_t gamma lambda + 1 - m_t) A_{t+1}
    nv_t = m_t V_t + (1 - m_t) nv_{t+1}

The maps compose associatively (5 numbers each). A chunk is rows of 4K consecutive
tokens, one row per thread (K sub-rows of 4, each a vectorised load): each thread
composes its row's maps in registers, one forward ``tl.associative_scan`` over the rows
joins them (see :func:`_chunk` for why not a reverse scan), and each thread then runs
the recurrence itself over its row from the state entering it.

Whitening needs the mean and variance over every valid token of the batch: each
program keeps its response's (count, mean, M2) (from sums shifted by one value near the
data); :func:`whiten_kernel`'s programs each combine them in the same fixed order
(the mean first, then the spread about it), then normalise in place. No host sync, no
atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl

from rl_triton_core import _config, _tl
from rl_triton_core._host import sm_count, split

MODE_GAE_SKIP = tl.constexpr(0)  # verl: advantages and next values carried over masked tokens
MODE_GAE_MUL = tl.constexpr(1)  # OpenRLHF: rewards and values multiplied by the mask
MODE_RET_SKIP = tl.constexpr(2)  # verl REINFORCE++: masked tokens carry the return, output 0
MODE_RET_MUL = tl.constexpr(3)  # OpenRLHF: rewards multiplied by the mask
MODE_STATS = tl.constexpr(4)  # whitening statistics of x only


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
def _uncols(c0, c1, c2, c3):
    """The [RW, 4] tensor of four columns (the inverse of :func:`_cols`, no shuffles)."""
    return tl.reshape(tl.join(tl.join(c0, c2), tl.join(c1, c3)), [c0.shape[0], 4])


@triton.jit
def _loads(R, V, M, t, ok, srt, svt, smt, MODE: tl.constexpr, FP64: tl.constexpr):
    """(mask, reward or x, value) at tokens t (0 where not loaded; loaded under ``ok``,
    so the loads vectorise): rewards count at valid tokens only (:func:`_step` selects
    them), values at every token of the row (verl and OpenRLHF use the value at masked
    tokens too)."""
    m = _tl.flag(M, t * smt, ok)
    r = _tl.load(R, t * srt, ok, FP64)
    if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
        v = _tl.load(V, t * svt, ok, FP64)
    else:
        v = r
    return m, r, v


@triton.jit
def _step(m, r, v, ok, a, n, g, gl, MODE: tl.constexpr):
    """One token's step of the state (A, n) from the one after it: the estimator's whole
    definition in the kernel (n: the next valid value (verl), the next masked value
    (OpenRLHF), unused for returns). Masked tokens: ``m`` False; past the row's end:
    ``ok`` False (the state passes through)."""
    if MODE == MODE_GAE_SKIP:
        return tl.where(m, (r - v) + g * n + gl * a, a), tl.where(m, v, n)
    if MODE == MODE_GAE_MUL:
        return (tl.where(ok, tl.where(m, r - v, 0.0) + g * n + gl * a, a),
                tl.where(ok, tl.where(m, v, 0.0), n))
    if MODE == MODE_RET_SKIP:
        return tl.where(m, r + g * a, a), n
    return tl.where(ok, tl.where(m, r, 0.0) + g * a, a), n  # MODE_RET_MUL


@triton.jit
def _compose(w, m, r, v, ok, g, gl, MODE: tl.constexpr):
    """The map w (A, n) -> (x A + y n + p, z n + q), then one token's step: the step is
    affine in (A, n), so it maps w's constant terms with its own constants, and w's
    coefficients of A and of n without them."""
    o = tl.zeros_like(w[0])
    p, q = _step(m, r, v, ok, w[0], w[1], g, gl, MODE)
    x, _ = _step(m, o, o, ok, w[2], o, g, gl, MODE)
    y, z = _step(m, o, o, ok, w[3], w[4], g, gl, MODE)
    return p, q, x, y, z


@triton.jit
def _chunk(ms, rs, vs, oks, carry, carry_nv, g, gl, zero, MODE: tl.constexpr,
           K: tl.constexpr):
    """The states of a chunk's tokens given the state (carry, carry_nv) after the later
    tokens ([RW] tensors, the same value on every lane), and the state after the whole
    chunk (likewise). The chunk is RW rows (row 0 the latest) of K sub-rows of 4 tokens
    (sub-row 0 the latest), the K-tuples ``ms, rs, vs, oks`` of [RW, 4] tensors; one row
    per thread. Each thread composes its row's steps into
    one map in registers, a FORWARD scan over the rows gives the state after every row,
    and the state entering row i is the one after row i - 1, moved one lane by a gather;
    each thread then runs the steps over its row from there. (A reverse
    tl.associative_scan flips every operand through five warp shuffles per element:
    shuffle throughput bound an earlier version.) Returns the K-tuple of [RW, 4] states
    and the carries."""
    RW: tl.constexpr = zero.shape[0]
    lane = tl.arange(0, RW)
    z1 = tl.zeros([RW], zero.dtype)
    w = (z1, z1, z1 + 1.0, z1, z1 + 1.0)  # the identity map
    for k in tl.static_range(K):
        m0, m1, m2, m3 = _cols(ms[k])
        r0, r1, r2, r3 = _cols(rs[k])
        v0, v1, v2, v3 = _cols(vs[k])
        o0, o1, o2, o3 = _cols(oks[k])
        w = _compose(w, m3, r3, v3, o3, g, gl, MODE)
        w = _compose(w, m2, r2, v2, o2, g, gl, MODE)
        w = _compose(w, m1, r1, v1, o1, g, gl, MODE)
        w = _compose(w, m0, r0, v0, o0, g, gl, MODE)
    pr, qr, xr, yr, zr = tl.associative_scan(w, 0, _combine2)
    oa = pr + xr * carry + yr * carry_nv  # the state after each row
    on = qr + zr * carry_nv
    prev = tl.maximum(lane - 1, 0)
    a = tl.where(lane == 0, carry, tl.gather(oa, prev, 0))  # ... and entering it
    n = tl.where(lane == 0, carry_nv, tl.gather(on, prev, 0))
    hs = ()
    for k in tl.static_range(K):
        m0, m1, m2, m3 = _cols(ms[k])
        r0, r1, r2, r3 = _cols(rs[k])
        v0, v1, v2, v3 = _cols(vs[k])
        o0, o1, o2, o3 = _cols(oks[k])
        h3, n = _step(m3, r3, v3, o3, a, n, g, gl, MODE)
        h2, n = _step(m2, r2, v2, o2, h3, n, g, gl, MODE)
        h1, n = _step(m1, r1, v1, o1, h2, n, g, gl, MODE)
        a, n = _step(m0, r0, v0, o0, h1, n, g, gl, MODE)
        hs = hs + (_uncols(a, h1, h2, h3),)
    # the state after the chunk (row RW-1, its first token), on every lane: a gather (a
    # reduction of the last lane took shuffles and a second exchange between warps)
    first = tl.zeros([RW], tl.int32) + (RW - 1)
    return hs, tl.gather(oa, first, 0), tl.gather(on, first, 0)


@triton.jit
def _tile(R, V, M, top, L, i, j, srt, svt, smt, MODE: tl.constexpr, FP64: tl.constexpr,
          K: tl.constexpr):
    """The loads of the chunk of tokens below ``top``: K-tuples (sub-row k of row i:
    tokens top - 4K(i + 1) + 4(K - 1 - k) + j) of tokens, their bounds, mask, rewards
    and values (nothing loaded outside [0, L))."""
    ts = ()
    oks = ()
    ms = ()
    rs = ()
    vs = ()
    for k in tl.static_range(K):
        t = top - 4 * K * (i + 1) + 4 * (K - 1 - k) + j
        ok = (t >= 0) & (t < L)
        m, r, v = _loads(R, V, M, t, ok, srt, svt, smt, MODE, FP64)
        ts = ts + (t,)
        oks = oks + (ok,)
        ms = ms + (m,)
        rs = rs + (r,)
        vs = vs + (v,)
    return ts, oks, ms, rs, vs


@triton.jit
def _add2(a1, b1, a2, b2):
    return a1 + a2, b1 + b2


@triton.jit
def _add3(a1, b1, c1, a2, b2, c2):
    return a1 + a2, b1 + b2, c1 + c2


@triton.jit
def token_scan_kernel(R, V, M, CU, ADV, RET, WS, srn, srt, svn, svt, smn, smt, T, N,
                      g_hi, g_lo, gl_hi, gl_lo,
                      MODE: tl.constexpr, PACKED: tl.constexpr, WHITEN: tl.constexpr,
                      FP64: tl.constexpr, BT: tl.constexpr, K: tl.constexpr):
    """One response per program, scanned from its end BT tokens at a time (chunks
    aligned to BT from its start, so loads vectorise; each thread holds rows of 4K
    consecutive tokens). Row bases are 64-bit scalars, token offsets 32-bit (the
    launcher checks a row's extent fits). Inputs by (row, token) strides; outputs
    contiguous (padded: row * T + t; packed: the stream's position). WS: the whitening
    statistics of each response (count, mean, M2: [3, N])."""
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
    RW: tl.constexpr = BT // (4 * K)
    if FP64:
        zero = tl.zeros([RW, 4], dtype=tl.float64)
    else:
        zero = tl.zeros([RW, 4], dtype=tl.float32)
    g = _tl.number(g_hi, g_lo, FP64)
    gl = _tl.number(gl_hi, gl_lo, FP64)
    i = tl.arange(0, RW)[:, None]
    j = tl.arange(0, 4)[None, :]
    # constants, not reductions of zero: a reduction's layout conversions put barriers
    # before the first load
    z1 = tl.zeros([RW], zero.dtype)
    carry_nv = z1  # the state after the later tokens, the same on every lane
    carry = z1
    # whitening statistics per row, reduced once at the end: count, and the sum and sum
    # of squares of (h - k), k a shift near the data (no cancellation): the first
    # nonzero carry out of a chunk, an output of the scan itself
    s0 = z1
    s1 = z1
    s2 = z1
    k = z1
    n_chunks = tl.cdiv(L, BT)
    top = n_chunks * BT  # the last chunk's end
    ts, oks, ms, rs, vs = _tile(R, V, M, top, L, i, j, srt, svt, smt, MODE, FP64, K)
    for _ in range(0, n_chunks):
        # the next chunk's loads first, in flight while this one is scanned (one program
        # per response leaves few loads in flight per SM otherwise; past the response's
        # start they load nothing)
        nxt = _tile(R, V, M, top - BT, L, i, j, srt, svt, smt, MODE, FP64, K)
        if MODE == MODE_STATS:
            hs = vs
        else:
            hs, carry, carry_nv = _chunk(ms, rs, vs, oks, carry, carry_nv, g, gl, zero,
                                         MODE, K)
            for u in tl.static_range(K):
                h = hs[u]
                if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
                    tl.store(ADV + ts[u], h.to(ADV.dtype.element_ty), mask=oks[u])
                    if MODE == MODE_GAE_SKIP:
                        ret = h + vs[u]
                    else:
                        ret = h + tl.where(ms[u], vs[u], 0.0)
                    tl.store(RET + ts[u], ret.to(RET.dtype.element_ty), mask=oks[u])
                elif MODE == MODE_RET_SKIP:
                    tl.store(ADV + ts[u], tl.where(ms[u], h, 0.0).to(ADV.dtype.element_ty),
                             mask=oks[u])
                else:
                    tl.store(ADV + ts[u], h.to(ADV.dtype.element_ty), mask=oks[u])
        if WHITEN:
            if MODE == MODE_STATS:  # the chunk's first token (0 where masked)
                first = (i == RW - 1) & (j == 0) & ms[K - 1]
                pick = z1 + tl.sum(tl.sum(tl.where(first, hs[K - 1], 0.0), axis=1), axis=0)
            else:
                pick = carry
            # k: the first nonzero carry; what earlier chunks summed with k = 0 is
            # re-shifted to it (dk = 0 on every other chunk)
            kn = tl.where(k != 0, k, pick)
            dk = kn - k
            s2 = s2 - 2.0 * dk * s1 + s0 * dk * dk
            s1 = s1 - s0 * dk
            k = kn
            for u in tl.static_range(K):
                d = tl.where(ms[u], hs[u] - k[:, None], 0.0)
                s0 += tl.sum(ms[u].to(zero.dtype), axis=1)  # per row: in the thread
                s1 += tl.sum(d, axis=1)
                s2 += tl.sum(d * d, axis=1)
        ts, oks, ms, rs, vs = nxt
        top -= BT
    if WHITEN:
        # every row's sums share the shift k: one sum over the rows
        cnt, t1, t2 = tl.reduce((s0, s1, s2), 0, _add3)
        k0 = tl.sum(tl.where(tl.arange(0, RW) == 0, k, 0.0), axis=0)  # lane 0's (all equal)
        mean = tl.where(cnt > 0, k0 + t1 / tl.maximum(cnt, 1.0), 0.0)
        m2 = tl.maximum(t2 - t1 * t1 / tl.maximum(cnt, 1.0), 0.0)
        tl.store(WS + row, cnt)
        tl.store(WS + N + row, mean)
        tl.store(WS + 2 * N + row, m2)


@triton.jit
def _whitening(WS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED: tl.constexpr,
               FP64: tl.constexpr, RB: tl.constexpr):
    """Combine the N responses' (count, mean, M2) in a fixed order into the whitening's
    mean and 1/std as the frameworks define them:
    mean = S / (n + count_eps), var = sum (x - mean)^2 / (n + count_eps) [* n / (n - 1)]."""
    # mean = sum n_i mean_i / n, then M2 = sum M2_i + n_i (mean_i - mean)^2: two sums,
    # no division per pair (the mean's rounding enters M2 to second order only)
    lane = tl.arange(0, RB)
    ok = lane < N
    n0 = tl.load(WS + lane, mask=ok, other=0.0)
    m0 = tl.load(WS + N + lane, mask=ok, other=0.0)
    q0 = tl.load(WS + 2 * N + lane, mask=ok, other=0.0)
    cnt, tot = tl.reduce((n0, n0 * m0), 0, _add2)
    for s in range(RB, N, RB):
        i = s + lane
        nb = tl.load(WS + i, mask=i < N, other=0.0)
        mb = tl.load(WS + N + i, mask=i < N, other=0.0)
        c, t = tl.reduce((nb, nb * mb), 0, _add2)
        cnt += c
        tot += t
    mean = tl.where(cnt > 0, tot / tl.maximum(cnt, 1.0), 0.0)
    m2 = tl.sum(q0 + n0 * (m0 - mean) * (m0 - mean), axis=0)
    for s in range(RB, N, RB):
        i = s + lane
        nb = tl.load(WS + i, mask=i < N, other=0.0)
        mb = tl.load(WS + N + i, mask=i < N, other=0.0)
        qb = tl.load(WS + 2 * N + i, mask=i < N, other=0.0)
        m2 += tl.sum(qb + nb * (mb - mean) * (mb - mean), axis=0)
    ce = _tl.number(ce_hi, ce_lo, FP64)
    eps = _tl.number(eps_hi, eps_lo, FP64)
    mu = mean * cnt / (cnt + ce)
    d = mean - mu
    var = (m2 + cnt * d * d) / (cnt + ce)
    if UNBIASED:  # one valid token: no unbiased variance, NaN (as the CPU path)
        var = tl.where(cnt == 1.0, float("nan"), var * (cnt / (cnt - 1.0)))
    return mu, 1.0 / tl.sqrt(var + eps)


@triton.jit
def _place(b, T, numel, t_blocks, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    """Block b's (row, token offsets, bounds): FLAT, blocks of the flat data (row 0,
    64-bit offsets); else (row, token block) pairs."""
    if FLAT:
        row = tl.zeros([], tl.int64)
        t = (tl.zeros([BLOCK], tl.int64) + b) * BLOCK + tl.arange(0, BLOCK)
        ok = t < numel
    else:
        row = tl.zeros([], tl.int64) + b // t_blocks
        t = (b % t_blocks) * BLOCK + tl.arange(0, BLOCK)
        ok = t < tl.where(row * T < numel, T, 0)
    return row, t, ok


@triton.jit
def _block(X, M, b, sxn, sxt, smn, smt, T, numel, t_blocks, FILL: tl.constexpr,
           FLAT: tl.constexpr, FP64: tl.constexpr, BLOCK: tl.constexpr):
    """Block b's data and validity (if FILL; X and M by strides unless FLAT)."""
    row, t, ok = _place(b, T, numel, t_blocks, FLAT, BLOCK)
    if FLAT:
        x = _tl.load(X, t, ok, FP64)
    else:
        x = _tl.load(X + row * sxn, t * sxt, ok, FP64)
    valid = ok
    if FILL:
        if FLAT:
            valid = _tl.flag(M, t, ok)
        else:
            valid = _tl.flag(M + row * smn, t * smt, ok)
    return x, valid


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
    flight meanwhile; only the data is carried to the next step (its pointers and bounds
    are recomputed there: carried, they took a layout conversion through shared memory
    each step)."""
    b = tl.program_id(0)
    step = tl.num_programs(0)
    x, valid = _block(X, M, b, sxn, sxt, smn, smt, T, numel, t_blocks, FILL, FLAT, FP64,
                      BLOCK)
    if NORM:
        mu, rstd = _whitening(WS, N, ce_hi, ce_lo, eps_hi, eps_lo, UNBIASED, FP64, RB)
    while b < n_blocks:
        bn = b + step
        lim = tl.where(bn < n_blocks, numel, 0)  # past the last block: nothing loaded
        xn, validn = _block(X, M, bn, sxn, sxt, smn, smt, T, lim, t_blocks, FILL, FLAT,
                            FP64, BLOCK)
        y = x
        if NORM:
            y = (x - mu) * rstd
            if not SHIFT:
                y = y + mu
        if FILL:
            y = tl.where(valid, y, fill)
        row, t, ok = _place(b, T, numel, t_blocks, FLAT, BLOCK)
        tl.store(Y + row * T + t, y.to(Y.dtype.element_ty), mask=ok)
        b = bn
        x, valid = xn, validn


@triton.jit
def token_small_kernel(R, V, M, ADV, RET, srn, srt, svn, svt, smn, smt, T, N,
                       g_hi, g_lo, gl_hi, gl_lo, ce_hi, ce_lo, eps_hi, eps_lo, fill,
                       MODE: tl.constexpr, NORM: tl.constexpr, SHIFT: tl.constexpr,
                       FILL: tl.constexpr, UNBIASED: tl.constexpr, FP64: tl.constexpr,
                       BR: tl.constexpr, BT: tl.constexpr):
    """A small padded batch (N <= BR responses of T <= BT tokens) whitened or filled in
    one program, where the two kernels above take two launches and a workspace: each
    token's step as a map of the state (:func:`_compose`), a reverse scan of the maps
    along the tokens (the state entering each token from (0, 0) after the row's end),
    then the whitening's statistics over every valid token of the batch in registers
    (two passes: the mean, then the spread about it; :func:`_whitening`'s formulas), and
    the outputs stored once. Outputs contiguous [N, T]; MODE_STATS whitens x (R)."""
    rows = tl.arange(0, BR).to(tl.int64)[:, None]
    t = tl.arange(0, BT)[None, :]
    ok = (rows < N) & (t < T)
    m = _tl.flag(M + rows * smn, t * smt, ok)
    r = _tl.load(R + rows * srn, t * srt, ok, FP64)
    if MODE == MODE_GAE_SKIP or MODE == MODE_GAE_MUL:
        v = _tl.load(V + rows * svn, t * svt, ok, FP64)
    else:
        v = r
    if MODE == MODE_STATS:
        h = r
    else:
        g = _tl.number(g_hi, g_lo, FP64)
        gl = _tl.number(gl_hi, gl_lo, FP64)
        z = tl.zeros_like(r)
        w = _compose((z, z, z + 1.0, z, z + 1.0), m, r, v, ok, g, gl, MODE)
        h, _, _, _, _ = tl.associative_scan(w, 1, _combine2, reverse=True)
    y = h
    valid = m & ok
    if NORM:
        one = tl.where(valid, 1.0, 0.0).to(h.dtype)
        cnt = tl.sum(tl.sum(one, axis=1), axis=0)
        tot = tl.sum(tl.sum(tl.where(valid, h, 0.0), axis=1), axis=0)
        mean = tl.where(cnt > 0, tot / tl.maximum(cnt, 1.0), 0.0)
        dv = tl.where(valid, h - mean, 0.0)
        m2 = tl.sum(tl.sum(dv * dv, axis=1), axis=0)
        ce = _tl.number(ce_hi, ce_lo, FP64)
        eps = _tl.number(eps_hi, eps_lo, FP64)
        mu = mean * cnt / (cnt + ce)
        d = mean - mu
        var = (m2 + cnt * d * d) / (cnt + ce)
        if UNBIASED:  # one valid token: no unbiased variance, NaN (as the CPU path)
            var = tl.where(cnt == 1.0, float("nan"), var * (cnt / (cnt - 1.0)))
        rstd = 1.0 / tl.sqrt(var + eps)
        y = (h - mu) * rstd
        if not SHIFT:
            y = y + mu
    if FILL:
        y = tl.where(valid, y, fill)
    o = rows * T + t
    tl.store(ADV + o, y.to(ADV.dtype.element_ty), mask=ok)
    if MODE == MODE_GAE_SKIP:
        tl.store(RET + o, (h + v).to(RET.dtype.element_ty), mask=ok)
    if MODE == MODE_GAE_MUL:
        tl.store(RET + o, (h + tl.where(m, v, 0.0)).to(RET.dtype.element_ty), mask=ok)


def config(n_rows: int, n_tokens: int) -> tuple[int, int, int]:
    """(BT, num_warps, K) of the scan of ``n_rows`` responses of about ``n_tokens``
    tokens: BT tokens per step, rows of 4K consecutive tokens per thread (BT a multiple
    of 4K, all powers of two)."""
    # Measured on the H200 (token_sweep.py at 50f9ca7, device time; docs/notes.md, "Token
    # kernel"): the prefetch of the next chunk paid at every shape; 4096x16384 best at
    # 256 tokens and 2 warps, 1024x8192 at 512 and 2, 256x4096 (256 programs, one per
    # response) at 1024 and 8, all with rows of 4 tokens (K = 1): longer rows (K = 2, 4)
    # cut the instructions but were slower at every shape (fewer loads in flight, more
    # registers). At 1024 responses, 8 programs must fit on each of the H200's 132 SMs
    # for one wave: 128 registers a thread at most (capping them with maxnreg changed
    # nothing measurable). Splitting the time axis over programs (one chunk each, a
    # look-back over the later chunks' maps) was slower at every setting tried
    if n_rows >= 2048:
        bt, warps, k = 256, 2, 1
    elif n_rows >= 512:
        bt, warps, k = 512, 2, 1
    else:
        bt, warps, k = 1024, 8, 1
    p2 = triton.next_power_of_2(max(int(n_tokens), 1))
    bt = max(128, min(bt, p2))
    return bt, max(1, min(warps, bt // 128)), k


# (programs per SM at most, BLOCK, num_warps) of the whitening pass: swept on the H200
# (token_sweep.py at 50f9ca7; docs/notes.md, "Token whitening pass"): no setting faster
WHITEN_TILE = (16, 1024, 4)


def run(mode, r, v, m, cu, g, gl, out0, out1, how, whiten_src):
    """Launch the scan (and the whitening) on ``[R, P]`` views; outputs ``[R, P]``
    contiguous. ``how``: None or (count_eps, eps, unbiased, shift, fill).

    Returns the launches, ``[(kernel, compiled kernel, grid, constexprs, arguments)]``,
    and the scratch tensors it allocated, ``[(tensor, zeroed)]``: what a recorded launch
    (``tokens``) repeats."""
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
    if how is not None and not packed and mode in (MODE_GAE_SKIP, MODE_GAE_MUL, MODE_STATS):
        br, btp = triton.next_power_of_2(n_rows), max(16, triton.next_power_of_2(n_tok))
        if br * btp <= _config.current_tuning().small_tokens:
            return _run_small(mode, src, v, m, g, gl, out0, out1, how, br, btp, fp64), []
    bt, warps, k = config(n_rows, n_tok if not packed else n_tok // max(n_rows, 1))
    ws = torch.empty(3 * n_rows, dtype=acc, device=device) if whiten else None
    scratch = [] if ws is None else [(ws, False)]
    vv = v if v is not None else src
    # half-precision advantages that are whitened next: the scan stores them in the
    # accumulation dtype, so the whitened result rounds once (not the rounded advantages
    # read back and rounded again)
    adv = out0
    if whiten and mode != MODE_STATS and out0.dtype in (torch.float16, torch.bfloat16):
        adv = torch.empty(out0.shape, dtype=acc, device=device)
        scratch.append((adv, False))
    launched = []
    if mode != MODE_STATS or whiten:
        (g_hi, g_lo), (gl_hi, gl_lo) = split(g), split(gl)
        kw = dict(R=src, V=vv, M=m, CU=cu, ADV=adv, RET=out1 if out1 is not None else out0,
                  WS=ws, srn=src.stride(0), srt=src.stride(1), svn=vv.stride(0),
                  svt=vv.stride(1), smn=m.stride(0), smt=m.stride(1), T=n_tok, N=n_rows,
                  g_hi=g_hi, g_lo=g_lo, gl_hi=gl_hi, gl_lo=gl_lo)
        consts = dict(MODE=mode, PACKED=packed, WHITEN=whiten, FP64=fp64, BT=bt, K=k)
        grid = (n_rows, 1)
        compiled, args = _tl.launch(token_scan_kernel, grid, kw, consts, warps)
        launched.append((token_scan_kernel, compiled, grid, consts, args))
    if how is None:
        return launched, scratch
    fill = how[4]
    x = whiten_src if mode == MODE_STATS else adv
    numel = out0.numel()
    per_sm, block, w_warps = WHITEN_TILE
    flat = x.is_contiguous() and (fill is None or m.is_contiguous())
    t_blocks = triton.cdiv(n_tok, block)
    n_blocks = triton.cdiv(numel, block) if flat else out0.shape[0] * t_blocks
    ce_hi, ce_lo = split(how[0] if whiten else 0.0)
    eps_hi, eps_lo = split(how[1] if whiten else 0.0)
    kw = dict(X=x, M=m, Y=out0, WS=ws, N=n_rows, sxn=x.stride(0), sxt=x.stride(1),
              smn=m.stride(0), smt=m.stride(1), T=n_tok, numel=numel, n_blocks=n_blocks,
              t_blocks=t_blocks, fill=0.0 if fill is None else fill, ce_hi=ce_hi, ce_lo=ce_lo,
              eps_hi=eps_hi, eps_lo=eps_lo)
    consts = dict(NORM=whiten, SHIFT=bool(how[3]), FILL=fill is not None, FLAT=flat,
                  UNBIASED=bool(how[2]) if whiten else False, FP64=fp64, BLOCK=block,
                  RB=max(128, min(2048, triton.next_power_of_2(n_rows))))
    grid = (max(1, min(n_blocks, per_sm * sm_count(device))), 1)
    compiled, args = _tl.launch(whiten_kernel, grid, kw, consts, w_warps)
    launched.append((whiten_kernel, compiled, grid, consts, args))
    return launched, scratch


def _run_small(mode, src, v, m, g, gl, out0, out1, how, br, bt, fp64):
    """:func:`token_small_kernel`'s launch for ``run`` (one program)."""
    whiten = how[0] is not None
    (g_hi, g_lo), (gl_hi, gl_lo) = split(g), split(gl)
    ce_hi, ce_lo = split(how[0] if whiten else 0.0)
    eps_hi, eps_lo = split(how[1] if whiten else 0.0)
    vv = v if v is not None else src
    kw = dict(R=src, V=vv, M=m, ADV=out0, RET=out1 if out1 is not None else out0,
              srn=src.stride(0), srt=src.stride(1), svn=vv.stride(0), svt=vv.stride(1),
              smn=m.stride(0), smt=m.stride(1), T=src.shape[1], N=src.shape[0],
              g_hi=g_hi, g_lo=g_lo, gl_hi=gl_hi, gl_lo=gl_lo, ce_hi=ce_hi, ce_lo=ce_lo,
              eps_hi=eps_hi, eps_lo=eps_lo, fill=0.0 if how[4] is None else how[4])
    consts = dict(MODE=mode, NORM=whiten, SHIFT=bool(how[3]), FILL=how[4] is not None,
                  UNBIASED=bool(how[2]) if whiten else False, FP64=fp64, BR=br, BT=bt)
    grid = (1, 1)
    compiled, args = _tl.launch(token_small_kernel, grid, kw, consts, 4 if br * bt <= 2048 else 8)
    return [(token_small_kernel, compiled, grid, consts, args)]
