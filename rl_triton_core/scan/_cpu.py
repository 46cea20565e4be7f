"""The CPU path: the same scan as the Triton kernel, compiled by numba.

Same modes, same coefficient formulas, same segmentation of the time axis
(so a single long stream uses every core), float64 arithmetic. Inputs are
numpy views of the torch tensors as [N1, N2, T] (strided, no copy). Like the
kernel's constexpr flags, the mode and the optional inputs are compile-time
constants of one specialised function per variant (built on first use).
"""

from __future__ import annotations

import numba
import numpy as np

from rl_triton_core import _host
from rl_triton_core._table import (
    MODE_GAE,
    MODE_LINREC,
    MODE_RETRACE,
    MODE_TDLAMBDA,
    MODE_TRACE,
    MODE_VTRACE,
)

_KERNELS: dict = {}
_CACHE = _host.NUMBA_CACHE  # numba's on-disk cache (per variant)
if _CACHE:
    _host.cache_outside_the_source_tree(__file__)


def kernel(mode, reverse, two_out, has_v, has_nv, has_trunc, has_boot, has_init, g_tensor,
           l_tensor, rb_tensor=False, cb_tensor=False, pb_tensor=False):
    key = (mode, reverse, two_out, has_v, has_nv, has_trunc, has_boot, has_init, g_tensor,
           l_tensor, rb_tensor, cb_tensor, pb_tensor)
    fn = _KERNELS.get(key)
    if fn is None:
        fn = _KERNELS[key] = _build(*key)
    return fn


@numba.njit(cache=_CACHE)
def _carry_in(MODE, REVERSE, HAS_V, G_TENSOR, L_TENSOR, CB_TENSOR, i, j, lo, hi, T, v, term, g,
              lm, gs, lms, rho, cb, cbs):
    """What a segment [lo, hi) needs from beyond it, for :func:`_coefficients`' carry
    ``c = (has, c1, c2)``: in a reverse scan, whether step t + 1 < T exists and its
    values V_{t+1} and (Retrace) lambda_{t+1} min(rho_{t+1}, c_bar_{t+1}); in the forward
    trace, the decay gamma_{t-1} lambda_{t-1} [not done_{t-1}] entering step t (at t = 0,
    gamma_0 lambda_0: it multiplies ``init``)."""
    if MODE == MODE_TRACE and not REVERSE:
        tp = max(lo - 1, 0)
        gamma = float(g[i, j, tp]) if G_TENSOR else gs
        lmbda = float(lm[i, j, tp]) if L_TENSOR else lms
        cut = lo >= 1 and term[i, j, tp] != 0
        return False, 0.0 if cut else gamma * lmbda, 0.0
    has = hi < T
    vnext = float(v[i, j, hi]) if HAS_V and has else 0.0
    cnext = 0.0
    if MODE == MODE_RETRACE and has:
        lnext = float(lm[i, j, hi]) if L_TENSOR else lms
        cbn = float(cb[i, j, hi]) if CB_TENSOR else cbs
        cnext = lnext * min(np.exp(float(rho[i, j, hi])), cbn)
    return has, vnext, cnext


