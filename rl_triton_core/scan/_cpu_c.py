"""The C scan kernel of the CPU path (``rl_triton_core.scan._cscan``), where it was built.

GAE and TD(lambda) (the reverse scans without an initial carry) run here: compiled at
install time, it needs no JIT, so the first call of a fresh process runs at full speed
and nothing is loaded in the background. Float32 data is computed in float32 where the
CPU has AVX-512 (16 steps or 16 streams a vector; the bits depend on the values only,
not on strides, flag dtypes or threads), and on AVX2 for contiguous rows with gamma and
lambda numbers (the same bits); elsewhere, and for float64 data, the float64 walks give
bit for bit the numba loop's results (the same float64 operations in the same order, no
fused multiply-add). Every other variant, and every
call where the extension is not built, takes the numba path (``rl_triton_core.scan._cpu``).
``RL_TRITON_CORE_CPU_KERNEL=numba`` forces numba for all.
"""

from __future__ import annotations

import os

import torch

from rl_triton_core import _host
from rl_triton_core._table import MODE_GAE, MODE_TDLAMBDA

try:
    from rl_triton_core.scan import _cscan
except ImportError:  # not built (no compiler at install time): numba runs everything
    _cscan = None

THREADS = _host.THREADS  # the CPU path's default number of threads


def _bind():
    """The C replay of recorded calls (``_cscan.replay``), where torch has the DLPack C
    exchange table it reads tensors through; else None."""
    api = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
    if _cscan is None or api is None or not _cscan.bind(torch.Tensor, api, torch.empty):
        return None
    try:  # the block cache's outputs made in C (where both extensions are built)
        from rl_triton_core.token import _ctoken
    except ImportError:
        _ctoken = None
    if _ctoken is not None and hasattr(_ctoken, "blocks_api"):
        try:
            _cscan.bind_blocks(_host, _ctoken, torch.float32, torch.float64)
        except (TypeError, ValueError):  # builds that do not match: the Python allocator
            pass
    return _cscan.replay


replay = _bind()
# the estimators' C entry (estimators._entry), where the replay is bound
entry = getattr(_cscan, "entry", None) if replay is not None else None
Entry = getattr(_cscan, "Entry", None)  # its type
_MODES = {MODE_GAE: 1, MODE_TDLAMBDA: 2}  # the C kernel's mode numbers


def available() -> bool:
    return _cscan is not None


def enabled() -> bool:
    """The C kernel is built and not switched off (``RL_TRITON_CORE_CPU_KERNEL``)."""
    return _cscan is not None and os.environ.get("RL_TRITON_CORE_CPU_KERNEL", "c") != "numba"


def handles(key) -> bool:
    """A variant the C kernel computes: GAE or TD(lambda), reverse, no ``init``, no
    V-trace coefficients (``key``: the numba kernel's key, see ``_dispatch._run_cpu``)."""
    return (key[0] in _MODES and key[1] and not key[7] and not key[10] and not key[11]
            and not key[12] and enabled())


def _scan_args(key, a, threads):
    """``_cscan.scan``'s arguments from the variant ``key`` and ``a`` (``_dispatch.CpuArgs``)."""
    (mode, _, two_out, has_v, has_nv, has_trunc, has_boot, _, g_t, l_t) = key[:10]
    return (_MODES[mode], two_out, has_v, has_nv, has_trunc, has_boot, g_t, l_t, threads or THREADS,
            a.out0, a.out1, a.x, a.v, a.nv, a.term, a.trunc, a.boot, a.g, a.lm, float(a.gs),
            float(a.lms))


def prepare(key, args, threads=None):
    """The call ``run(key, args, threads)`` recorded for :func:`run_prepared` (bytes), or
    None where an array's dtype is not one the kernel reads. Computes nothing."""
    return _cscan.prepare(*_scan_args(key, args, threads))


def run_prepared(prepared, gs, lms, addresses):
    """A :func:`prepare`-d call on the arrays at ``addresses`` (ints, in the order out0,
    out1, x, v, nv, term, trunc, boot, g, lm; 0 for an absent one), which have the
    shapes, strides and dtypes of the recorded call's: no buffer is taken, no view
    built."""
    _cscan.run(prepared, gs, lms, *addresses)


def run(key, args, threads=None) -> bool:
    """Run the variant ``key`` on the numba kernel's arguments ``args`` (outputs first);
    False (nothing written) where an array's dtype is not one the kernel reads."""
    return _cscan.scan(*_scan_args(key, args, threads))


def key(prefix: bytes, args: tuple, time_dim, tuning):
    """The key :data:`replay` looks a call up by (bytes), or None where it has none."""
    return _cscan.key(prefix, args, time_dim, tuning) if replay is not None else None


def recording(prepared, addr, num, lo, hi, extents=None):
    """A :func:`prepare`-d call and where the user's arguments go (see ``_cscan``), as
    bytes for :data:`replay`; ``extents`` (an out= call, whose outputs are arguments 0
    and 1 of ``addr``): each argument's bytes from its address, 0 for no tensor."""
    return _cscan.recording(prepared, addr, num, lo, hi, extents or (0,) * len(addr))
