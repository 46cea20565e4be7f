"""The CPU path: the same scan as the Triton kernel, compiled by numba.

Same modes, same coefficient formulas, same segmentation of the time axis
(so a single long stream uses every core), float64 arithmetic. Inputs are
numpy views of the torch tensors as [N1, N2, T] (strided, no copy); missing
inputs arrive as 0-stride dummies with a ``has_*`` switch.
"""

from __future__ import annotations

import os

import numba
import numpy as np

from rl_triton_core._triton_scan import MODE_GAE, MODE_LINREC, MODE_TDLAMBDA, MODE_TRACE

_CACHE = os.environ.get("RL_TRITON_CORE_NUMBA_CACHE", "1") == "1"


@numba.njit(inline="always", cache=_CACHE)
def _coefficients(mode, i, j, t, T, x, v, nv, term, trunc, boot, g, l,
                  has_v, has_nv, has_trunc):
    """(alpha_t, beta_t, v_t) of stream (i, j) at step t; see _triton_scan._coefficients."""
    xt = float(x[i, j, t])
    if mode == MODE_LINREC:
        return xt, float(v[i, j, t]), xt
    if mode == MODE_TRACE:
        tp = max(t - 1, 0)
        notdone = 1.0 - float(term[i, j, tp]) if t >= 1 else 1.0
        return xt, float(g[i, j, tp]) * float(l[i, j, tp]) * notdone, xt
    gamma = float(g[i, j, t])
    lmbda = float(l[i, j, t])
    te = float(term[i, j, t])
    done = max(te, float(trunc[i, j, t])) if has_trunc else te
    vt = float(v[i, j, t]) if has_v else 0.0
    if has_nv:
        nvt = float(nv[i, j, t])
    elif t + 1 < T:
        nvt = float(v[i, j, t + 1]) if has_v else 0.0
    else:
        nvt = float(boot[i, j])
    gnt = gamma * (1.0 - te)
    if mode == MODE_GAE:
        return xt + gnt * nvt - vt, gamma * lmbda * (1.0 - done), vt
    c = 0.0 if t == T - 1 else 1.0 - done
    return xt + gnt * (1.0 - lmbda * c) * nvt, gnt * lmbda * c, vt


@numba.njit(parallel=True, cache=_CACHE)
def scan(mode, reverse, two_out, out0, out1, x, v, nv, term, trunc, boot, g, l, init,
         has_v, has_nv, has_trunc, has_init, seg_len):
    N1, N2, T = x.shape
    N = N1 * N2
    S = (T + seg_len - 1) // seg_len
    ws_a = np.zeros((N, S))
    ws_b = np.ones((N, S))
    if S > 1:
        # phase 1: each segment's composed map h_in -> h_out = a + b * h_in
        for job in numba.prange(N * S):
            n = job // S
            s = job % S
            i = n // N2
            j = n % N2
            lo = s * seg_len
            hi = min(lo + seg_len, T)
            a = 0.0
            b = 1.0
            for k in range(hi - lo):
                t = hi - 1 - k if reverse else lo + k
                al, be, _ = _coefficients(mode, i, j, t, T, x, v, nv, term, trunc, boot, g, l,
                                          has_v, has_nv, has_trunc)
                a = al + be * a
                b = be * b
            ws_a[n, s] = a
            ws_b[n, s] = b
    # phase 2: the carry entering each segment, then the outputs
    for job in numba.prange(N * S):
        n = job // S
        s = job % S
        i = n // N2
        j = n % N2
        h = float(init[i, j]) if has_init else 0.0
        if reverse:
            for q in range(S - 1, s, -1):
                h = ws_a[n, q] + ws_b[n, q] * h
        else:
            for q in range(s):
                h = ws_a[n, q] + ws_b[n, q] * h
        lo = s * seg_len
        hi = min(lo + seg_len, T)
        for k in range(hi - lo):
            t = hi - 1 - k if reverse else lo + k
            al, be, vt = _coefficients(mode, i, j, t, T, x, v, nv, term, trunc, boot, g, l,
                                       has_v, has_nv, has_trunc)
            h = al + be * h
            out0[i, j, t] = h
            if two_out:
                out1[i, j, t] = h + vt


def seg_len_for(N: int, T: int) -> int:
    """Split time only when there are fewer streams than threads."""
    threads = numba.get_num_threads()
    if N >= threads or T < 4096:
        return max(T, 1)
    parts = min(4 * threads, T // 1024)
    return max(1024, -(-T // parts))
