"""Recorded CUDA launches, repeated in C (``_cscan.replay``; ``_claunch.h``).

A call that just ran through Triton's launcher is recorded as what the driver was
given: per compiled kernel its function handle, grid, threads, shared memory and each
parameter's source -- a constant, a tensor the call allocates (the outputs, a
workspace), one of the user's tensors, or one of the user's numbers (as a float32, or
as the float32 pair of a float64 coefficient). A repeated call with the same key is
then checked, allocated and launched in C: no Python between the front door and
``cuLaunchKernel``.

The parameter list is Triton's: the compiled kernel's signature with its compile-time
constants left out and its tuples flattened, then the scratch pointers Triton appends
(null where the kernel needs no scratch). It is checked against the parameter sizes
the driver reports for the function; anything that does not match, and any launch
Triton would start differently (clusters, cooperative or programmatic launches,
scratch memory, launch hooks), is not recorded and keeps the Python path.
It is on by default where it is available; ``RL_TRITON_CORE_C_LAUNCH=0`` (read when a
call is recorded) keeps every call on Triton's launcher.
"""

from __future__ import annotations

import math
import os
import struct

import torch

from rl_triton_core.scan import _cpu_c, _torchalloc

P_CONST, P_ALLOC, P_ARG, P_F32, P_HI, P_LO = range(6)
# a constant parameter's packing and the bytes the kernel reads, by Triton type
_PACK = {"i32": ("<i", 4), "u32": ("<I", 4), "i64": ("<q", 8), "u64": ("<Q", 8),
         "fp32": ("<f", 4), "fp64": ("<d", 8)}
_bound = None
recorded = False  # a record was made: out= calls and retrace_from_actions try the C replay


def available() -> bool:
    """Whether recorded CUDA launches can be repeated in C here (the extension is built,
    torch has DLPack's exchange table and the CUDA driver has the entry points)."""
    global _bound
    if _bound is None:
        _bound = bool(_cpu_c.replay is not None and torch.cuda.is_available()
                      and _cpu_c._cscan.gpu_bind(torch.empty_strided, torch.zeros))
    return _bound


DEFAULT = "1"  # RL_TRITON_CORE_C_LAUNCH where it is not set


def enabled() -> bool:
    """Whether a CUDA call is recorded for the C replay: switched on and available."""
    return os.environ.get("RL_TRITON_CORE_C_LAUNCH", DEFAULT) == "1" and available()


_armed = False


def key(runtime, prefix: bytes, args: tuple, time_dim, tune):
    """The C replay's key of a CUDA call about to be recorded (see ``_cpu_c.key``), or
    None. The first one tells the C side where Triton's launch hooks are read
    (``runtime``: ``triton.knobs.runtime``) and lets CUDA calls build keys from then on:
    before it, a CUDA call at the front door builds none (a CUDA key that no record could
    match would cost every call a lookup)."""
    global _armed
    if not _armed:
        _cpu_c._cscan.gpu_hooks(runtime)
        _armed = True
    return _cpu_c.key(prefix, args, time_dim, tune)


def _flatten(sig, value, path, out):
    """Triton's runtime parameters of one argument: tuples flattened, constants left out."""
    if isinstance(sig, tuple):
        if not isinstance(value, tuple) or len(value) != len(sig):
            raise _NotRecordable
        for k, (s, v) in enumerate(zip(sig, value)):
            _flatten(s, v, path + (k,), out)
    elif sig != "constexpr":
        out.append((path, sig, value))


class _NotRecordable(Exception):
    pass


def _launch_of(kernel, grid, full, source):
    """One kernel's record: (function, grid, threads, shared bytes, params)."""
    md = kernel.metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0)
            or getattr(md, "profile_scratch_size", 0) or getattr(md, "tensordesc_meta", None)
            or kernel.function is None):
        raise _NotRecordable
    sig = kernel.src.signature
    names = kernel.src.fn.arg_names
    if len(full) != len(names):
        raise _NotRecordable
    flat = []
    for pos, name in enumerate(names):
        _flatten(sig[name], full[pos], (pos,), flat)
    sizes = _cpu_c._cscan.param_sizes(kernel.function)
    if sizes is None or not len(flat) <= len(sizes) <= len(flat) + 2:
        raise _NotRecordable
    params = []
    for (path, ty, value), size in zip(flat, sizes):
        src = source(path)
        if ty.startswith("*"):
            if src is None or size != 8:  # a pointer that is not the call's own
                raise _NotRecordable
            params.append((*src, 8, 0))
        elif src is not None:  # one of the user's numbers
            if ty != "fp32" or size != 4:
                raise _NotRecordable
            params.append((*src, 4, 0))
        else:
            fmt, nbytes = _PACK.get(ty, (None, 0))
            if fmt is None or nbytes != size:
                raise _NotRecordable
            params.append((P_CONST, 0, size,
                           int.from_bytes(struct.pack(fmt, value).ljust(8, b"\0"), "little")))
    for size in sizes[len(flat):]:  # Triton's scratch pointers, null without scratch
        if size != 8:
            raise _NotRecordable
        params.append((P_CONST, 0, 8, 0))
    return (kernel.function, (int(grid[0]), int(grid[1]) if len(grid) > 1 else 1,
                              int(grid[2]) if len(grid) > 2 else 1),
            32 * md.num_warps, md.shared, tuple(params))


