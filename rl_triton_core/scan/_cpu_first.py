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

from rl_triton_core import _host
from rl_triton_core._table import MODE_GAE

_READY: set = set()  # kernel keys whose numba kernel is loaded
_STARTED: set = set()  # kernel keys whose warm-up thread was started
_LOCK = threading.Lock()
_MAX_PIECE = 4096  # a longer piece: the loop would cost more than loading numba
_SHORT = 512  # windows up to this length: one loop over T, no split


def enabled() -> bool:
    return os.environ.get("RL_TRITON_CORE_CPU_FIRST", "1") != "0"


def ready(key) -> bool:
    """The variant's numba kernel is loaded: by a foreground call, or by its warm-up thread,
    which a call waits for if it is still running (numpy's loop would otherwise hand the
    GIL back and forth with numba's import, several ms per step)."""
    thread = _host.WARMING.get(key)
    if thread is not None:
        thread.join()
    return key in _READY


def handles(key) -> bool:
    """GAE without an initial carry (the only GAE there is); any inputs otherwise."""
    return key[0] == MODE_GAE and key[1] and not key[7]


def warm(key, fn_args):
    """Start (once per key) the daemon thread that loads this variant's numba kernel."""
    with _LOCK:
        if key in _STARTED:
            return
        _STARTED.add(key)
        thread = _host.WARMING[key] = threading.Thread(
            target=_warm, args=(key, fn_args), daemon=True, name="rl_triton_core-numba-warmup")
    thread.start()


def _warm(key, fn_args):
    try:
        from rl_triton_core.scan import _cpu

        fn = _cpu.kernel(*key)
        ws = np.zeros((1, 1))
        # an empty job range: compiles or loads the kernel for these argument types,
        # reads and writes nothing
        fn(*fn_args, 1, ws, ws, 2, 0, 0)
    except Exception:  # pragma: no cover - the next call compiles in the foreground
        pass
    finally:
        _READY.add(key)


def gae(key, out0, out1, *args) -> bool:
    """Write GAE into ``out0`` (and ``out1`` = out0 + V) from the numba kernel's arguments;
    False (nothing written) where a piece is too long for the loop to pay. Silent on
    NaN and inf, as the numba loop is (no numpy RuntimeWarning)."""
    with np.errstate(all="ignore"):
        return _gae(key, out0, out1, *args)


def _gae(key, out0, out1, x, v, nv, term, trunc, boot, g, lm, gs, lms) -> bool:
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
    # alpha = (r + [not te] gamma V') - V; beta = [not done] gamma lambda, in float64
    # (float32 inputs widen exactly inside each float64 ufunc). A set flag cuts by a
    # select, as in the numba loop (0 * NaN would be NaN). The arrays below keep the
    # inputs' memory layout (ufuncs' order K), so these passes run contiguous
    gamma = g.reshape(N, T).astype(np.float64) if g_t else gs
    al = np.multiply(gamma, nvt, dtype=np.float64)
    np.copyto(al, 0.0, where=te)
    np.add(xt, al, out=al)
    if has_v:
        np.subtract(al, vt, out=al)
    # beta: one number (bt) or an array; keep: where beta is nonzero (elsewhere the
    # carry drops: h = alpha exactly)
    if g_t or l_t:
        bt = np.multiply(gamma, lm.reshape(N, T) if l_t else lms, dtype=np.float64)
        keep = ~done & (bt != 0.0)
    else:
        bt = gs * lms
        keep = ~done if bt != 0 else np.zeros_like(done)
    rows = np.ndim(bt) != 0
    if T <= _SHORT:
        # the loop runs over [T, N] tables in scan order (row k: step T-1-k), copied
        # C-contiguous: rows strided across a batch-major [N, T] made it 4x slower
        def scan_order(a):
            return np.ascontiguousarray(a.T[::-1])

        H = _loop(scan_order(al), scan_order(bt) if rows else bt, scan_order(keep))
        h = al  # h back into alpha's buffer (the inputs' layout; a fresh buffer's page
        h[...] = H[::-1].T  # faults cost 1.5-2 ms per 4 MiB in a fresh process)
    else:
        # piece p covers flat positions (pos[p-1], pos[p]]; k = steps from its head;
        # the table's unused cells are not kept (h = alpha = 0 there)
        pid = np.repeat(np.arange(pos.size), lengths)
        k = pos[pid] - np.arange(flat.size)
        L = int(lengths.max())
        A = np.zeros((L, pos.size))
        K = np.zeros((L, pos.size), dtype=bool)
        A[k, pid] = al.ravel()
        K[k, pid] = keep.ravel()
        if rows:
            B = np.zeros((L, pos.size))
            B[k, pid] = bt.ravel()
            bt = B
        h = _loop(A, bt, K)[k, pid].reshape(N, T)
    out0[...] = h.reshape(N1, N2, T)
    if two_out:  # h + V in float64, rounded once into out1's dtype, as the numba loop stores
        np.add(h.reshape(N1, N2, T), v if has_v else 0.0, out=out1)
    return True


def _loop(A, B, keep):
    """The scan in place: row k of ``A`` becomes ``h_k = A[k] + B[k] h_{k-1}`` (h_{-1} = 0;
    ``B``: rows or one number) where ``keep[k]``, and stays ``A[k]`` exactly elsewhere (a
    zero beta drops the carry, NaN too); returns ``A``."""
    L, P = A.shape
    tmp = np.empty(P)
    h = np.zeros(P)
    rows = np.ndim(B) != 0
    for k in range(L):
        np.multiply(B[k] if rows else B, h, out=tmp)
        np.add(A[k], tmp, out=tmp)
        h = A[k]
        np.copyto(h, tmp, where=keep[k])
    return A