@numba.njit(cache=_CACHE)
def _coefficients(MODE, REVERSE, HAS_V, HAS_NV, HAS_TRUNC, HAS_BOOT, G_TENSOR, L_TENSOR,
                  RB_TENSOR, CB_TENSOR, PB_TENSOR, k, x, v, nv, term, trunc, bootv, g, lm, gs,
                  lms, rho, rb, cb, pb, rbs, cbs, pbs, c):
    """(alpha, beta, v, p0, p1, vnext, cont) of the ``k``-th step, in scan order, of a
    segment's 1-D views (see the coefficient builders of _kernel.py; V-trace's
    pg_t = p0 + [cont] p1 (vnext + D_{t+1})), and the carry ``c`` (:func:`_carry_in`)
    for the step after it: what step t needs of its neighbour in time was read one
    iteration before, so no index leaves the views and none is negative (numba's
    indexing with a signed index it cannot prove >= 0 costs several instructions per
    access)."""
    has, c1, c2 = c
    xt = float(x[k])
    if MODE == MODE_LINREC:
        return xt, float(v[k]), xt, 0.0, 0.0, 0.0, False, c
    if MODE == MODE_TRACE:
        gamma = float(g[k]) if G_TENSOR else gs
        lmbda = float(lm[k]) if L_TENSOR else lms
        own = 0.0 if term[k] != 0 else gamma * lmbda
        if REVERSE:  # the adjoint: u_t = g_t + gamma_t lambda_t [not done_t] u_{t+1}
            return xt, own, xt, 0.0, 0.0, 0.0, False, c
        return xt, c1, xt, 0.0, 0.0, 0.0, False, (has, own, c2)
    gamma = float(g[k]) if G_TENSOR else gs
    lmbda = float(lm[k]) if L_TENSOR else lms
    # a flag is set where nonzero (2.0, -1, NaN), read here in the flag's own dtype (bool
    # as uint8, float): a compare and a select, no branch, no host-side conversion
    te = term[k] != 0
    done = (te | (trunc[k] != 0)) if HAS_TRUNC else te
    vt = float(v[k]) if HAS_V else 0.0
    vnext = c1
    if HAS_NV:
        nvt = float(nv[k])
    elif has:
        nvt = vnext
    else:
        nvt = bootv
    # a set flag cuts by a select, never a product: 0 * NaN is NaN (semantics.md)
    bnv = 0.0 if te else gamma * nvt
    if MODE == MODE_GAE:
        return (xt + bnv - vt, 0.0 if done else gamma * lmbda, vt, 0.0, 0.0, 0.0, False,
                (True, vt, 0.0))
    if MODE == MODE_TDLAMBDA:
        lc = 0.0 if (not has) | done else lmbda
        return (xt + (0.0 if te else gamma * (1.0 - lc) * nvt),
                0.0 if te else gamma * lc, vt, 0.0, 0.0, 0.0, False, (True, vt, 0.0))
    ratio = np.exp(float(rho[k]))
    cbt = float(cb[k]) if CB_TENSOR else cbs
    if MODE == MODE_VTRACE:
        rbt = float(rb[k]) if RB_TENSOR else rbs
        pbt = float(pb[k]) if PB_TENSOR else pbs
        pgrho = min(ratio, pbt)
        cont = (not done) and has
        p0 = pgrho * (xt - vt + (0.0 if cont else bnv))
        return (min(ratio, rbt) * (xt + bnv - vt),
                0.0 if done else gamma * lmbda * min(ratio, cbt), vt, p0, pgrho * gamma,
                vnext, cont, (True, vt, 0.0))
    # Retrace: the trace of step t uses the ratio (lambda, c_bar) of step t+1 (c2)
    return (xt + bnv - vt, 0.0 if done else gamma * c2, vt, 0.0, 0.0, 0.0, False,
            (True, vt, lmbda * min(ratio, cbt)))


@numba.njit(cache=_CACHE)
def _view(REVERSE, a, i, j, lo, hi):
    """Stream (i, j)'s steps [lo, hi) in scan order, as a 1-D view. (At module level: a
    jitted function in ``scan``'s closure would enter numba's cache key pickled, which
    differs per process, so the cache would never hit: a compile in every process.)"""
    return a[i, j, lo:hi][::-1] if REVERSE else a[i, j, lo:hi]