def record(ckey, launches, allocs, returns, checks, extents, device, tune, source):
    """The C record of a CUDA call, to keep under ``ckey`` (the C replay's key, from
    :func:`key`) in the plan dictionary; None where it cannot be recorded. ``launches``
    [(compiled kernel, grid, its positional arguments)], ``allocs`` [(tensor, zeroed)]
    the tensors the call allocates (their shapes, strides and dtypes; zeroed:
    torch.zeros), ``returns`` the results ((P_ALLOC, allocation) or (P_ARG, argument) for
    an out= tensor), per argument of the call ``checks`` (None or a number's (lo, hi))
    and ``extents`` (bytes from a tensor's address, which an out= tensor must not share;
    0 for none), ``source(path)`` a parameter's source ((kind, index) or None for a
    constant; ``path``: (argument position,) or (position, tuple index), positions in
    the call's one argument list, where a launch's own arguments start at its ``lo``:
    ``launches`` [(compiled kernel, grid, its positional arguments, lo)]); ``allocs``
    [(shape, stride, dtype, zeroed)]."""
    if ckey is None or not enabled() or len(allocs) > 4:
        return None
    try:
        recs = tuple(_launch_of(k, g, full, lambda path, lo=lo: source((path[0] + lo,) + path[1:]))
                     for k, g, full, lo in launches)
    except (_NotRecordable, AttributeError, KeyError, TypeError, struct.error, OverflowError):
        return None
    blob = _cpu_c._cscan.grecord(len(checks), len(allocs), tuple(checks), recs,
                                 tuple(returns), tuple(extents))
    if blob is None:
        return None
    global recorded
    if not recorded:  # the C++ allocator: loaded from the cache, or built in the background
        _torchalloc.ensure()
    recorded = True
    if device.type == "cuda":
        _torchalloc.cuda_views()  # (once: where the extension is loaded)
    kept = {idx for kind, idx in returns if kind == P_ALLOC}
    specs = tuple((tuple(shape), tuple(stride), dtype, bool(zero),
                   _torchalloc.SCALAR.get(dtype, -1),
                   0 if j in kept or zero else _scratch_bytes(shape, stride, dtype))
                  for j, (shape, stride, dtype, zero) in enumerate(allocs))
    return blob, specs, tune, len(returns), device


def _scratch_bytes(shape, stride, dtype) -> int:
    """The bytes of a workspace the replay takes as a block without a tensor (0: as a
    tensor: empty, or a dtype the extension does not number)."""
    if dtype not in _torchalloc.SCALAR or any(n <= 0 for n in shape) or any(s < 0 for s in stride):
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(shape, stride))) * dtype.itemsize


_KIND = {"alloc": P_ALLOC, "arg": P_ARG, "f32": P_F32, "hi": P_HI, "lo": P_LO}


def of_recorded(ckey, rec, args, nargs: int, tune, sources=None):
    """The C record of ``rec`` (a :class:`_record.Recorded` whose run is a
    ``_tl.Replay`` or a ``_tl.Chain`` of them), just made from a launch with positional
    arguments ``args`` (its allocations are the tensors it placed there), for a call of
    ``nargs`` arguments; None where it cannot be recorded. ``sources``: where the C
    call's arguments go, where they differ from the Python record's
    (``rec.sources()``)."""
    sources = {path: (_KIND[kind], idx)
               for path, (kind, idx) in (sources or rec.sources()).items()}
    example = {}
    for pos, k in rec.placed:
        example.setdefault(k, args[pos])
    allocs = []  # (shape, stride, dtype, zeroed), as the record makes each
    for k, a in enumerate(rec.allocs):
        if a.like is None:  # of a fixed shape: contiguous (its strides from a meta tensor)
            allocs.append((a.shape, torch.empty(a.shape, device="meta").stride(), a.dtype,
                           a.zero))
        else:  # torch.empty_like of the user's argument: the strides the first call got
            t = example[k]
            allocs.append((t.shape, t.stride(), t.dtype, a.zero))
    returns = [(P_ALLOC if made else P_ARG, idx) for made, idx in rec.returns]
    checks, extents = [None] * nargs, [0] * nargs
    for idx, lo, hi in rec.checks:
        checks[idx] = (float(lo), float(hi))
    for kind, idx in sources.values():  # a number without a range of its own: any finite
        if kind >= P_F32 and checks[idx] is None:
            checks[idx] = (-math.inf, math.inf)
    for idx, ext in rec.in_extents + rec.out_extents:
        extents[idx] = ext
    # one run's kernels on the whole argument list, or a chain of runs on its slices
    run = rec.run
    parts = run.parts if hasattr(run, "parts") else ((run, 0, len(args)),)
    launches = [(k, grid, (*args[lo:hi], *consts), lo)
                for part, lo, hi in parts for k, grid, consts in part.kernels]
    return record(ckey, launches, allocs, returns, checks, extents, parts[0][0].device, tune,
                  sources.get)
