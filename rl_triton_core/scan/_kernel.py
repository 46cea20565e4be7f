"""The one Triton kernel: a chunked affine scan with coefficients built in registers.

    backward (REVERSE): h_t = alpha_t + beta_t * h_{t+1},  h_T     = init (0)
    forward:            h_t = alpha_t + beta_t * h_{t-1},  h_{-1}  = init (0)

A program owns BLOCK_N streams and walks its time range in BLOCK_T chunks,
carrying h across chunks, so T is unbounded. Inside a chunk the (alpha, beta)
pairs are combined with ``tl.associative_scan``. Every estimator is one MODE with
its own coefficient builder (``_gae``, ``_vtrace``, ...: each returns exactly the
terms it names) and its own store; both read the raw inputs in registers, one pass
over memory. Every tensor is addressed as [N1, N2, T] (``_layout``), so time-major,
batch-major, trailing features and broadcast flags all run without a copy.

The interface is lean: an absent input is ``None`` (a compile-time constant, so
its code is not generated), a scalar coefficient is one float32 (its low part
rides in ``LO`` for float64 data only), and the strides come in one tuple ``STR``:
three shared by the outputs and every data input where they all agree (UNIFORM,
the common case, with the no-time inputs contiguous), else three per data slot and
two per no-time slot in the order of ``_table.STRIDE_SLOTS``.

When there are too few streams to fill the GPU (a flat RLlib stream, 16 long
sequences), the time axis is also split into S segments (grid axis 1):
PHASE 1 stores each segment's composed map (A, B) in a workspace, PHASE 3 (one
program per stream block) composes those maps once, in time order, into the
carry leaving each segment, and PHASE 2 scans each segment again from the carry
entering it and writes the outputs. PHASE 0 is the single-pass case (S = 1).
Where all programs fit on the GPU at once, PHASE 4 does it in one launch instead:
a chunk per program, the carry from a look-back over the other programs' maps
(``_look_back``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from rl_triton_core import _table, _tl

LINREC = tl.constexpr(_table.MODE_LINREC)
GAE = tl.constexpr(_table.MODE_GAE)
TDLAMBDA = tl.constexpr(_table.MODE_TDLAMBDA)
TRACE = tl.constexpr(_table.MODE_TRACE)
VTRACE = tl.constexpr(_table.MODE_VTRACE)
RETRACE = tl.constexpr(_table.MODE_RETRACE)
GAE_BWD = tl.constexpr(_table.MODE_GAE_BWD)
TD_BWD = tl.constexpr(_table.MODE_TD_BWD)
VTRACE_BWD = tl.constexpr(_table.MODE_VTRACE_BWD)

# each slot's place in a per-slot (non-uniform) STR, in _table.STRIDE_SLOTS' order
K_OUT = tl.constexpr(_table.STRIDE_SLOTS.index("out"))
K_X = tl.constexpr(_table.STRIDE_SLOTS.index("x"))
K_V = tl.constexpr(_table.STRIDE_SLOTS.index("v"))
K_NV = tl.constexpr(_table.STRIDE_SLOTS.index("nv"))
K_TERM = tl.constexpr(_table.STRIDE_SLOTS.index("term"))
K_TRUNC = tl.constexpr(_table.STRIDE_SLOTS.index("trunc"))
K_RHO = tl.constexpr(_table.STRIDE_SLOTS.index("rho"))
K_G = tl.constexpr(_table.STRIDE_SLOTS.index("g"))
K_LM = tl.constexpr(_table.STRIDE_SLOTS.index("lm"))
K_RB = tl.constexpr(_table.STRIDE_SLOTS.index("rb"))
K_CB = tl.constexpr(_table.STRIDE_SLOTS.index("cb"))
K_PB = tl.constexpr(_table.STRIDE_SLOTS.index("pb"))
K_BOOT = tl.constexpr(_table.STRIDE_SLOTS.index("boot"))
K_INIT = tl.constexpr(_table.STRIDE_SLOTS.index("init"))


@triton.jit
def _combine(a1, b1, a2, b2):
    # (a1, b1) is applied first, then (a2, b2): h -> a2 + b2 * (a1 + b1 * h). A zero beta
    # drops the carry (h -> a, also for a NaN or inf h: a done flag cuts everything), so
    # a zero b2 makes the composed map constant (b = 0 even where b1 is NaN or inf). A
    # zero b1 with an infinite b2 gives b = NaN, not 0: only an infinite beta inside one
    # episode sees it (its non-finite output stays non-finite); not tested, to keep the
    # combine at one compare and two selects
    cut = b2 == 0
    return tl.where(cut, a2, a2 + b2 * a1), tl.where(cut, 0.0, b1 * b2)


@triton.jit
def _apply(a, b, h):
    """The map (a, b) applied to the carry h: a + b * h, exactly a where b == 0."""
    return tl.where(b == 0, a, a + b * h)


@triton.jit
def _offset(K: tl.constexpr, STR, o1, o2, t, UNIFORM: tl.constexpr):
    """Element offset of [n1, n2, t] in data slot K."""
    if UNIFORM:
        return o1 * STR[0] + o2 * STR[1] + t * STR[2]
    else:
        return o1 * STR[3 * K] + o2 * STR[3 * K + 1] + t * STR[3 * K + 2]


@triton.jit
def _offset_notime(K: tl.constexpr, STR, n1, n2, N2, UNIFORM: tl.constexpr):
    """Element offset of [n1, n2] in no-time slot K (contiguous where UNIFORM)."""
    if UNIFORM:
        return n1 * N2 + n2
    else:
        # after three strides for each data slot (K_OUT .. K_PB), two per no-time slot
        return n1 * STR[3 * K_BOOT + 2 * (K - K_BOOT)] + n2 * STR[3 * K_BOOT + 2 * (K - K_BOOT) + 1]


@triton.jit
def _ld(P, K: tl.constexpr, STR, o1, o2, t, m, UNIFORM: tl.constexpr, FP64: tl.constexpr):
    return _tl.load(P, _offset(K, STR, o1, o2, t, UNIFORM), m, FP64)


@triton.jit
def _ld_flag(P, K: tl.constexpr, STR, o1, o2, t, m, UNIFORM: tl.constexpr,
             FP64: tl.constexpr):
    """A flag as 0/1: nonzero means set, as ``flag.bool()`` reads it (2.0, -1 and NaN
    are set), whatever its dtype."""
    set_ = _tl.flag(P, _offset(K, STR, o1, o2, t, UNIFORM), m)
    if FP64:
        return set_.to(tl.float64)
    else:
        return set_.to(tl.float32)


@triton.jit
def _coef(P, K: tl.constexpr, s, LO, LI: tl.constexpr, STR, o1, o2, t, m,
          UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """A coefficient at step t: its tensor P, else the scalar s (float64: s + LO[LI]);
    1 where the estimator has none (s None)."""
    if P is not None:
        return _ld(P, K, STR, o1, o2, t, m, UNIFORM, FP64)
    elif s is None:
        return 1.0
    elif FP64:  # (LO is None for other data)
        return _tl.number(s, LO[LI], FP64)
    else:
        return s


@triton.jit
def _exp(x, FP64: tl.constexpr):
    """exp; in float64 by range reduction and a degree-13 Taylor polynomial, since
    tl.exp of a float64 is only float32-accurate on CUDA (seen with triton 3.6)."""
    if FP64:
        xc = tl.minimum(tl.maximum(x, -708.0), 709.0)
        k = tl.floor(xc * 1.4426950408889634 + 0.5)
        r = xc - k * 6.93147180369123816490e-01 - k * 1.90821492927058770002e-10
        p = 1.0 / 6227020800.0
        p = p * r + 1.0 / 479001600.0
        p = p * r + 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        scale = ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)
        return tl.where(x != x, x, p * scale)
    else:
        return tl.exp(x)


@triton.jit
def _prefetch(P, K: tl.constexpr, STR, n1, n2, t, m, UNIFORM: tl.constexpr):
    """Ask L2 for the line of each stream's step ``t`` (``[BLOCK_N]``) of slot K; nothing
    is loaded into registers (PTX ``prefetch.global.L2``; CUDA only)."""
    if P is not None:
        off = _offset(K, STR, n1, n2, t, UNIFORM)
        addr = tl.where(m, P + off, P).to(tl.int64)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [addr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _column(h, cols, idx):
    return tl.sum(tl.where(cols == idx, h, 0.0), axis=1)


@triton.jit
def _sub_scan(alpha, beta, C: tl.constexpr, SUB: tl.constexpr):
    """The scan of a time-major tile split along time: ``[BLOCK_N, C, SUB]``, the steps
    in scan order along axis 1 within a sub-chunk and the SUB sub-chunks along axis 2
    (Triton's layout puts the streams' vectors and then the sub-chunks on the lanes, and
    each thread's C steps in its registers). Returns the maps (A, B) within each
    sub-chunk, the map (ea, eb) ``[BLOCK_N, SUB]`` of the sub-chunks before each one (the
    identity before the first) and the chunk's whole map (ga, gb) ``[BLOCK_N]``. Only the
    SUB sub-chunk maps cross lanes. The selections add -0.0, the exact identity of
    addition, so each picked value keeps its bits."""
    A, B = tl.associative_scan((alpha, beta), 1, _combine)
    last = tl.arange(0, C)[None, :, None] == C - 1
    sa = tl.sum(tl.where(last, A, -0.0), axis=1)
    sb = tl.sum(tl.where(last, B, -0.0), axis=1)
    ia, ib = tl.associative_scan((sa, sb), 1, _combine)  # through each sub-chunk
    w = tl.arange(0, SUB)[None, :]
    prev = tl.maximum(w - 1, 0) + tl.zeros(ia.shape, tl.int32)  # the sub-chunk before
    ea = tl.where(w == 0, -0.0, tl.gather(ia, prev, 1))
    eb = tl.where(w == 0, 1.0, tl.gather(ib, prev, 1))
    ga = tl.sum(tl.where(w == SUB - 1, ia, -0.0), axis=1)
    gb = tl.sum(tl.where(w == SUB - 1, ib, -0.0), axis=1)
    return A, B, ea, eb, ga, gb


@triton.jit
def _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, tt, m_flags, m_coef,
          UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """(terminated, done, gamma, lambda) of step ``tt`` (t, or t-1 in the forward scans)."""
    term = _ld_flag(TERM, K_TERM, STR, o1, o2, tt, m_flags, UNIFORM, FP64)
    if TRUNC is not None:
        done = tl.maximum(term, _ld_flag(TRUNC, K_TRUNC, STR, o1, o2, tt, m_flags, UNIFORM,
                                         FP64))
    else:
        done = term
    gamma = _coef(G, K_G, g, LO, 0, STR, o1, o2, tt, m_coef, UNIFORM, FP64)
    lmbda = _coef(LM, K_LM, lm, LO, 1, STR, o1, o2, tt, m_coef, UNIFORM, FP64)
    return term, done, gamma, lmbda


@triton.jit
def _next_value(V, NV, boot, STR, o1, o2, t, m, T, UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """(V_t, V_{t+1} (0 past the end), V'_t): next_values if given, else V_{t+1}, and at
    t = T-1 the bootstrap value (0 without one)."""
    if V is not None:
        v = _ld(V, K_V, STR, o1, o2, t, m, UNIFORM, FP64)
        vnext = _ld(V, K_V, STR, o1, o2, t + 1, m & (t + 1 < T), UNIFORM, FP64)
    else:
        v = 0.0
        vnext = 0.0
    if NV is not None:
        nv = _ld(NV, K_NV, STR, o1, o2, t, m, UNIFORM, FP64)
    else:
        nv = tl.where(t == T - 1, boot, vnext)
    return v, vnext, nv


# ------------------------------------------------------------- coefficient builders
# One per mode: (alpha, beta) of h_t = alpha_t + beta_t h_{t+-1}, then the terms that
# mode's store needs. ``boot`` is V'_{T-1} of the shifted form, [BLOCK_N, 1].


@triton.jit
def _linrec(X, V, STR, o1, o2, t, m, UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """alpha_t = X_t, beta_t = V_t (the primitive)."""
    return (_ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64),
            _ld(V, K_V, STR, o1, o2, t, m, UNIFORM, FP64))


@triton.jit
def _trace(X, TERM, G, LM, g, lm, LO, STR, o1, o2, t, m, UNIFORM: tl.constexpr,
           FP64: tl.constexpr, REVERSE: tl.constexpr):
    """Forward: z_t = x_t + gamma_{t-1} lambda_{t-1} (1 - done_{t-1}) z_{t-1}; REVERSE
    (its adjoint): u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1}. (alpha, beta)."""
    if REVERSE:
        tp = t
        m_p = m
    else:
        tp = tl.maximum(t - 1, 0)
        m_p = m & (t >= 1)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    term_p, done_p, gamma, lmbda = _step(TERM, None, G, LM, g, lm, LO, STR, o1, o2, tp, m_p, m,
                                         UNIFORM, FP64)
    return x, tl.where(done_p != 0, 0.0, gamma * lmbda)


@triton.jit
def _gae(X, V, NV, TERM, TRUNC, G, LM, boot, g, lm, LO, STR, o1, o2, t, m, T,
         UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """alpha_t = r_t + gamma (1 - term_t) V'_t - V_t, beta_t = gamma lambda (1 - done_t);
    then V_t (the targets add it). Every (1 - flag) x is a select where(flag, 0, x) here
    and below (0 * NaN is NaN: a done flag cuts everything)."""
    term, done, gamma, lmbda = _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, t, m, m,
                                     UNIFORM, FP64)
    v, vnext, nv = _next_value(V, NV, boot, STR, o1, o2, t, m, T, UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    return x + tl.where(term != 0, 0.0, gamma * nv) - v, tl.where(done != 0, 0.0, gamma * lmbda), v


@triton.jit
def _tdlambda(X, V, NV, TERM, TRUNC, G, LM, boot, g, lm, LO, STR, o1, o2, t, m, T,
              UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """G_t = r_t + gamma (1 - term_t) [(1 - lambda c_t) V'_t + lambda c_t G_{t+1}],
    c_t = 1 - done_t (0 at T-1): (alpha, beta)."""
    term, done, gamma, lmbda = _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, t, m, m,
                                     UNIFORM, FP64)
    v, vnext, nv = _next_value(V, NV, boot, STR, o1, o2, t, m, T, UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    lc = tl.where((t == T - 1) | (done != 0), 0.0, lmbda)  # lambda c_t
    cut = term != 0
    return x + tl.where(cut, 0.0, gamma * (1.0 - lc) * nv), tl.where(cut, 0.0, gamma * lc)


@triton.jit
def _vtrace(X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO, STR,
            o1, o2, t, m, T, UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """alpha_t = rho_t (r_t + gamma (1 - term_t) V'_t - V_t), beta_t = gamma (1 - done_t)
    c_t; then V_t and pg_t = p0 + [cont] p1 (vnext + D_{t+1}): (v, p0, p1, vnext, cont)."""
    term, done, gamma, lmbda = _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, t, m, m,
                                     UNIFORM, FP64)
    v, vnext, nv = _next_value(V, NV, boot, STR, o1, o2, t, m, T, UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    ratio = _exp(_ld(RHO, K_RHO, STR, o1, o2, t, m, UNIFORM, FP64), FP64)
    rho = tl.minimum(ratio, _coef(RB, K_RB, rb, LO, 2, STR, o1, o2, t, m, UNIFORM, FP64))
    c = lmbda * tl.minimum(ratio, _coef(CB, K_CB, cb, LO, 3, STR, o1, o2, t, m, UNIFORM, FP64))
    pgrho = tl.minimum(ratio, _coef(PB, K_PB, pb, LO, 4, STR, o1, o2, t, m, UNIFORM, FP64))
    bnv = tl.where(term != 0, 0.0, gamma * nv)
    cont = (done == 0.0) & (t < T - 1)
    p0 = pgrho * (x - v + tl.where(cont, 0.0, bnv))
    # p1 is read only where cont (not terminated): pgrho gamma
    return (rho * (x + bnv - v), tl.where(done != 0, 0.0, gamma * c), v, p0, pgrho * gamma,
            vnext, cont)


@triton.jit
def _retrace(X, V, NV, TERM, TRUNC, RHO, G, LM, CB, g, lm, cb, LO, STR, o1, o2, t, m, T,
             UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """alpha_t = r_t + gamma (1 - term_t) E_t - Q_t, beta_t = gamma (1 - done_t) c_{t+1}
    (the trace of step t uses the ratio, lambda and c_bar of step t+1); then Q_t."""
    term, done, gamma, lmbda = _step(TERM, TRUNC, G, None, g, None, LO, STR, o1, o2, t, m, m,
                                     UNIFORM, FP64)
    q = _ld(V, K_V, STR, o1, o2, t, m, UNIFORM, FP64)
    e = _ld(NV, K_NV, STR, o1, o2, t, m, UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    mn = m & (t + 1 < T)
    ratio = _exp(_ld(RHO, K_RHO, STR, o1, o2, t + 1, mn, UNIFORM, FP64), FP64)
    lnext = _coef(LM, K_LM, lm, LO, 1, STR, o1, o2, t + 1, mn, UNIFORM, FP64)
    cbn = _coef(CB, K_CB, cb, LO, 3, STR, o1, o2, t + 1, mn, UNIFORM, FP64)
    c_next = tl.where(t + 1 < T, lnext * tl.minimum(ratio, cbn), 0.0)
    return x + tl.where(term != 0, 0.0, gamma * e) - q, tl.where(done != 0, 0.0, gamma * c_next), q


@triton.jit
def _returns_bwd(X, V, TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, t, m,
                 UNIFORM: tl.constexpr, FP64: tl.constexpr, IS_GAE: tl.constexpr):
    """The adjoint of GAE (IS_GAE) or TD(lambda), a forward scan: X = dL/dadvantages or
    dL/dreturns, V = dL/dtargets (GAE); u_t = g_t + beta_{t-1} u_{t-1} with every
    coefficient the forward's at t-1 (0 at t = 0). (alpha, beta), then the upstream
    target gradient, a_{t-1}, the values' gradient factor of u_{t-1}, and where that
    term is cut (t = 0 or terminated_{t-1}: the store selects 0 there)."""
    tp = tl.maximum(t - 1, 0)
    term_p, done_p, gamma, lmbda = _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, tp,
                                         m & (t >= 1), m, UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    if V is not None:
        gt = _ld(V, K_V, STR, o1, o2, t, m, UNIFORM, FP64)
    else:
        gt = x * 0.0
    first = t < 1
    if IS_GAE:
        beta = tl.where(first | (done_p != 0), 0.0, gamma * lmbda)
        a_p = gamma
    else:
        lc = tl.where(done_p != 0, 0.0, lmbda)
        beta = tl.where(first | (term_p != 0), 0.0, gamma * lc)
        a_p = gamma * (1.0 - lc)
    return x + gt, beta, gt, a_p, first | (term_p != 0)


@triton.jit
def _vtrace_bwd(X, V, TERM, TRUNC, RHO, G, LM, RB, CB, PB, g, lm, rb, cb, pb, LO, STR,
                o1, o2, t, m, UNIFORM: tl.constexpr, FP64: tl.constexpr):
    """The adjoint of V-trace (shifted values), a forward scan: X = dL/dvs, V = dL/dpg;
    u_t = g_vs_t + K_{t-1} + beta_{t-1} u_{t-1}, the trace coefficients the forward's at
    t-1 (0 at t = 0), rho and the pg clip at t. (alpha, beta), then for the store
    dL/drewards = p1 u + p0 and dL/dvalues = g_vs - dL/dr + vnext dL/dr_{t-1}, where
    dL/dr_{t-1} = cont u_{t-1} + extra at a segment's first step: (x, p0, p1, vnext,
    cont, extra, cut), the vnext term selected away where cut (t = 0 or
    terminated_{t-1})."""
    tp = tl.maximum(t - 1, 0)
    mp = m & (t >= 1)
    term_p, done_p, gamma, lmbda = _step(TERM, TRUNC, G, LM, g, lm, LO, STR, o1, o2, tp, mp, m,
                                         UNIFORM, FP64)
    x = _ld(X, K_X, STR, o1, o2, t, m, UNIFORM, FP64)
    gp = _ld(V, K_V, STR, o1, o2, t, m, UNIFORM, FP64)
    gp_p = _ld(V, K_V, STR, o1, o2, tp, mp, UNIFORM, FP64)  # 0 at t = 0
    ratio = _exp(_ld(RHO, K_RHO, STR, o1, o2, t, m, UNIFORM, FP64), FP64)
    ratio_p = _exp(_ld(RHO, K_RHO, STR, o1, o2, tp, mp, UNIFORM, FP64), FP64)
    rb_t = _coef(RB, K_RB, rb, LO, 2, STR, o1, o2, t, m, UNIFORM, FP64)
    rb_p = _coef(RB, K_RB, rb, LO, 2, STR, o1, o2, tp, m, UNIFORM, FP64)
    cb_p = _coef(CB, K_CB, cb, LO, 3, STR, o1, o2, tp, m, UNIFORM, FP64)
    pb_t = _coef(PB, K_PB, pb, LO, 4, STR, o1, o2, t, m, UNIFORM, FP64)
    pb_p = _coef(PB, K_PB, pb, LO, 4, STR, o1, o2, tp, m, UNIFORM, FP64)
    first = t < 1
    stop_p = first | (done_p != 0)
    pgg_p = tl.minimum(ratio_p, pb_p) * gp_p
    beta = tl.where(stop_p, 0.0, gamma * lmbda * tl.minimum(ratio_p, cb_p))
    alpha = x + tl.where(stop_p, 0.0, gamma * pgg_p)  # + K_{t-1}
    return (alpha, beta, x, tl.minimum(ratio, pb_t) * gp, tl.minimum(ratio, rb_t), gamma,
            tl.minimum(ratio_p, rb_p), pgg_p, first | (term_p != 0))


@triton.jit
def _build(X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO, STR,
           o1, o2, t, m, T, MODE: tl.constexpr, REVERSE: tl.constexpr, UNIFORM: tl.constexpr,
           FP64: tl.constexpr):
    """MODE's coefficient builder on the tile of steps ``t``: (alpha, beta, v, p0, p1,
    vnext, cont, extra, cut), alpha in the places of the terms a mode has not (never
    read)."""
    if MODE == LINREC:
        alpha, beta = _linrec(X, V, STR, o1, o2, t, m, UNIFORM, FP64)
    elif MODE == TRACE:
        alpha, beta = _trace(X, TERM, G, LM, g, lm, LO, STR, o1, o2, t, m, UNIFORM, FP64,
                             REVERSE)
    elif MODE == GAE:
        alpha, beta, v = _gae(X, V, NV, TERM, TRUNC, G, LM, boot, g, lm, LO, STR,
                              o1, o2, t, m, T, UNIFORM, FP64)
    elif MODE == TDLAMBDA:
        alpha, beta = _tdlambda(X, V, NV, TERM, TRUNC, G, LM, boot, g, lm, LO, STR,
                                o1, o2, t, m, T, UNIFORM, FP64)
    elif MODE == VTRACE:
        alpha, beta, v, p0, p1, vnext, cont = _vtrace(
            X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO,
            STR, o1, o2, t, m, T, UNIFORM, FP64)
    elif MODE == RETRACE:
        alpha, beta, v = _retrace(X, V, NV, TERM, TRUNC, RHO, G, LM, CB, g, lm, cb, LO,
                                  STR, o1, o2, t, m, T, UNIFORM, FP64)
    elif MODE == GAE_BWD or MODE == TD_BWD:
        alpha, beta, v, p1, cut = _returns_bwd(X, V, TERM, TRUNC, G, LM, g, lm, LO, STR,
                                          o1, o2, t, m, UNIFORM, FP64, MODE == GAE_BWD)
    else:
        tl.static_assert(MODE == VTRACE_BWD)
        alpha, beta, v, p0, p1, vnext, cont, extra, cut = _vtrace_bwd(
            X, V, TERM, TRUNC, RHO, G, LM, RB, CB, PB, g, lm, rb, cb, pb, LO, STR,
            o1, o2, t, m, UNIFORM, FP64)
    if MODE != GAE and MODE != VTRACE and MODE != RETRACE and MODE != GAE_BWD and (
            MODE != TD_BWD and MODE != VTRACE_BWD):
        v = alpha
    if MODE != VTRACE and MODE != VTRACE_BWD:
        p0 = alpha
        vnext = alpha
        cont = alpha
        if MODE != GAE_BWD and MODE != TD_BWD:
            p1 = alpha
            cut = alpha
    if MODE == VTRACE:
        cut = alpha
    if MODE != VTRACE_BWD:
        extra = alpha
    return alpha, beta, v, p0, p1, vnext, cont, extra, cut


@triton.jit
def _wait(FL, seg, valid, level: tl.constexpr):
    """Spin until the status of every valid segment in ``seg`` is at least ``level``
    (the loop carries a scalar only: a tensor carried through it crashed triton 3.6's
    layout pass)."""
    ready = 0
    while ready == 0:
        st = tl.atomic_add(FL + seg, 0, mask=valid, sem="acquire")
        ready = (tl.min(tl.where(valid, st, level), axis=0) >= level).to(tl.int32)


@triton.jit
def _fold(PA, PB, rows, valid, n, nmask, N, dtype: tl.constexpr):
    """The maps stored at ``rows`` (a window, the earliest in scan order first) composed
    in that order, in a fixed association; identity (0, 1) where not ``valid``."""
    jj = rows[None, :].to(tl.int64) * N + n[:, None]
    lm = nmask[:, None] & valid[None, :]
    ma = tl.load(PA + jj, mask=lm, other=0.0, volatile=True).to(dtype)
    mb = tl.load(PB + jj, mask=lm, other=1.0, volatile=True).to(dtype)
    ga, gb = tl.associative_scan((ma, mb), 1, _combine)
    last = rows.shape[0] - 1
    w = tl.arange(0, rows.shape[0])[None, :]
    return _column(ga, w, last), _column(gb, w, last)


@triton.jit
def _window(FL, PC, b0, blk, nf, nmask, N, S, n_full, REVERSE: tl.constexpr, W: tl.constexpr,
            dtype: tl.constexpr):
    """The maps of blocks b0 .. b0 + W - 1 (those before ``blk``) composed, once the last
    segment of each has published its block's map."""
    b = b0 + tl.arange(0, W)
    valid = b < blk
    last = b * W + W - 1
    if REVERSE:
        last = S - 1 - last
    _wait(FL, last, valid, 2)
    tl.debug_barrier()
    return _fold(PC, PC + n_full * N, b, valid, nf, nmask, N, dtype)


@triton.jit
def _look_back(WS, agg_a, agg_b, init, n, nf, nmask, pid_n, pid_s, N, S,
               REVERSE: tl.constexpr, W: tl.constexpr, CUT: tl.constexpr):
    """PHASE 4 (one pass): the carry entering segment ``pid_s``, in an order of
    composition fixed by the segment's position, so the outputs repeat bit for bit.

    Segments are counted in scan order (q; from the end in reverse) and grouped in
    blocks of W. Workspace (zeroed per call): A, B [S, N] (each segment's composed map),
    then the maps of the full blocks (A, then B, [S // W, N]), then a status per (stream
    block, segment): 0 nothing, 1 its map, 2 also its block's map (the block's last
    segment publishes it); then the ticket counter. A program publishes its map; the
    carry entering it is ``init`` through the maps of the blocks before its own (W at a
    time, earliest first), then through those of the segments before it in its block.
    Waits are only on maps, never on another program's carry (no chain through the
    segments: a block's map waits on its own segments' maps only, so it is published
    before its last segment reads the blocks before it), and only on programs with an
    earlier ticket, which have started: no deadlock. CUT (more segments than W: blocks
    before this one exist): the windows of blocks whose maps a later cut discards (an
    episode ends after them) are not read; the outputs are the same bits.
    """
    PA = WS
    PB = WS + S * N
    PC = WS + 2 * S * N
    n_full = S // W
    FL = (WS + 3 * S * N).to(tl.pointer_type(tl.int32)) + pid_n.to(tl.int64) * S
    tl.store(PA + pid_s.to(tl.int64) * N + n, agg_a, mask=nmask)
    tl.store(PB + pid_s.to(tl.int64) * N + n, agg_b, mask=nmask)
    tl.debug_barrier()
    tl.atomic_xchg(FL + pid_s, 1, sem="release")
    if REVERSE:
        q = S - 1 - pid_s
    else:
        q = pid_s
    w = tl.arange(0, W)
    blk = q // W
    qq = blk * W + w  # the segments before this one in its block
    valid = qq < q
    seg = qq
    if REVERSE:
        seg = S - 1 - qq
    _wait(FL, seg, valid, 1)
    tl.debug_barrier()
    ia, ib = _fold(PA, PB, seg, valid, nf, nmask, N, agg_a.dtype)
    if q % W == W - 1:  # the block's last segment: publish the block's map first
        ba, bb = _combine(ia, ib, agg_a, agg_b)
        tl.store(PC + blk.to(tl.int64) * N + n, ba, mask=nmask)
        tl.store(PC + (n_full + blk).to(tl.int64) * N + n, bb, mask=nmask)
        tl.debug_barrier()
        tl.atomic_xchg(FL + pid_s, 2, sem="release")
    carry = init
    if CUT:
        # The blocks before this one matter only to streams whose carry crosses the
        # segments before it in its block (else _apply below returns ia whatever they
        # give); and of those, where the walk's last window of blocks cuts every such
        # stream's carry (an episode ends in it), its last _apply returns that window's
        # alpha whatever came before, so the windows before it are not read. The same
        # bits either way.
        cross = nmask & (ib != 0)
        if (tl.sum(cross.to(tl.int32), axis=0) > 0) & (blk > 0):
            b_last = (blk - 1) // W * W
            la, lb = _window(FL, PC, b_last, blk, nf, nmask, N, S, n_full, REVERSE, W,
                             agg_a.dtype)
            more = (tl.sum((cross & (lb != 0)).to(tl.int32), axis=0) > 0).to(tl.int32)
            for b0 in range(0, b_last * more, W):  # the windows before it, earliest first
                ga, gb = _window(FL, PC, b0, blk, nf, nmask, N, S, n_full, REVERSE, W,
                                 agg_a.dtype)
                carry = _apply(ga, gb, carry)
            carry = _apply(la, lb, carry)
    else:
        for b0 in range(0, blk, W):  # the blocks before this one, W at a time
            ga, gb = _window(FL, PC, b0, blk, nf, nmask, N, S, n_full, REVERSE, W,
                             agg_a.dtype)
            carry = _apply(ga, gb, carry)
    return _apply(ia, ib, carry)


@triton.jit(do_not_specialize=["UNIT"])
def scan_kernel(
    OUT0, OUT1, X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, BOOT, INIT, WS,
    g, lm, rb, cb, pb, LO, STR,
    N, N2, T, SEG_LEN, S, UNIT,
    MODE: tl.constexpr, REVERSE: tl.constexpr, PHASE: tl.constexpr, UNIFORM: tl.constexpr,
    FP64: tl.constexpr, SCALAR_N: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, STAGES: tl.constexpr, LOOK_W: tl.constexpr,
    ONE: tl.constexpr = False, I64: tl.constexpr = True, PREFETCH: tl.constexpr = 0,
    FLIP: tl.constexpr = False, EVEN: tl.constexpr = False, PIPE: tl.constexpr = False,
    SUB: tl.constexpr = 1, LOOK_CUT: tl.constexpr = False,
):
    """OUT0 (and OUT1, None for one output) = the scan of MODE over [N1, N2, T].

    Pointers: X (rewards, alpha, x or an upstream gradient), V (values, beta, Q or a
    second gradient), NV (next values or E_t), TERM, TRUNC (flags), RHO (log ratios),
    per-step coefficient tensors G, LM, RB, CB, PB (gamma, lambda, the three clip
    thresholds) and BOOT, INIT ([N1, N2]); each None where absent. g, lm, rb, cb, pb:
    the scalar coefficients where there is no tensor (None where unused: 1), with
    their float64 low parts in LO. WS: the segmented plans' workspace.
    ONE: each program's streams fit one chunk (PHASE 0, BLOCK_T >= T): no carry leaves
    the chunk, so no reduction extracts it. I64: element offsets in int64; else int32
    (every offset, the last chunk's overshoot included, fits: half the address work).
    SUB > 1 (time-major, a stream a lane, fewer streams than lanes: ``Tuning.tm_few``): a
    chunk's BLOCK_T steps are split into SUB sub-chunks of BLOCK_T // SUB consecutive
    steps on the lanes left over, a [BLOCK_N, BLOCK_T // SUB, SUB] tile (``_sub_scan``):
    each thread scans its steps in registers and only the sub-chunks' maps cross lanes.
    """
    tl.static_assert(SUB == 1 or PREFETCH == 0)
    if PHASE == 4:
        # segments in ticket order (the look-back waits only on started programs)
        ctr = (WS + 3 * S * N).to(tl.pointer_type(tl.int32)) + tl.cdiv(N, BLOCK_N) * S
        tk = tl.atomic_add(ctr, 1)
        pid_n = tk // S
        if REVERSE:
            pid_s = S - 1 - tk % S
        else:
            pid_s = tk % S
    else:
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
    if I64:
        n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
    else:
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if EVEN:  # every stream block full and every chunk whole: no bounds to test
        nmask = tl.full([BLOCK_N], 1, tl.int1)
    else:
        nmask = n < N
    n1 = n // N2
    n2 = n % N2
    if SCALAR_N:
        # time-major: UNIT (= 1, unknown to the compiler) hides that streams are
        # contiguous, so every load is one element per thread with threads along the
        # streams and each thread holding its stream's BLOCK_T steps: the scan then runs
        # in registers, with no layout conversion (byte flags included). The contiguity
        # of 2 is not true of every index (n1 when N2 > 1, n2 when N2 is odd); it only
        # orders the layout: the divisibility of 1 keeps every access one element wide
        # (vector width = min(contiguity, alignment)).
        n1 = tl.max_contiguous(tl.multiple_of(n1 * UNIT, 1), 2)
        n2 = tl.max_contiguous(tl.multiple_of(n2 * UNIT, 1), 2)
        # (the look-back's windows of maps and the middle pass's tiles likewise: each
        # thread composes its own stream's maps)
        nf = tl.max_contiguous(tl.multiple_of(n * UNIT, 1), 2)
    else:
        nf = n
    cols = tl.arange(0, BLOCK_T)[None, :]
    if SUB > 1:
        o1 = n1[:, None, None]
        o2 = n2[:, None, None]
        nm2 = nmask[:, None, None]
        # each step's place in scan order: sub-chunk w, step c within it
        pos = (tl.arange(0, SUB)[None, None, :] * (BLOCK_T // SUB)
               + tl.arange(0, BLOCK_T // SUB)[None, :, None])
    else:
        o1 = n1[:, None]
        o2 = n2[:, None]
        nm2 = nmask[:, None]
        pos = cols
    if FP64:
        zero = tl.zeros([BLOCK_N], dtype=tl.float64)
    else:
        zero = tl.zeros([BLOCK_N], dtype=tl.float32)

    carry = zero
    if INIT is not None:
        carry = tl.load(INIT + _offset_notime(K_INIT, STR, n1, n2, N2, UNIFORM), mask=nmask,
                        other=0).to(zero.dtype)

    if PHASE == 3:
        # the middle pass: compose the segment maps (A, B) of PHASE 1 once, in time order,
        # and leave in each segment's slot the carry leaving it
        s_cols = tl.arange(0, BLOCK_S)[None, :]
        n_sc = tl.cdiv(S, BLOCK_S)
        for kk in range(0, n_sc):
            # the maps in scan order along the tile (the latest segment first in reverse),
            # so the scan runs forward: a reverse scan swaps its operands across the warp
            # before and after (shuffles), also where each thread holds its stream's maps
            if REVERSE:
                s_idx = (n_sc - 1 - kk) * BLOCK_S + (BLOCK_S - 1 - s_cols)
            else:
                s_idx = kk * BLOCK_S + s_cols
            sm = nmask[:, None] & (s_idx < S)
            w_off = s_idx.to(tl.int64) * N + nf[:, None]
            wa = tl.load(WS + w_off, mask=sm, other=0.0).to(zero.dtype)
            wb = tl.load(WS + S * N + w_off, mask=sm, other=1.0).to(zero.dtype)
            A, B = tl.associative_scan((wa, wb), 1, _combine)
            h = _apply(A, B, carry[:, None])
            tl.store(WS + w_off, h.to(WS.dtype.element_ty), mask=sm)
            carry = _column(h, s_cols, BLOCK_S - 1)
    else:
        t_lo = pid_s * SEG_LEN
        t_hi = tl.minimum(t_lo + SEG_LEN, T)

        # carry entering this segment: init, or (PHASE 2) the one PHASE 3 left in the
        # workspace slot of the segment before it (after it, in reverse)
        if PHASE == 1:
            carry_a = zero
            carry_b = zero + 1.0
        if PHASE == 2:
            if REVERSE:
                prev = pid_s + 1
            else:
                prev = pid_s - 1
            prev = prev.to(tl.int64) + n * 0
            has_prev = (prev >= 0) & (prev < S)
            c_prev = tl.load(WS + prev * N + n, mask=nmask & has_prev, other=0)
            carry = tl.where(has_prev, c_prev.to(zero.dtype), carry)

        carry_seg = carry
        # V'_{T-1} of the shifted form: one value per stream, read once
        boot = zero
        if BOOT is not None:
            boot = tl.load(BOOT + _offset_notime(K_BOOT, STR, n1, n2, N2, UNIFORM), mask=nmask,
                           other=0).to(zero.dtype)
        if SUB > 1:  # (the tile's shape, with or without a bootstrap value)
            boot = boot[:, None, None]
        else:
            boot = boot[:, None]
        so1, so2, sot = STR[0], STR[1], STR[2]  # the outputs' (slot 0 in either form)
        if ONE:
            n_chunks = 1
        else:
            n_chunks = tl.cdiv(t_hi - t_lo, BLOCK_T)
        # each step's place in its chunk, in the tile's order (scan order where FLIP or SUB)
        if SUB > 1:  # (the latest first in reverse)
            if REVERSE:
                steps = BLOCK_T - 1 - pos
            else:
                steps = pos
        elif FLIP:
            # a reverse scan held in one thread (time-major): the tile's columns in scan
            # order (the latest step first), so the scan runs forward; Triton's reverse
            # scan would swap every value across the warp twice (2 x BLOCK_T shuffles of
            # each of alpha and beta), although no step leaves the thread
            steps = BLOCK_T - 1 - cols
        else:
            steps = cols
        if PIPE:  # the first chunk's coefficients (in scan order), carried into the loop
            if REVERSE:
                t0 = t_lo + (n_chunks - 1) * BLOCK_T + steps
            else:
                t0 = t_lo + steps
            if I64:
                t0 = t0.to(tl.int64)
            n_alpha, n_beta, n_v, n_p0, n_p1, n_vnext, n_cont, n_extra, n_cut = _build(
                X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO, STR,
                o1, o2, t0, nm2 & (t0 < t_hi), T, MODE, REVERSE, UNIFORM, FP64)
        for kk in tl.range(0, n_chunks, num_stages=STAGES):
            if REVERSE:
                k = n_chunks - 1 - kk
            else:
                k = kk
            t = t_lo + k * BLOCK_T + steps
            if I64:
                t = t.to(tl.int64)
            if EVEN:
                m = tl.full(t.shape, 1, tl.int1) & nm2
            else:
                m = nm2 & (t < t_hi)
            if PREFETCH > 0:
                # the lines of the chunk PREFETCH ahead, one step per stream (row
                # n % BLOCK_T of that chunk: a warp's 32 streams cover its steps)
                if REVERSE:
                    kp = k - PREFETCH
                else:
                    kp = k + PREFETCH
                tp = t_lo + kp * BLOCK_T + (n % BLOCK_T)
                mp = nmask & (kp >= 0) & (kp < n_chunks) & (tp < t_hi)
                _prefetch(X, K_X, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(V, K_V, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(NV, K_NV, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(TERM, K_TERM, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(TRUNC, K_TRUNC, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(RHO, K_RHO, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(G, K_G, STR, n1, n2, tp, mp, UNIFORM)
                _prefetch(LM, K_LM, STR, n1, n2, tp, mp, UNIFORM)
            if PIPE:
                # the next chunk's loads and coefficients first, in flight while this one
                # is scanned and stored (a load after this chunk's stores could not be
                # moved above them: they may alias)
                alpha, beta, v, p0, p1, vnext, cont, extra, cut = (
                    n_alpha, n_beta, n_v, n_p0, n_p1, n_vnext, n_cont, n_extra, n_cut)
                if REVERSE:
                    tn = t - BLOCK_T
                else:
                    tn = t + BLOCK_T
                mn = nm2 & (tn < t_hi) & (tn >= t_lo)
                n_alpha, n_beta, n_v, n_p0, n_p1, n_vnext, n_cont, n_extra, n_cut = _build(
                    X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO,
                    STR, o1, o2, tn, mn, T, MODE, REVERSE, UNIFORM, FP64)
            else:
                alpha, beta, v, p0, p1, vnext, cont, extra, cut = _build(
                    X, V, NV, TERM, TRUNC, RHO, G, LM, RB, CB, PB, boot, g, lm, rb, cb, pb, LO,
                    STR, o1, o2, t, m, T, MODE, REVERSE, UNIFORM, FP64)
            alpha = tl.where(m, alpha, 0.0)
            beta = tl.where(m, beta, 1.0)
            if SUB > 1:
                A, B, ea, eb, agg_a, agg_b = _sub_scan(alpha, beta, BLOCK_T // SUB, SUB)
            else:
                A, B = tl.associative_scan((alpha, beta), 1, _combine,
                                           reverse=REVERSE and not FLIP)
                if REVERSE and not FLIP:
                    edge = 0
                else:
                    edge = BLOCK_T - 1
                agg_a = _column(A, cols, edge)
                agg_b = _column(B, cols, edge)
            if PHASE == 4:  # one chunk per segment: its map, then the carry entering it
                carry = _look_back(WS, agg_a, agg_b, carry, n, nf, nmask, pid_n, pid_s, N, S,
                                   REVERSE, LOOK_W, LOOK_CUT)
                carry_seg = carry
            if PHASE == 1:
                carry_a, carry_b = _combine(carry_a, carry_b, agg_a, agg_b)
            else:
                if SUB > 1:  # the carry entering each sub-chunk, then its steps
                    h = _apply(A, B, _apply(ea, eb, carry[:, None])[:, None, :])
                    cs = carry_seg[:, None, None]
                else:
                    h = _apply(A, B, carry[:, None])
                    cs = carry_seg[:, None]
                p_out = o1 * so1 + o2 * so2 + t * sot
                if MODE == VTRACE:
                    # pg_t needs vs_{t+1}: stored by this program (this chunk, or the one after
                    # it in time, processed before it); at the segment's end, V_{t+1} + carry.
                    tl.store(OUT0 + p_out, (h + v).to(OUT0.dtype.element_ty), mask=m)
                    tl.debug_barrier()
                    m_in = m & cont & (t + 1 < t_hi)
                    vs_next = tl.load(OUT0 + p_out + sot, mask=m_in, other=0.0).to(h.dtype)
                    vs_next = tl.where(t + 1 == t_hi, vnext + cs, vs_next)
                    pg = p0 + tl.where(cont, p1 * vs_next, 0.0)
                    tl.store(OUT1 + p_out, pg.to(OUT1.dtype.element_ty), mask=m)
                elif MODE == RETRACE:
                    tl.store(OUT0 + p_out, (h + v).to(OUT0.dtype.element_ty), mask=m)
                elif MODE == VTRACE_BWD:
                    g_r = p1 * h + p0
                    tl.store(OUT0 + p_out, g_r.to(OUT0.dtype.element_ty), mask=m)
                    if OUT1 is not None:
                        # OUT0_{t-1}: stored by this program (this chunk or the one before
                        # it); at the segment's start, from the carry entering it
                        tl.debug_barrier()
                        r_prev = tl.load(OUT0 + p_out - sot, mask=m & (t > t_lo),
                                         other=0.0).to(h.dtype)
                        r_prev = tl.where(t == t_lo, cont * cs + extra, r_prev)
                        g_val = v - g_r + tl.where(cut, 0.0, vnext * r_prev)
                        tl.store(OUT1 + p_out, g_val.to(OUT1.dtype.element_ty), mask=m)
                elif MODE == GAE_BWD or MODE == TD_BWD:
                    tl.store(OUT0 + p_out, h.to(OUT0.dtype.element_ty), mask=m)
                    if OUT1 is not None:
                        # u_{t-1}: stored by this program (this chunk or the one before it);
                        # at the segment's start, the carry entering it
                        tl.debug_barrier()
                        u_prev = tl.load(OUT0 + p_out - sot, mask=m & (t > t_lo),
                                         other=0.0).to(h.dtype)
                        u_prev = tl.where(t == t_lo, cs, u_prev)
                        g_val = tl.where(cut, 0.0, p1 * u_prev)
                        if MODE == GAE_BWD:
                            g_val = g_val + v - h
                        tl.store(OUT1 + p_out, g_val.to(OUT1.dtype.element_ty), mask=m)
                elif MODE == GAE:
                    tl.store(OUT0 + p_out, h.to(OUT0.dtype.element_ty), mask=m)
                    if OUT1 is not None:  # (gae_advantages: the advantages only)
                        tl.store(OUT1 + p_out, (h + v).to(OUT1.dtype.element_ty), mask=m)
                else:
                    tl.store(OUT0 + p_out, h.to(OUT0.dtype.element_ty), mask=m)
                if not ONE:
                    if SUB > 1:
                        carry = _apply(agg_a, agg_b, carry)
                    else:
                        carry = _column(h, cols, edge)

        if PHASE == 1:
            w_off = pid_s.to(tl.int64) * N + n
            tl.store(WS + w_off, carry_a, mask=nmask)
            tl.store(WS + S * N + w_off, carry_b, mask=nmask)
