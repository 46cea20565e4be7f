"""The one Triton kernel: a chunked affine scan with coefficients built in registers.

    backward (REVERSE): h_t = alpha_t + beta_t * h_{t+1},  h_T     = init (0)
    forward:            h_t = alpha_t + beta_t * h_{t-1},  h_{-1}  = init (0)

A program owns BLOCK_N streams and walks its time range in BLOCK_T chunks,
carrying h across chunks, so T is unbounded. Inside a chunk the (alpha, beta)
pairs are combined with ``tl.associative_scan``. Every estimator is one MODE:
its coefficients are built from the raw inputs in registers (one pass over
memory). Every tensor is addressed as [N1, N2, T] through its own strides
(``_layout``), so time-major, batch-major, trailing features and broadcast
flags all run without a copy.

When there are too few streams to fill the GPU (a flat RLlib stream, 16 long
sequences), the time axis is also split into S segments (grid axis 1):
PHASE 1 stores each segment's composed map (A, B) in a workspace, PHASE 3 (one
program per stream block) composes those maps once, in time order, into the
carry leaving each segment, and PHASE 2 scans each segment again from the carry
entering it and writes the outputs. PHASE 0 is the single-pass case (S = 1).
Where all programs fit on the GPU at once, PHASE 4 does it in one launch instead:
a chunk per program, the carry from a decoupled look-back (``_look_back``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

MODE_LINREC = 0  # alpha = X, beta = V
MODE_GAE = 1  # A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}; OUT1 = A + V
MODE_TDLAMBDA = 2  # TD(lambda) / discounted returns
MODE_TRACE = 3  # forward: z_t = x_t + gamma lambda (1 - done_{t-1}) z_{t-1}
# (REVERSE: its adjoint, u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1})
MODE_VTRACE = 4  # D_t = rho_t delta_t + gamma (1 - done_t) c_t D_{t+1}; OUT0 = V + D, OUT1 = pg adv
MODE_RETRACE = 5  # D_t = delta_t + gamma (1 - done_t) c_{t+1} D_{t+1}; OUT0 = Q + D
# adjoints (forward scans) of GAE and TD(lambda): u_t = g_t + beta_{t-1} u_{t-1}, OUT0 = u
# (the rewards' gradient); with TWO_OUT, OUT1 = the values' gradient of the shifted form
MODE_GAE_BWD = 6  # OUT1 = g_target_t - u_t + gamma_{t-1} (1 - term_{t-1}) u_{t-1}
MODE_TD_BWD = 7  # OUT1 = gamma_{t-1} (1 - term_{t-1}) (1 - lambda_{t-1} c_{t-1}) u_{t-1}
# adjoint of V-trace (shifted values): X = dL/dvs, V = dL/dpg;
# u_t = g_vs_t + K_{t-1} + beta_{t-1} u_{t-1}, K_{t-1} = pgrho_{t-1} gamma_{t-1} (1 - term_{t-1})
# (1 - done_{t-1}) g_pg_{t-1} (pg_{t-1} reads vs_t);
# OUT0 = dL/drewards = rho_t u_t + pgrho_t g_pg_t,
# OUT1 = dL/dvalues = g_vs_t - OUT0_t + gamma_{t-1} (1 - term_{t-1}) OUT0_{t-1}
MODE_VTRACE_BWD = 8


@triton.jit
def _combine(a1, b1, a2, b2):
    # (a1, b1) is applied first, then (a2, b2): h -> a2 + b2 * (a1 + b1 * h)
    return a2 + b2 * a1, b1 * b2


@triton.jit
def _ld(ptr, o1, o2, t, s1, s2, st, mask, FP64: tl.constexpr):
    x = tl.load(ptr + o1 * s1 + o2 * s2 + t * st, mask=mask, other=0)
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


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
def _column(h, cols, idx):
    return tl.sum(tl.where(cols == idx, h, 0.0), axis=1)


@triton.jit
def _step(TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, G, sg1, sg2, sgt, gamma,
          L, sl1, sl2, slt, lmbda, o1, o2, tt, m_flags, m_coef,
          HAS_TRUNC: tl.constexpr, G_TENSOR: tl.constexpr, L_TENSOR: tl.constexpr,
          FP64: tl.constexpr):
    """(terminated, done, gamma, lambda) of step ``tt`` (t, or t-1 in the forward scans)."""
    term = _ld(TERM, o1, o2, tt, sa1, sa2, sat, m_flags, FP64)
    if HAS_TRUNC:
        done = tl.maximum(term, _ld(TRUNC, o1, o2, tt, sb1, sb2, sbt, m_flags, FP64))
    else:
        done = term
    if G_TENSOR:
        gamma = _ld(G, o1, o2, tt, sg1, sg2, sgt, m_coef, FP64)
    if L_TENSOR:
        lmbda = _ld(L, o1, o2, tt, sl1, sl2, slt, m_coef, FP64)
    return term, done, gamma, lmbda


@triton.jit
def _coefficients(
    X, sx1, sx2, sxt, V, sv1, sv2, svt, NV, snv1, snv2, snvt,
    TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, boot,
    G, sg1, sg2, sgt, g_hi, g_lo, L, sl1, sl2, slt, l_hi, l_lo,
    RHO, sr1, sr2, srt, RB, srb1, srb2, srbt, rb_hi, rb_lo, CB, scb1, scb2, scbt, cb_hi, cb_lo,
    PB, spb1, spb2, spbt, pb_hi, pb_lo,
    o1, o2, t, m, T,
    MODE: tl.constexpr, HAS_V: tl.constexpr, HAS_NV: tl.constexpr, HAS_TRUNC: tl.constexpr,
    HAS_BOOT: tl.constexpr, G_TENSOR: tl.constexpr, L_TENSOR: tl.constexpr,
    RB_TENSOR: tl.constexpr, CB_TENSOR: tl.constexpr, PB_TENSOR: tl.constexpr, FP64: tl.constexpr,
    REVERSE: tl.constexpr,
):
    """One [BLOCK_N, BLOCK_T] tile: (alpha, beta, v, p0, p1, vnext, cont, extra); boot
    is [BLOCK_N, 1], V'_{T-1} of the shifted form.

    v is the values tile (the second output adds it); p0, p1, vnext and cont
    give V-trace's policy-gradient advantage from D_{t+1}:
    pg_t = p0 + [cont] p1 (vnext + D_{t+1}). The adjoint modes use them for their
    epilogues' terms (MODE_VTRACE_BWD: extra too).
    """
    if FP64:
        one = tl.full([], 1.0, tl.float64)
        gamma = g_hi * one + g_lo * one
        lmbda = l_hi * one + l_lo * one
        rb = rb_hi * one + rb_lo * one
        cb = cb_hi * one + cb_lo * one
        pb = pb_hi * one + pb_lo * one
    else:
        gamma = g_hi
        lmbda = l_hi
        rb = rb_hi
        cb = cb_hi
        pb = pb_hi
    x = _ld(X, o1, o2, t, sx1, sx2, sxt, m, FP64)
    zero = x * 0.0
    no = t < 0
    if MODE == 0:
        beta = _ld(V, o1, o2, t, sv1, sv2, svt, m, FP64)
        return x, beta, x, zero, zero, zero, no, zero
    elif MODE == 3:
        if REVERSE:
            # the trace's adjoint: u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1}
            tp = t
            m_p = m
        else:
            # forward trace: decay of z_{t-1} uses the transition out of step t-1
            tp = tl.maximum(t - 1, 0)
            m_p = m & (t >= 1)
        term_p, done_p, gamma, lmbda = _step(
            TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, G, sg1, sg2, sgt, gamma,
            L, sl1, sl2, slt, lmbda, o1, o2, tp, m_p, m,
            HAS_TRUNC, G_TENSOR, L_TENSOR, FP64)
        return x, gamma * lmbda * (1.0 - done_p), x, zero, zero, zero, no, zero
    elif MODE == 6 or MODE == 7:
        # adjoint of GAE / TD(lambda): X = dL/dadvantages or dL/dreturns, V = dL/dtargets
        # (GAE); every coefficient is the forward's at t-1 (0 at t = 0)
        tp = tl.maximum(t - 1, 0)
        term_p, done_p, gamma, lmbda = _step(
            TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, G, sg1, sg2, sgt, gamma,
            L, sl1, sl2, slt, lmbda, o1, o2, tp, m & (t >= 1), m,
            HAS_TRUNC, G_TENSOR, L_TENSOR, FP64)
        if HAS_V:
            gt = _ld(V, o1, o2, t, sv1, sv2, svt, m, FP64)
        else:
            gt = zero
        a_p = gamma * (1.0 - term_p)
        if MODE == 6:
            beta = gamma * lmbda * (1.0 - done_p)
        else:
            beta = a_p * lmbda * (1.0 - done_p)
            a_p = a_p * (1.0 - lmbda * (1.0 - done_p))
        first = t < 1
        return (x + gt, tl.where(first, 0.0, beta), gt, zero, tl.where(first, 0.0, a_p), zero,
                no, zero)
    elif MODE == 8:
        # adjoint of V-trace: X = dL/dvs, V = dL/dpg; the trace coefficients are the
        # forward's at t-1 (0 at t = 0), rho and the pg clip at t for dL/drewards
        tp = tl.maximum(t - 1, 0)
        mp = m & (t >= 1)
        term_p, done_p, gamma, lmbda = _step(
            TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, G, sg1, sg2, sgt, gamma,
            L, sl1, sl2, slt, lmbda, o1, o2, tp, mp, m,
            HAS_TRUNC, G_TENSOR, L_TENSOR, FP64)
        gp = _ld(V, o1, o2, t, sv1, sv2, svt, m, FP64)
        gp_p = _ld(V, o1, o2, tp, sv1, sv2, svt, mp, FP64)  # 0 at t = 0
        ratio = _exp(_ld(RHO, o1, o2, t, sr1, sr2, srt, m, FP64), FP64)
        ratio_p = _exp(_ld(RHO, o1, o2, tp, sr1, sr2, srt, mp, FP64), FP64)
        rb_p = rb
        cb_p = cb
        pb_p = pb
        if RB_TENSOR:
            rb = _ld(RB, o1, o2, t, srb1, srb2, srbt, m, FP64)
            rb_p = _ld(RB, o1, o2, tp, srb1, srb2, srbt, m, FP64)
        if CB_TENSOR:
            cb_p = _ld(CB, o1, o2, tp, scb1, scb2, scbt, m, FP64)
        if PB_TENSOR:
            pb = _ld(PB, o1, o2, t, spb1, spb2, spbt, m, FP64)
            pb_p = _ld(PB, o1, o2, tp, spb1, spb2, spbt, m, FP64)
        first = t < 1
        gnt_p = tl.where(first, 0.0, gamma * (1.0 - term_p))
        pgg_p = tl.minimum(ratio_p, pb_p) * gp_p
        beta = tl.where(first, 0.0, gamma * (1.0 - done_p) * lmbda * tl.minimum(ratio_p, cb_p))
        alpha = x + gnt_p * (1.0 - done_p) * pgg_p  # + K_{t-1}
        # epilogue: OUT0 = p1 u + p0; OUT1 = v - OUT0 + vnext OUT0_{t-1}, where
        # OUT0_{t-1} = cont u_{t-1} + extra at the segment's first step
        return (alpha, beta, x, tl.minimum(ratio, pb) * gp, tl.minimum(ratio, rb), gnt_p,
                tl.minimum(ratio_p, rb_p), pgg_p)
    else:
        # rewards = X; terminated/truncated step-aligned; V' explicit or shifted
        term, done, gamma, lmbda = _step(
            TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, G, sg1, sg2, sgt, gamma,
            L, sl1, sl2, slt, lmbda, o1, o2, t, m, m, HAS_TRUNC, G_TENSOR, L_TENSOR, FP64)
        if HAS_V:
            v = _ld(V, o1, o2, t, sv1, sv2, svt, m, FP64)
        else:
            v = zero
        last = t == T - 1
        if HAS_V:
            vnext = _ld(V, o1, o2, t + 1, sv1, sv2, svt, m & (t + 1 < T), FP64)
        else:
            vnext = zero
        if HAS_NV:
            nv = _ld(NV, o1, o2, t, snv1, snv2, snvt, m, FP64)
        else:
            nv = vnext
            if HAS_BOOT:
                nv = tl.where(last, boot, nv)
        gnt = gamma * (1.0 - term)
        if MODE == 1:
            alpha = x + gnt * nv - v
            beta = gamma * lmbda * (1.0 - done)
            return alpha, beta, v, zero, zero, zero, no, zero
        elif MODE == 2:
            c = tl.where(last, 0.0, 1.0 - done)
            alpha = x + gnt * (1.0 - lmbda * c) * nv
            beta = gnt * lmbda * c
            return alpha, beta, v, zero, zero, zero, no, zero
        elif MODE == 4:
            lr = _ld(RHO, o1, o2, t, sr1, sr2, srt, m, FP64)
            ratio = _exp(lr, FP64)
            if RB_TENSOR:
                rb = _ld(RB, o1, o2, t, srb1, srb2, srbt, m, FP64)
            if CB_TENSOR:
                cb = _ld(CB, o1, o2, t, scb1, scb2, scbt, m, FP64)
            if PB_TENSOR:
                pb = _ld(PB, o1, o2, t, spb1, spb2, spbt, m, FP64)
            rho = tl.minimum(ratio, rb)
            pgrho = tl.minimum(ratio, pb)
            alpha = rho * (x + gnt * nv - v)
            beta = gamma * (1.0 - done) * lmbda * tl.minimum(ratio, cb)
            cont = (done == 0.0) & (t < T - 1)
            p0 = pgrho * (x - v + tl.where(cont, 0.0, gnt * nv))
            return alpha, beta, v, p0, pgrho * gnt, vnext, cont, zero
        else:
            # Retrace: the trace of step t uses the ratio (lambda, c_bar) of step t+1
            mn = m & (t + 1 < T)
            lr = _ld(RHO, o1, o2, t + 1, sr1, sr2, srt, mn, FP64)
            ratio = _exp(lr, FP64)
            if L_TENSOR:
                lmbda = _ld(L, o1, o2, t + 1, sl1, sl2, slt, mn, FP64)
            if CB_TENSOR:
                cb = _ld(CB, o1, o2, t + 1, scb1, scb2, scbt, mn, FP64)
            c_next = tl.where(t + 1 < T, lmbda * tl.minimum(ratio, cb), 0.0)
            alpha = x + gnt * nv - v
            beta = gamma * (1.0 - done) * c_next
            return alpha, beta, v, zero, zero, zero, no, zero


@triton.jit
def _look_back(WS, agg_a, agg_b, init, n, nmask, pid_n, pid_s, N, S,
               REVERSE: tl.constexpr, W: tl.constexpr, MAPS_ONLY: tl.constexpr):
    """PHASE 4 (one pass, decoupled look-back): the carry entering segment ``pid_s``.

    Workspace (zeroed per call): A, B and P [S, N] (a segment's composed map, the
    carry leaving it), then a status per (stream block, segment): 0 nothing, 1 its
    map, 2 its carry; then the ticket counter. A program publishes its map, then
    walks back W segments at a time (towards the start in time; towards the end in
    reverse) composing their maps until it meets a published carry, then publishes
    its own carry. Programs take segments in ticket order, so every segment they
    wait on belongs to a program that has started: no deadlock. MAPS_ONLY (tests)
    reads every carry but the first segment's as a map, so the interpreter, which runs
    programs one after another, also walks back over maps, window after window.
    """
    PA = WS
    PB = WS + S * N
    PP = WS + 2 * S * N
    FL = (WS + 3 * S * N).to(tl.pointer_type(tl.int32)) + pid_n.to(tl.int64) * S
    off = pid_s.to(tl.int64) * N + n
    if REVERSE:
        first = pid_s == S - 1
        step = 1
    else:
        first = pid_s == 0
        step = -1
    tl.store(PA + off, agg_a, mask=nmask)
    tl.store(PB + off, agg_b, mask=nmask)
    tl.store(PP + off, agg_a + agg_b * init, mask=nmask)  # the carry, if first
    tl.debug_barrier()
    tl.atomic_xchg(FL + pid_s, first.to(tl.int32) + 1, sem="release")  # 2 if first
    carry = init
    acc_a = tl.zeros_like(agg_a)  # not agg_a * 0: a NaN in this segment must stay in it
    acc_b = acc_a + 1.0
    w = tl.arange(0, W)
    top = pid_s + step
    done = first.to(tl.int32)
    while done == 0:
        j = top + step * w
        valid = (j >= 0) & (j < S)
        st = tl.atomic_add(FL + j, 0, mask=valid, sem="acquire")
        st = tl.where(valid, st, 3)
        if MAPS_ONLY:
            if REVERSE:
                st = tl.where(j == S - 1, st, tl.minimum(st, 1))
            else:
                st = tl.where(j == 0, st, tl.minimum(st, 1))
        # the nearest published carry in the window, and whether every segment
        # between it and us has published at least its map
        p_w = tl.min(tl.where(st == 2, w, W), axis=0)
        blocked = tl.max(tl.where((w < p_w) & (st == 0), 1, 0), axis=0)
        if blocked == 0:
            tl.debug_barrier()
            jj = j[None, :].to(tl.int64) * N + n[:, None]
            lm = nmask[:, None] & valid[None, :]
            ma = tl.load(PA + jj, mask=lm & (w[None, :] < p_w), other=0.0, volatile=True)
            mb = tl.load(PB + jj, mask=lm & (w[None, :] < p_w), other=1.0, volatile=True)
            pp = tl.load(PP + jj, mask=lm & (w[None, :] == p_w), other=0.0, volatile=True)
            ma = tl.where(w[None, :] == p_w, pp, ma).to(agg_a.dtype)
            mb = tl.where(w[None, :] == p_w, 0.0, mb).to(agg_a.dtype)
            # the window's maps, the farthest applied first
            ga, gb = tl.associative_scan((ma, mb), 1, _combine, reverse=True)
            ga = _column(ga, w[None, :], 0)
            gb = _column(gb, w[None, :], 0)
            if p_w < W:
                carry = acc_a + acc_b * ga
                done = 1
            else:
                acc_a = acc_a + acc_b * ga
                acc_b = acc_b * gb
                top = top + step * W
    if first == 0:
        tl.store(PP + off, agg_a + agg_b * carry, mask=nmask)
        tl.debug_barrier()
        tl.atomic_xchg(FL + pid_s, 2, sem="release")
    return carry


@triton.jit(do_not_specialize=["UNIT"])
def scan_kernel(
    OUT0, OUT1, so1, so2, sot,
    X, sx1, sx2, sxt, V, sv1, sv2, svt, NV, snv1, snv2, snvt,
    TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, BOOT, sc1, sc2,
    G, sg1, sg2, sgt, g_hi, g_lo, L, sl1, sl2, slt, l_hi, l_lo,
    RHO, sr1, sr2, srt, RB, srb1, srb2, srbt, rb_hi, rb_lo, CB, scb1, scb2, scbt, cb_hi, cb_lo,
    PB, spb1, spb2, spbt, pb_hi, pb_lo,
    INIT, si1, si2, WS,
    N, N2, T, SEG_LEN, S, UNIT,
    MODE: tl.constexpr, REVERSE: tl.constexpr, PHASE: tl.constexpr,
    HAS_V: tl.constexpr, HAS_NV: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr,
    G_TENSOR: tl.constexpr, L_TENSOR: tl.constexpr, HAS_INIT: tl.constexpr,
    RB_TENSOR: tl.constexpr, CB_TENSOR: tl.constexpr, PB_TENSOR: tl.constexpr,
    TWO_OUT: tl.constexpr, FP64: tl.constexpr, SCALAR_N: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr,
    STAGES: tl.constexpr, LOOK_W: tl.constexpr, LOOK_MAPS_ONLY: tl.constexpr,
):
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
    n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)
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
    o1 = n1[:, None]
    o2 = n2[:, None]
    nm2 = nmask[:, None]
    cols = tl.arange(0, BLOCK_T)[None, :]
    if FP64:
        zero = tl.zeros([BLOCK_N], dtype=tl.float64)
    else:
        zero = tl.zeros([BLOCK_N], dtype=tl.float32)

    carry = zero
    if HAS_INIT:
        carry = tl.load(INIT + n1 * si1 + n2 * si2, mask=nmask, other=0).to(zero.dtype)

    if PHASE == 3:
        # the middle pass: compose the segment maps (A, B) of PHASE 1 once, in time order,
        # and leave in each segment's slot the carry leaving it
        s_cols = tl.arange(0, BLOCK_S)[None, :]
        n_sc = tl.cdiv(S, BLOCK_S)
        for kk in range(0, n_sc):
            if REVERSE:
                k = n_sc - 1 - kk
                edge = 0
            else:
                k = kk
                edge = BLOCK_S - 1
            s_idx = k * BLOCK_S + s_cols
            sm = nm2 & (s_idx < S)
            w_off = s_idx.to(tl.int64) * N + n[:, None]
            wa = tl.load(WS + w_off, mask=sm, other=0.0).to(zero.dtype)
            wb = tl.load(WS + S * N + w_off, mask=sm, other=1.0).to(zero.dtype)
            A, B = tl.associative_scan((wa, wb), 1, _combine, reverse=REVERSE)
            h = A + B * carry[:, None]
            tl.store(WS + w_off, h.to(WS.dtype.element_ty), mask=sm)
            carry = _column(h, s_cols, edge)
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
        boot = zero[:, None]
        if HAS_BOOT:
            boot = tl.load(BOOT + n1 * sc1 + n2 * sc2, mask=nmask, other=0).to(zero.dtype)[:, None]
        n_chunks = tl.cdiv(t_hi - t_lo, BLOCK_T)
        for kk in tl.range(0, n_chunks, num_stages=STAGES):
            if REVERSE:
                k = n_chunks - 1 - kk
            else:
                k = kk
            t = (t_lo + k * BLOCK_T + cols).to(tl.int64)
            m = nm2 & (t < t_hi)
            alpha, beta, v, p0, p1, vnext, cont, extra = _coefficients(
                X, sx1, sx2, sxt, V, sv1, sv2, svt, NV, snv1, snv2, snvt,
                TERM, sa1, sa2, sat, TRUNC, sb1, sb2, sbt, boot,
                G, sg1, sg2, sgt, g_hi, g_lo, L, sl1, sl2, slt, l_hi, l_lo,
                RHO, sr1, sr2, srt, RB, srb1, srb2, srbt, rb_hi, rb_lo,
                CB, scb1, scb2, scbt, cb_hi, cb_lo, PB, spb1, spb2, spbt, pb_hi, pb_lo,
                o1, o2, t, m, T,
                MODE, HAS_V, HAS_NV, HAS_TRUNC, HAS_BOOT, G_TENSOR, L_TENSOR,
                RB_TENSOR, CB_TENSOR, PB_TENSOR, FP64, REVERSE,
            )
            alpha = tl.where(m, alpha, 0.0)
            beta = tl.where(m, beta, 1.0)
            A, B = tl.associative_scan((alpha, beta), 1, _combine, reverse=REVERSE)
            if REVERSE:
                edge = 0
            else:
                edge = BLOCK_T - 1
            if PHASE == 4:  # one chunk per segment: its map, then the carry entering it
                carry = _look_back(WS, _column(A, cols, edge), _column(B, cols, edge), carry,
                                   n, nmask, pid_n, pid_s, N, S, REVERSE, LOOK_W,
                                   LOOK_MAPS_ONLY)
                carry_seg = carry
            if PHASE == 1:
                carry_a = _column(A, cols, edge) + _column(B, cols, edge) * carry_a
                carry_b = _column(B, cols, edge) * carry_b
            else:
                h = A + B * carry[:, None]
                p_out = o1 * so1 + o2 * so2 + t * sot
                if MODE == 4:
                    # pg_t needs vs_{t+1}: stored by this program (this chunk, or the one after
                    # it in time, processed before it); at the segment's end, V_{t+1} + carry.
                    tl.store(OUT0 + p_out, (h + v).to(OUT0.dtype.element_ty), mask=m)
                    tl.debug_barrier()
                    m_in = m & cont & (t + 1 < t_hi)
                    vs_next = tl.load(OUT0 + p_out + sot, mask=m_in, other=0.0).to(h.dtype)
                    vs_next = tl.where(t + 1 == t_hi, vnext + carry_seg[:, None], vs_next)
                    pg = p0 + tl.where(cont, p1 * vs_next, 0.0)
                    tl.store(OUT1 + p_out, pg.to(OUT1.dtype.element_ty), mask=m)
                elif MODE == 5:
                    tl.store(OUT0 + p_out, (h + v).to(OUT0.dtype.element_ty), mask=m)
                elif MODE == 8:
                    g_r = p1 * h + p0
                    tl.store(OUT0 + p_out, g_r.to(OUT0.dtype.element_ty), mask=m)
                    if TWO_OUT:
                        # OUT0_{t-1}: stored by this program (this chunk or the one before
                        # it); at the segment's start, from the carry entering it
                        tl.debug_barrier()
                        r_prev = tl.load(OUT0 + p_out - sot, mask=m & (t > t_lo),
                                         other=0.0).to(h.dtype)
                        r_prev = tl.where(t == t_lo, cont * carry_seg[:, None] + extra, r_prev)
                        g_val = v - g_r + vnext * r_prev
                        tl.store(OUT1 + p_out, g_val.to(OUT1.dtype.element_ty), mask=m)
                elif MODE == 6 or MODE == 7:
                    tl.store(OUT0 + p_out, h.to(OUT0.dtype.element_ty), mask=m)
                    if TWO_OUT:
                        # u_{t-1}: stored by this program (this chunk or the one before it);
                        # at the segment's start, the carry entering it
                        tl.debug_barrier()
                        u_prev = tl.load(OUT0 + p_out - sot, mask=m & (t > t_lo),
                                         other=0.0).to(h.dtype)
                        u_prev = tl.where(t == t_lo, carry_seg[:, None], u_prev)
                        g_val = p1 * u_prev
                        if MODE == 6:
                            g_val = g_val + v - h
                        tl.store(OUT1 + p_out, g_val.to(OUT1.dtype.element_ty), mask=m)
                else:
                    tl.store(OUT0 + p_out, h.to(OUT0.dtype.element_ty), mask=m)
                    if TWO_OUT:
                        tl.store(OUT1 + p_out, (h + v).to(OUT1.dtype.element_ty), mask=m)
                carry = _column(h, cols, edge)

        if PHASE == 1:
            w_off = pid_s.to(tl.int64) * N + n
            tl.store(WS + w_off, carry_a, mask=nmask)
            tl.store(WS + S * N + w_off, carry_b, mask=nmask)


# ----------------------------------------------------------------------------- launcher

_SM_COUNT: dict = {}
# Tests set this to force the segmented (parallel-over-time) path on small shapes.
FORCE_SEGMENT_LEN: int | None = None
# Tile sweeps (scripts/tile_sweep.py) set this to
# (BLOCK_N, BLOCK_T, num_warps[, SCALAR_N[, STAGES[, PROGRAMS_PER_SM]]]).
TILE_OVERRIDE: tuple | None = None
PROGRAMS_PER_SM = 8  # time is split into segments until there are about this many programs per SM
# Segmented plans in one launch with a decoupled look-back (PHASE 4) instead of three
# (maps, middle pass, outputs): None = where _use_look_back says (measured on the H200),
# True / False = always / never (RL_TRITON_CORE_LOOKBACK=1 / 0; tests, sweeps).
LOOKBACK: bool | None = {"1": True, "0": False}.get(os.environ.get("RL_TRITON_CORE_LOOKBACK", ""))
LOOK_W = 16  # segments the look-back reads at a time
LOOK_MAPS_ONLY = False  # tests: walk back over maps only (see _look_back)
MIDDLE_ELEMS = 2048  # the middle pass: BLOCK_N streams x BLOCK_S maps a step (tests lower it)
TM_STEPS = 16  # steps per thread and chunk of the time-major (thread-per-stream) tiles


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small, so tests reach the segmented path
    idx = device.index if device.index is not None else 0
    sms = _SM_COUNT.get(idx)
    if sms is None:
        import torch

        sms = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


def _segments(N: int, T: int, block_n: int, block_t: int, device,
              per_sm: int = PROGRAMS_PER_SM) -> tuple:
    """(SEG_LEN, S): split time when the stream blocks alone cannot fill the GPU."""
    if FORCE_SEGMENT_LEN is not None:  # tests: FORCE_SEGMENT_LEN is a power of two >= 16
        seg = max(block_t, FORCE_SEGMENT_LEN // block_t * block_t)
    else:
        # enough programs to keep every SM busy: a few long streams get ~per_sm per SM
        n_blocks = triton.cdiv(N, block_n)
        target = per_sm * _sm_count(device)
        seg = T
        chunks = triton.cdiv(T, block_t)
        if n_blocks < target // 4 and chunks > 1:
            S = min(chunks, triton.cdiv(target, n_blocks), 512)
            seg = triton.cdiv(chunks, S) * block_t
    S = max(1, triton.cdiv(T, seg))
    if S == 1:
        seg = max(T, 1)
    return seg, S


def _plan(N: int, T: int, time_contiguous: bool, device, mode: int = MODE_GAE,
          elem_bytes: int = 4):
    """Tile shape, warps and time segmentation:
    (BLOCK_N, BLOCK_T, SEG_LEN, S, num_warps, SCALAR_N, STAGES).

    Batch-major data (time contiguous): one warp per stream row and a chunk of
    32 x VEC steps (VEC = 16 bytes of the data type: one vector load per thread
    and tensor), so the scan runs in registers and warp shuffles, without shared
    memory. Measured on the H200 (docs/notes.md, tile sweep): 8 rows x 8 warps
    for GAE / TD(lambda), 4 x 4 for the others; 2 rows x 4 warps where that alone
    fills the GPU and the larger tile would split time. Time-major data (streams
    contiguous): one thread per stream (SCALAR_N), each holding BLOCK_T steps, so
    a warp's loads are one coalesced row per step and the scan is sequential in
    registers -- unless there are fewer streams than a warp has threads: there,
    up to 32 streams x 128 steps over 8 warps.
    When the tiles cannot fill the GPU (few streams), time is split into
    segments of whole chunks: two passes over the inputs, one over the outputs,
    and between them one small pass over the segments' maps.
    """
    tp = triton.next_power_of_2(max(T, 1))
    np2 = triton.next_power_of_2(max(N, 1))
    vec = max(1, 16 // elem_bytes)
    scalar_n = False
    stages = 1  # the chunk loop's software pipelining (tl.range num_stages); 1: none
    if time_contiguous:
        num_warps = 8 if mode in (MODE_GAE, MODE_TDLAMBDA) else 4
        block_t = max(16, min(tp, 32 * vec))
        block_n = max(2, min(np2, 32 * vec * num_warps // block_t))
        if block_n > np2:  # a stream or two: several warps per row, VEC steps per thread
            block_t = max(16, min(tp, 32 * vec * num_warps // block_n))
        elif (_segments(N, T, block_n, block_t, device)[1] > 1
              and triton.cdiv(N, 2) >= 2 * _sm_count(device)):
            # enough streams to fill the GPU without splitting time if a program takes
            # two rows (two warps each): one pass instead of two (1024x4096: GAE 52 -> 34
            # us, V-trace 72 -> 56 us, docs/bench/*-s4-sweep3.md)
            block_n, block_t, num_warps = 2, max(16, min(tp, 64 * vec)), 4
    else:
        num_warps = 2 if N >= 32768 else 1  # the sweep's best (docs/bench/*-s3-tm-sweep.md)
        block_n = 32 * num_warps
        block_t = max(16, min(tp, TM_STEPS))
        # thread per stream from one warp of streams: with the middle pass, also for
        # many time segments (256x16384 GAE 148 -> 68 us, docs/bench/*-s4-tm-sweep.md)
        scalar_n = N >= 32
        if not scalar_n:
            block_n = max(2, min(np2, 32))
            block_t = max(16, min(tp, 4096 // block_n))
            num_warps = 8 if block_n * block_t >= 4096 else 4
    per_sm = PROGRAMS_PER_SM
    if TILE_OVERRIDE is not None:
        block_n, block_t, num_warps = TILE_OVERRIDE[:3]
        scalar_n = len(TILE_OVERRIDE) > 3 and TILE_OVERRIDE[3]
        stages = TILE_OVERRIDE[4] if len(TILE_OVERRIDE) > 4 else 1
        per_sm = TILE_OVERRIDE[5] if len(TILE_OVERRIDE) > 5 else per_sm
    if FORCE_SEGMENT_LEN is not None:
        block_t = max(16, min(block_t, FORCE_SEGMENT_LEN))
    seg, S = _segments(N, T, block_n, block_t, device, per_sm)
    return block_n, block_t, seg, S, num_warps, scalar_n, stages


def _use_look_back(N: int, T: int, block_n: int, block_t: int, device) -> bool:
    """Whether a segmented plan runs as one look-back launch (a chunk per program).

    Measured on the H200 (docs/bench/*-s4-lookback.md): up to ~8 programs per SM
    the look-back takes 0.65-1.04x the three launches' device time (4096x128 and
    512x128 time-major, 256x1024, 16x131072 time-major), and saves two launches;
    from ~2,000 programs its serial walk back over many segments makes it 2-3x
    slower (16x131072 batch-major, 1x1M, 1024x4096 and 256x16384 time-major).
    """
    if LOOKBACK is not None:
        return LOOKBACK
    programs = triton.cdiv(N, block_n) * triton.cdiv(T, block_t)
    return programs <= PROGRAMS_PER_SM * _sm_count(device)


# The kernel's input slots in argument order, with their argument counts: a
# pointer and its strides (three, or two without a time axis), then for gamma and
# the coefficients (gamma, lambda, the clip thresholds) the float32 (hi, lo) pair of a scalar.
ARG_ORDER = (("x", 4), ("v", 4), ("nv", 4), ("term", 4), ("trunc", 4), ("boot", 3), ("g", 6),
             ("l", 6), ("rho", 4), ("rb", 6), ("cb", 6), ("pb", 6), ("init", 3))
ARG_START = 5  # after OUT0, OUT1 and the outputs' three strides


def launch(out0, out1, so, slots, mode, reverse, N, N2, T, two_out, fp64, time_contiguous):
    """Launch the scan. ``slots`` maps each name of ARG_ORDER to its arguments
    ``(tensor or None, strides..., [scalars])``.

    Returns what a cached launch needs to repeat this one without Triton's
    argument binding: ``(args, ws_spec, [(compiled kernel, grid, constexprs)])``.
    """
    import torch

    device = out0.device
    block_n, block_t, seg, S, num_warps, scalar_n, stages = _plan(N, T, time_contiguous, device,
                                                                  mode,
                                                out0.element_size())
    dummy = out0
    args = [out0, out1 if out1 is not None else out0, *so]
    for name, _ in ARG_ORDER:
        a = slots[name]
        args += [a[0] if a[0] is not None else dummy, *a[1:]]
    x, v, nv, term, trunc, boot, g, l, rho, rb, cb, pb, init = (
        slots[name] for name, _ in ARG_ORDER)
    flags = dict(
        MODE=mode, REVERSE=reverse, HAS_V=v[0] is not None, HAS_NV=nv[0] is not None,
        HAS_TRUNC=trunc[0] is not None, HAS_BOOT=boot[0] is not None,
        G_TENSOR=g[0] is not None, L_TENSOR=l[0] is not None, HAS_INIT=init[0] is not None,
        RB_TENSOR=rb[0] is not None, CB_TENSOR=cb[0] is not None, PB_TENSOR=pb[0] is not None,
        TWO_OUT=two_out, FP64=fp64, SCALAR_N=scalar_n, STAGES=stages, BLOCK_N=block_n,
        BLOCK_T=block_t, BLOCK_S=2, LOOK_W=LOOK_W, LOOK_MAPS_ONLY=LOOK_MAPS_ONLY,
    )
    grid = (triton.cdiv(N, block_n), S)
    ws_spec = None
    wdt = torch.float64 if fp64 else torch.float32
    if S == 1:
        phases = (0,)
        ws = dummy
    elif _use_look_back(N, T, block_n, block_t, device):
        # one chunk per segment, one launch; the workspace starts zeroed (statuses, ticket)
        seg = block_t
        S = triton.cdiv(T, seg)
        grid = (triton.cdiv(N, block_n) * S, 1)
        phases = (4,)
        ws_spec = ((3 * S * N + triton.cdiv(N, block_n) * S + 1,), wdt, True)
        ws = torch.zeros(ws_spec[0], device=device, dtype=wdt)
    else:
        phases = (1, 3, 2)
        ws_spec = ((2, S, N), wdt, False)
        ws = torch.empty(ws_spec[0], device=device, dtype=wdt)
    args += [ws, N, N2, T, seg, S, 1]
    launched = []
    for phase in phases:
        consts = {**flags, "PHASE": phase}
        pgrid = grid
        if phase == 3:  # the middle pass: one program per stream block, BLOCK_S maps a step
            pgrid = (grid[0], 1)
            consts["BLOCK_S"] = max(2, min(triton.next_power_of_2(S), MIDDLE_ELEMS // block_n))
        kernel = scan_kernel[pgrid](*args, **consts, num_warps=num_warps)
        launched.append((kernel, pgrid, consts))
    return args, ws_spec, launched
