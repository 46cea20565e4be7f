"""The CPU path's first calls: GAE in numpy while numba loads in the background.

Importing numba costs 300-500 ms of a process's time on a 2-core machine, before any
cached kernel loads (and about 1.5 s more per variant when numba's disk cache is
cold). So the first CPU call of a GAE variant runs here, in float64 numpy with the
numba loop's own formulas and operation order -- bit for bit the numba path's result
(``tests/core/test_cpu_first_call.py``) -- and starts one daemon thread that imports
numba and loads (or compiles) that variant's kernel. Calls after it take numba once
the kernel is ready. ``RL_TRITON_CORE_CPU_FIRST=0`` turns this off (numba from the
first call).

The scan: h_t = alpha_t + beta_t h_{t+1} (GAE runs backwards in time). A done step
has beta_t = 0, so the recurrence restarts there: the stream splits into pieces that
each start (in scan order) at a done step or at the stream's end. The pieces are laid
side by side in a [L, P] table (L: the longest piece), and the loop runs over L,
vectorised over the P pieces: ``h = a + b * h`` in the same order as the numba loop.
Short windows (T <= 512) skip the split and loop over T for all streams at once.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from rl_triton_core._table import MODE_GAE

_READY: set = set()  # kernel keys whose numba kernel is loaded
_STARTED: set = set()  # kernel keys whose warm-up thread was started
_THREADS: dict = {}  # kernel key -> its warm-up thread
_LOCK = threading.Lock()
_MAX_PIECE = 4096  # a longer piece: the loop would cost more than loading numba
_SHORT = 512  # windows up to this length: one loop over T, no split


def enabled() -> bool:
    return os.environ.get("RL_TRITON_CORE_CPU_FIRST", "1") != "0"


def ready(key) -> bool:
    """The variant's numba kernel is loaded: by a foreground call, or by its warm-up thread,
    which a call waits for if it is still running (numpy's loop would otherwise hand the
    GIL back and forth with numba's import, several ms per step)."""
    thread = _THREADS.get(key)
    if thread is not None:
        thread.join()
    return key in _READY


def settle() -> None:
    """Wait for every warm-up thread: a foreground numba call never runs while one is
    still compiling or loading (two threads in numba's dispatch at once failed: "can't
    unbox array from PyObject" once in CI)."""
    if _THREADS:
        for thread in list(_THREADS.values()):
            thread.join()


def handles(key) -> bool:
    """GAE without an initial carry (the only GAE there is); any inputs otherwise."""
    return key[0] == MODE_GAE and key[1] and not key[7]


def warm(key, fn_args):
    """Start (once per key) the daemon thread that loads this variant's numba kernel."""
    with _LOCK:
        if key in _STARTED:
            return
        _STARTED.add(key)
        thread = _THREADS[key] = threading.Thread(
            target=_warm, args=(key, fn_args), daemon=True, name="rl_triton_core-numba-warmup")
    thread.start()


def _warm(key, fn_args):
    try:
        from rl_triton_core import _cpu

        fn = _cpu.kernel(*key)
        ws = np.zeros((1, 1))
        # an empty job range: compiles or loads the kernel for these argument types,
        # reads and writes nothing
        fn(*fn_args, 1, ws, ws, 2, 0, 0)
    except Exception:  # pragma: no cover - the next call compiles in the foreground
        pass
    finally:
        _READY.add(key)


def _f64(a, N, T):
    return np.ascontiguousarray(a.reshape(N, T), dtype=np.float64)


def gae(key, o0, o1, x, v, nv, term, trunc, boot, g, lm, gs, lms) -> bool:
    """Write GAE into ``o0`` (and ``o1`` = o0 + V) from the numba kernel's arguments;
    False (nothing written) where a piece is too long for the loop to pay."""
    (_, _, two_out, has_v, has_nv, has_trunc, has_boot, _, g_t, l_t) = key[:10]
    N1, N2, T = x.shape
    N = N1 * N2
    te = term.reshape(N, T) != 0
    done = te | (trunc.reshape(N, T) != 0) if has_trunc else te
    if T > _SHORT:
        is_head = done.copy()
        is_head[:, -1] = True
        flat = is_head.ravel()
        pos = np.flatnonzero(flat)
        lengths = np.diff(pos, prepend=-1)
        if int(lengths.max()) > _MAX_PIECE:
            return False
    xt = x.reshape(N, T)
    vt = v.reshape(N, T) if has_v else 0.0
    if has_nv:
        nvt = nv.reshape(N, T)
    else:
        nvt = np.zeros((N, T))
        if has_v:
            nvt[:, :-1] = vt[:, 1:]
        if has_boot:
            nvt[:, -1] = boot.reshape(N)
    # the numba loop's formulas and order of operations (_cpu._coefficients, GAE):
    # gnt = gamma (1 - te); alpha = (r + gnt V') - V; beta = (gamma lambda) (1 - done);
    # float32 inputs widen exactly inside each float64 ufunc; te, done in {0, 1}, so a
    # select of gamma * 0.0 / gamma * 1.0 is the same product
    if g_t:
        gamma = g.reshape(N, T).astype(np.float64)  # products in float64, as numba's
        gnt = gamma * np.where(te, 0.0, 1.0)
    else:
        gnt = np.where(te, gs * 0.0, gs * 1.0)
    # terminated cuts V' by a select, as the numba loop (0 * NaN would be NaN)
    al = np.where(te, 0.0, np.multiply(gnt, nvt, out=gnt))
    np.add(xt, al, out=al)
    if has_v:
        np.subtract(al, vt, out=al)
    if g_t or l_t:
        gl = (gamma if g_t else gs) * (lm.reshape(N, T).astype(np.float64) if l_t else lms)
        be = np.where(done, 0.0, gl)
    else:
        c = gs * lms
        be = np.where(done, c * 0.0, c * 1.0)
    if T <= _SHORT:
        H = _loop(al.T[::-1], be.T[::-1])
        h = H[::-1].T
    else:
        # piece p covers flat positions (pos[p-1], pos[p]]; k = steps from its head
        pid = np.repeat(np.arange(pos.size), lengths)
        k = pos[pid] - np.arange(flat.size)
        L = int(lengths.max())
        A = np.zeros((L, pos.size))
        B = np.zeros((L, pos.size))
        A[k, pid] = al.ravel()
        B[k, pid] = be.ravel()
        H = _loop(A, B)
        h = H[k, pid].reshape(N, T)
    o0[...] = h.reshape(N1, N2, T)
    if two_out:
        o1[...] = (h + vt).reshape(N1, N2, T)
    return True


def _loop(A, B):
    L, P = A.shape
    H = np.empty((L, P))
    tmp = np.empty(P)
    h = np.zeros(P)
    for k in range(L):
        np.multiply(B[k], h, out=tmp)
        h = H[k]
        np.add(A[k], tmp, out=h)
        np.copyto(h, A[k], where=B[k] == 0)  # a zero beta drops the carry (NaN too)
    return H