def _build(MODE, REVERSE, TWO_OUT, HAS_V, HAS_NV, HAS_TRUNC, HAS_BOOT, HAS_INIT, G_TENSOR,
           L_TENSOR, RB_TENSOR, CB_TENSOR, PB_TENSOR):
    """The scan of one variant; its closure holds only the variant's flags (numba's cache
    key includes the closure's contents, pickled: no function objects there)."""
    @numba.njit(nogil=True, cache=_CACHE)
    def scan(out0, out1, x, v, nv, term, trunc, boot, g, lm, gs, lms, init, rho, rb, cb, pb, rbs,
             cbs, pbs, seg_len, ws_a, ws_b, phase, job_lo, job_hi):
        """Jobs [job_lo, job_hi) of one phase; job = (stream n, segment s)."""
        N1, N2, T = x.shape
        S = ws_a.shape[1]
        for jj in range(job_lo, job_hi):
            # a reverse scan walks its jobs from the last: with each stream's steps walked
            # backwards too, memory is then read in one descending sweep, which the
            # hardware prefetcher follows (ascending streams, each walked backwards, ran
            # 2.5x slower at 4096x128)
            job = job_lo + job_hi - 1 - jj if REVERSE else jj
            n = job // S
            s = job % S
            i = n // N2
            j = n % N2
            lo = s * seg_len
            hi = min(lo + seg_len, T)
            c = _carry_in(MODE, REVERSE, HAS_V, G_TENSOR, L_TENSOR, CB_TENSOR, i, j, lo, hi, T,
                          v, term, g, lm, gs, lms, rho, cb, cbs)
            xs, vs, nvs = (_view(REVERSE, x, i, j, lo, hi), _view(REVERSE, v, i, j, lo, hi),
                           _view(REVERSE, nv, i, j, lo, hi))
            tes, trs = _view(REVERSE, term, i, j, lo, hi), _view(REVERSE, trunc, i, j, lo, hi)
            gv, lv, rh = (_view(REVERSE, g, i, j, lo, hi), _view(REVERSE, lm, i, j, lo, hi),
                          _view(REVERSE, rho, i, j, lo, hi))
            rbv, cbv = _view(REVERSE, rb, i, j, lo, hi), _view(REVERSE, cb, i, j, lo, hi)
            pbv = _view(REVERSE, pb, i, j, lo, hi)
            bootv = float(boot[i, j]) if HAS_BOOT else 0.0
            if phase == 1:
                # each segment's composed map h_in -> a + b * h_in; a zero beta drops the
                # carry (h = alpha, even for a NaN h), so a zero factor makes b exactly 0
                a = 0.0
                b = 1.0
                for k in range(hi - lo):
                    al, be, _, _, _, _, _, c = _coefficients(
                        MODE, REVERSE, HAS_V, HAS_NV, HAS_TRUNC, HAS_BOOT, G_TENSOR, L_TENSOR,
                        RB_TENSOR, CB_TENSOR, PB_TENSOR, k, xs, vs, nvs, tes, trs, bootv, gv, lv,
                        gs, lms, rh, rbv, cbv, pbv, rbs, cbs, pbs, c)
                    a = al if be == 0.0 else al + be * a
                    b = 0.0 if (be == 0.0) | (b == 0.0) else be * b
                ws_a[n, s] = a
                ws_b[n, s] = b
                continue
            # phase 2: the carry entering this segment, then the outputs
            h = float(init[i, j]) if HAS_INIT else 0.0
            if REVERSE:
                for q in range(S - 1, s, -1):
                    h = ws_a[n, q] if ws_b[n, q] == 0.0 else ws_a[n, q] + ws_b[n, q] * h
            else:
                for q in range(s):
                    h = ws_a[n, q] if ws_b[n, q] == 0.0 else ws_a[n, q] + ws_b[n, q] * h
            o0, o1 = _view(REVERSE, out0, i, j, lo, hi), _view(REVERSE, out1, i, j, lo, hi)
            for k in range(hi - lo):
                al, be, vt, p0, p1, vnext, cont, c = _coefficients(
                    MODE, REVERSE, HAS_V, HAS_NV, HAS_TRUNC, HAS_BOOT, G_TENSOR, L_TENSOR,
                    RB_TENSOR, CB_TENSOR, PB_TENSOR, k, xs, vs, nvs, tes, trs, bootv, gv, lv, gs,
                    lms, rh, rbv, cbv, pbv, rbs, cbs, pbs, c)
                d_next = h
                h = al if be == 0.0 else al + be * h
                if MODE == MODE_VTRACE:
                    o0[k] = h + vt
                    o1[k] = p0 + (p1 * (vnext + d_next) if cont else 0.0)
                elif MODE == MODE_RETRACE:
                    o0[k] = h + vt
                else:
                    o0[k] = h
                    if TWO_OUT:
                        o1[k] = h + vt

    return _host.locked_compiles(scan)


THREADS, _MIN_WORK, _pool = _host.THREADS, _host.MIN_WORK, _host.pool
_NO_MAPS = np.zeros((1, 1))  # the segment maps' stand-in where each stream is one segment


def run(fn, args, N: int, T: int, threads: int | None = None):
    """Run both phases over (stream, segment) jobs, split over threads (numba releases the
    GIL); ``threads``: the tuning's ``cpu_threads`` (None: THREADS)."""
    threads = (threads or THREADS) if N * T >= _MIN_WORK else 1
    if N >= threads or T < 4096 or threads < 4:
        # one segment per stream; a long stream is split only for >= 4 threads, since
        # the split costs a second pass over the inputs (with 2 threads it did not pay)
        seg = max(T, 1)
    else:  # a few long streams: split time so every thread has work
        seg = max(1024, -(-T // min(4 * threads, T // 1024)))
    S = -(-T // seg)
    if S == 1:  # one pass, which reads no segment maps
        ws_a = ws_b = _NO_MAPS
    else:
        ws_a = np.zeros((N, S))
        ws_b = np.ones((N, S))
    jobs = N * S
    threads = min(threads, jobs)
    phases = (1, 2) if S > 1 else (2,)
    for phase in phases:
        if threads == 1:
            fn(*args, seg, ws_a, ws_b, phase, 0, jobs)
            continue
        step = -(-jobs // threads)
        futures = [_pool().submit(fn, *args, seg, ws_a, ws_b, phase, lo, min(lo + step, jobs))
                   for lo in range(step, jobs, step)]
        fn(*args, seg, ws_a, ws_b, phase, 0, min(step, jobs))
        for f in futures:
            f.result()
