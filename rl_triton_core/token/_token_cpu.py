"""The CPU path of the token-level estimators, compiled by numba.

The same recurrences as :mod:`rl_triton_core.token._token_kernel`, one response per
loop iteration, in float64; responses are split over the CPU path's threads (numba
releases the GIL) as the scan's streams are. Inputs are numpy views ``[R, P]`` (strided,
no copy; bfloat16 data as an int16 view of its bits): a right-padded batch is ``R`` rows
of ``P = T`` tokens; a packed stream is one row whose responses start at ``starts[i]``
and run ``lens[i]`` tokens.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from rl_triton_core import _host
from rl_triton_core._host import settle  # noqa: F401 (no numba call beside a warm-up)

_CACHE = _host.NUMBA_CACHE
if _CACHE:  # numba's cache where the scan's goes, not the package's __pycache__
    _host.cache_outside_the_source_tree(__file__)

GAE_SKIP, GAE_MUL, RET_SKIP, RET_MUL = 0, 1, 2, 3


@intrinsic
def _bf16_bits(typingctx, u):
    """The float64 of bfloat16 bits held in an int16 (the high half of a float32)."""
    sig = types.float64(u)

    def codegen(context, builder, signature, args):
        x = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
        return builder.fpext(builder.bitcast(x, ir.FloatType()), ir.DoubleType())

    return sig, codegen


def _num(x):
    """An element as a float64: bfloat16 arrives as its bits in an int16 view (no copy)."""
    raise NotImplementedError("numba only")


@overload(_num, jit_options={"cache": _CACHE})
def _num_impl(x):
    if x == types.int16:
        return lambda x: _bf16_bits(x)
    return lambda x: float(x)


def _stored(out, x):
    """``x`` as a store into ``out`` keeps it (rounded to ``out``'s dtype), as a float."""
    raise NotImplementedError("numba only")


@overload(_stored, jit_options={"cache": _CACHE})
def _stored_impl(out, x):
    if out.dtype == types.float32:
        return lambda out, x: float(np.float32(x))
    return lambda out, x: float(x)


def _make_scan(MODE):
    """The scan of one mode (a compile-time constant of the closure: no branch on it in
    the loop)."""

    @numba.njit(nogil=True, cache=_CACHE)
    def scan(r, v, m, rows, starts, lens, g, gl, out0, out1, stats, want_stats, lo, hi):
        """Scan responses [lo, hi); where ``want_stats``, ``stats[i]`` = (count, mean, M2)
        of their valid stored (rounded) outputs, as whitening sees them: sums of
        (x - k) and (x - k)^2 with k the row's first valid output (no cancellation).

        Each response's tokens are 1-D views in scan order (last token first) indexed
        from 0 up, so the loop has no negative-index wraparound (numba's indexing with a
        signed index that the compiler cannot prove >= 0 costs several instructions per
        access), and the responses from the last down, so memory is swept in one
        descending direction (as the core CPU path walks its streams). The statistics
        take the output rounded in a register, not reloaded.
        The mask's selects compile to branches (well predicted on real masks: 5% random
        observation tokens cost nothing measurable; 50% random about 1.8x)."""
        for i in range(hi - 1, lo - 1, -1):
            row = rows[i]
            s = starts[i]
            n = lens[i]
            rr = r[row, s:s + n][::-1]
            vv = v[row, s:s + n][::-1]
            mm = m[row, s:s + n][::-1]
            o0 = out0[row, s:s + n][::-1]
            o1 = out1[row, s:s + n][::-1]
            carry = 0.0
            nv = 0.0
            cnt = 0.0
            s1 = 0.0
            s2 = 0.0
            kk = 0.0
            for j in range(n):
                ok = mm[j] != 0
                rt = _num(rr[j])
                if MODE == GAE_SKIP:
                    vt = _num(vv[j])
                    new = rt + g * nv - vt + gl * carry
                    carry = new if ok else carry
                    nv = vt if ok else nv
                    y = carry
                    o1[j] = carry + vt
                elif MODE == GAE_MUL:
                    vt = _num(vv[j]) if ok else 0.0
                    rt = rt if ok else 0.0
                    carry = rt + g * nv - vt + gl * carry
                    nv = vt
                    y = carry
                    o1[j] = carry + vt
                elif MODE == RET_SKIP:
                    new = rt + g * carry
                    carry = new if ok else carry
                    y = carry if ok else 0.0
                else:
                    rt = rt if ok else 0.0
                    carry = rt + g * carry
                    y = carry
                o0[j] = y
                if want_stats:
                    x = _stored(o0, y)
                    kk = x if ok and cnt == 0.0 else kk
                    d = x - kk if ok else 0.0
                    cnt += 1.0 if ok else 0.0
                    s1 += d
                    s2 += d * d
            if want_stats:
                mean = kk + s1 / cnt if cnt > 0 else 0.0
                stats[i, 0] = cnt
                stats[i, 1] = mean
                stats[i, 2] = max(s2 - s1 * s1 / cnt, 0.0) if cnt > 0 else 0.0

    return _host.locked_compiles(scan)


SCANS = {mode: _make_scan(mode) for mode in (GAE_SKIP, GAE_MUL, RET_SKIP, RET_MUL)}


@numba.njit(nogil=True, cache=_CACHE)
def row_stats(x, m, rows, starts, lens, stats, lo, hi):
    """(count, mean, M2) of the valid entries of responses [lo, hi)."""
    for i in range(lo, hi):
        row = rows[i]
        cnt = 0.0
        mean = 0.0
        m2 = 0.0
        for k in range(lens[i]):
            p = starts[i] + k
            if m[row, p] != 0:
                xt = _num(x[row, p])
                cnt += 1.0
                d = xt - mean
                mean += d / cnt
                m2 += d * (xt - mean)
        stats[i, 0] = cnt
        stats[i, 1] = mean
        stats[i, 2] = m2


@numba.njit(nogil=True, cache=_CACHE, error_model="numpy")
def finish(stats, count_eps, eps, unbiased):
    """The whitening's (mean, 1/std) from the rows' statistics, combined in order:
    mean = S / (n + count_eps), var = sum (x - mean)^2 / (n + count_eps) [* n / (n - 1)]."""
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    for i in range(stats.shape[0]):
        nb = stats[i, 0]
        if nb == 0.0:
            continue
        n = cnt + nb
        d = stats[i, 1] - mean
        mean += d * nb / n
        m2 += stats[i, 2] + d * d * cnt * nb / n
        cnt = n
    mu = mean * cnt / (cnt + count_eps)
    d = mean - mu
    var = (m2 + cnt * d * d) / (cnt + count_eps)
    if unbiased:  # one valid token: no unbiased variance, NaN (no raise, no host sync)
        var = np.nan if cnt == 1.0 else var * (cnt / (cnt - 1.0))
    return mu, 1.0 / np.sqrt(var + eps)


row_stats = _host.locked_compiles(row_stats)
finish = _host.locked_compiles(finish)


def _make_whiten(SHIFT, FILL):
    @numba.njit(nogil=True, cache=_CACHE)
    def whiten(x, m, rows, starts, lens, mu, rstd, fill, out, lo, hi):
        for i in range(lo, hi):
            row = rows[i]
            s = starts[i]
            for k in range(lens[i]):
                p = s + k
                y = (_num(x[row, p]) - mu) * rstd
                if not SHIFT:
                    y += mu
                if FILL:
                    y = y if m[row, p] != 0 else fill
                out[row, p] = y

    return _host.locked_compiles(whiten)


WHITENS = {(sh, fi): _make_whiten(sh, fi) for sh in (True, False) for fi in (True, False)}


def layout(n_rows, n_tokens, cu_seqlens):
    """(rows, starts, lens) int64 arrays: padded [n_rows, n_tokens] or packed (one row)."""
    if cu_seqlens is None:
        return (np.arange(n_rows, dtype=np.int64), np.zeros(n_rows, dtype=np.int64),
                np.full(n_rows, n_tokens, dtype=np.int64))
    cu = cu_seqlens.astype(np.int64)
    k = cu.shape[0] - 1
    return np.zeros(k, dtype=np.int64), cu[:-1].copy(), np.diff(cu)


_MADV_HUGEPAGE = 14  # Linux's madvise advice
_HUGE_MIN = 4 << 20  # bytes: a smaller buffer faults in few enough 4 KiB pages
_madvise = None  # libc's madvise once looked up; False where there is none


def huge_pages(*tensors):
    """Ask Linux for transparent huge pages on fresh (untouched) output buffers of at
    least 4 MiB, before the numba pass first writes them: each 2 MiB page then faults
    once instead of 512 times. With THP in ``madvise`` mode (a common default) the
    faults of a fresh 32 MiB buffer (1024x8192 float32) cost about 16 ms on the 2-core
    VM, advised about 3 ms. Advice only: the page-aligned inner range of each contiguous
    buffer; skipped off Linux, where libc has no madvise, or where the kernel refuses."""
    global _madvise
    if not sys.platform.startswith("linux") or _madvise is False:
        return
    if _madvise is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
            fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            fn.restype = ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
            return
    page = mmap.PAGESIZE
    for t in tensors:
        if t is None or not t.is_contiguous():
            continue
        nbytes = t.numel() * t.element_size()
        if nbytes < _HUGE_MIN:
            continue
        lo = -(-t.data_ptr() // page) * page
        hi = (t.data_ptr() + nbytes) // page * page
        if hi > lo:
            _madvise(lo, hi - lo, _MADV_HUGEPAGE)  # the result is ignored: advice only


def split(fn, n_items: int, work: int, *args):
    """``fn(*args, lo, hi)`` over [0, n_items), in ranges split over the CPU path's threads."""
    threads = min(_host.THREADS if work >= _host.MIN_WORK else 1, n_items)
    if threads <= 1:
        fn(*args, 0, n_items)
        return
    step = -(-n_items // threads)
    futures = [_host.pool().submit(fn, *args, lo, min(lo + step, n_items))
               for lo in range(step, n_items, step)]
    fn(*args, 0, min(step, n_items))
    for f in futures:
        f.result()
