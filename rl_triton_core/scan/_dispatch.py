"""Runs one scan on the chosen backend: the Triton launcher or the numba CPU path.

Inputs arrive validated: tensors by kernel slot that broadcast to ``layout.shape``
(``boot`` and ``init`` to the shape without the time axis), coefficients by slot as
(number or None, tensor or None). Triton and numba are imported on first use, so the
CPU path runs where Triton is not installed.
"""

from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple

import numpy as np
import torch

from rl_triton_core import _config, _host
from rl_triton_core._layout import Layout, _np_view
from rl_triton_core._record import Alloc, Recorded
from rl_triton_core._table import COEF_RANGE
from rl_triton_core._validate import extent
from rl_triton_core.scan import _claunch, _cpu_c, _torchalloc

_BACKENDS = ("auto", "triton", "cpu")
_PLANS: dict = {}  # cache key -> _record.Recorded (or a C record, under a bytes key)
_MAX_PLANS = 512
_replay_ok = True  # False once a plan found this Triton's launcher incompatible


def backend_for(device: torch.device) -> str:
    """The backend a call on ``device`` takes: ``triton`` or ``cpu``
    (``RL_TRITON_CORE_BACKEND``, read at call time)."""
    choice = os.environ.get("RL_TRITON_CORE_BACKEND", "auto")
    if choice not in _BACKENDS:
        raise ValueError(
            f"RL_TRITON_CORE_BACKEND must be one of {_BACKENDS}, got {choice!r}"
        )
    if choice == "auto":
        return "triton" if device.type == "cuda" else "cpu"
    if choice == "triton" and device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "RL_TRITON_CORE_BACKEND=triton with CPU tensors needs TRITON_INTERPRET=1 "
            "(set before importing rl_triton_core), or CUDA tensors"
        )
    return choice


def key_of(prefix, raw, tune):
    """The cache key of a call (``raw``: its arguments as the user passed them, out=
    slots last), or None where only the full path applies."""
    try:
        return _key_of(prefix, raw, tune)
    except RuntimeError:  # a tensor without strides (sparse, nested): the full path says why
        return None


_NUMBER = "#"  # a number's mark in a key: equal to no bool (0 == False, 1 == True)


def _key_of(prefix, raw, tune):
    # flat: a tensor adds seven entries, led by its shape (a tuple); anything else one.
    # The negative bit: such a view's memory is not its values (the full path resolves
    # it into a copy, which is never recorded), so it must not find a plain call's plan
    key = [prefix, tune]
    add = key.append
    for s in raw:
        kind = type(s)
        if kind is torch.Tensor:
            add(s.shape)
            add(s.stride())
            add(s.dtype)
            add(s.device)
            add(s.data_ptr() & 15)
            add(s.requires_grad)
            add(s.is_neg())
        elif s is None:
            add(None)
        elif kind is float or kind is int:
            add(_NUMBER)
        elif kind is bool:
            add(s)
        else:
            return None
    return tuple(key)


def cached(prefix, raw):
    """The cached launch of a call with these user arguments (``raw``, out= slots last):
    ``(key, result)``; result None where there is no plan yet (then pass the key to
    :func:`run` to record one) or only the full path applies."""
    global _replay_ok
    tune = _config._current
    if not tune.cached_launch or not _replay_ok:
        return None, None
    key = key_of(prefix, raw, tune)
    if key is None:
        return None, None
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable argument (e.g. a list time_dim): the full path says why
        return None, None
    if plan is None:
        return key, None
    res = plan(raw)
    if res is None and plan.broken:
        _replay_ok = False
        _PLANS.clear()
        return None, None
    return key, res


def run(mode, layout: Layout, out_dtype, device, ins: dict, coefs: dict, *, reverse: bool,
        n_out: int = 1, out=None, fast=None):
    """Allocate the outputs and run the scan; returns ``out0`` or ``(out0, out1)``.

    ``ins``: kernel slot -> tensor or None; ``coefs``: slot -> (number, tensor).
    ``out_dtype``: the data's dtype (the outputs' unless ``out`` is given; float64
    data makes the scan compute in float64). ``out``: validated ``(out0, out1 or
    None)`` to write into. The scan writes into them directly where the layout
    addresses them as [N1, N2, T] (two outputs: with the same strides); otherwise into
    fresh tensors that are then copied into them.
    ``fast``: ``(key, raw, index)``: record this call's launch for reuse under ``key``
    (``raw``: the user's arguments, out= slots last; ``index``: slot -> position in raw).
    """
    two_out = n_out == 2
    like_idx = None
    user = None
    if out is not None:
        ret = out
        # written without autograd (out= with grad raised before); .numpy() needs this
        out0, out1 = (o.detach() if o is not None and o.requires_grad else o for o in out)
        if not (layout.mergeable(out0) and (out1 is None or (
                layout.mergeable(out1) and layout.view3(out0)[1:] == layout.view3(out1)[1:]))):
            user = (out0, out1)
            out0 = torch.empty(layout.shape, dtype=out0.dtype, device=device)
            out1 = torch.empty(layout.shape, dtype=out1.dtype, device=device) if two_out \
                else None
            fast = None  # the plan would write into the wrong tensors: full path each time
    else:
        x = ins["x"]
        out0 = None
        if device.type == "cpu" and (x.shape != layout.shape or x.is_contiguous()):
            # contiguous, as empty_like(x) would be; large ones from the block cache
            out0 = _host.empty(layout.shape, out_dtype)
        elif x.shape == layout.shape:
            out0 = torch.empty_like(x, dtype=out_dtype, device=device)
            like_idx = "x"
            if not layout.mergeable(out0):
                out0, like_idx = None, None
        if out0 is None:
            out0 = torch.empty(layout.shape, dtype=out_dtype, device=device)
        if not two_out:
            out1 = None
        elif device.type == "cpu" and out0.is_contiguous():
            out1 = _host.empty(layout.shape, out_dtype)
        else:
            out1 = torch.empty_like(out0)
    if layout.T == 0 or layout.N == 0:
        if out is not None:
            out0, out1 = ret
        return (out0, out1) if two_out else out0
    tune = _config.current_tuning()
    if backend_for(device) == "triton":
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            # Triton launches on the current device: make it the inputs' one
            with torch.cuda.device(device):
                _run_triton(mode, layout, out0, out1, ins, coefs, reverse, fast, like_idx,
                            out_dtype, out is not None, tune)
        else:
            _run_triton(mode, layout, out0, out1, ins, coefs, reverse, fast, like_idx,
                        out_dtype, out is not None, tune)
    else:
        _run_cpu(mode, layout, out0, out1, ins, coefs, reverse, tune, fast, like_idx,
                 out is not None)
    if user is not None:
        user[0].copy_(out0)
        if two_out:
            user[1].copy_(out1)
    if out is not None:
        out0, out1 = ret
    return (out0, out1) if two_out else out0


def _run_triton(mode, layout, out0, out1, ins, coefs, reverse, fast, like_idx, out_dtype,
                user_out, tune):
    from rl_triton_core.scan import _launch

    call = _launch.launch(mode, layout, out0, out1, ins, coefs, reverse,
                          out_dtype == torch.float64, tune)
    if fast is not None and fast[0] is not None and (out0.device.type == "cuda"
                                                     or tune.cpu_plans):
        key, raw, index = fast
        like = None if like_idx is None else index.get(like_idx)
        if like_idx is not None and like is None:
            return
        plan = _launch.record(raw, index, call, like, user_out, len(raw) - 2)
        _store(key, plan)
        if plan is not None and out0.device.type == "cuda" and _claunch.enabled():
            # the same launch for the C replay, under its key (no Python on a repeat):
            # the user's arguments, with the out= slots where there are out= tensors
            named = _front_door(key)
            if named is not None:
                cargs = raw if user_out else raw[:-2]
                ckey = _claunch.key(_launch.knobs.runtime, c_prefix(named[0]), cargs,
                                    named[1], key[1])
                _store(ckey, _claunch.of_recorded(ckey, plan, call[0], len(cargs), key[1]))


_F64 = np.zeros(1)
_U8 = np.zeros(1, dtype=np.uint8)


@functools.lru_cache(maxsize=256)
def _dummy(flag: bool, shape):
    """A 0-stride stand-in for an absent input (never read: its switch is off)."""
    return np.lib.stride_tricks.as_strided(_U8 if flag else _F64, shape, (0,) * len(shape))


def _s(value):
    return 1.0 if value is None else value


def _run_cpu(mode, layout, out0, out1, ins, coefs, reverse, tune, fast=None, like_idx=None,
             user_out=False):
    """The numba scan (or, for a variant's first call, its numpy stand-in) into ``out0``
    and ``out1``; with ``fast`` (see :func:`run`), records the call (:func:`record_cpu`)
    (``user_out``: ``out0`` and ``out1`` are the user's out= tensors: only the C replay
    records it, writing into the next call's out= tensors)."""
    from rl_triton_core.scan import _cpu_first

    N1, N2, T = layout.N1, layout.N2, layout.T
    on_cpu = out0.device.type == "cpu"
    two_out = out1 is not None

    def host(t):
        t = t.detach()
        if not on_cpu:
            t = t.cpu()
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        elif t.dtype == torch.bool:
            t = t.view(torch.uint8)
        return t

    def a3(t, flag=False):
        # flags go as they are (bool as uint8): the loop reads nonzero as set. A host-side
        # ``t != 0`` here was a torch op on OpenMP threads: 80 us for 100,000 floats alone,
        # 4-50 ms with the 2-core machine busy
        if t is None:
            return _dummy(flag, (N1, N2, T))
        return layout.as_numpy3(host(t))

    def a2(t):
        if t is None:
            return _dummy(False, (N1, N2))
        return layout.as_numpy2(host(t))

    direct = on_cpu and out0.dtype in (torch.float32, torch.float64) and (
        out1 is None or out1.dtype in (torch.float32, torch.float64))
    res0 = out0 if direct else torch.empty(layout.shape, dtype=torch.float64)
    res1 = (out1 if direct else torch.empty_like(res0)) if two_out else None
    o0 = layout.as_numpy3(res0)
    o1 = layout.as_numpy3(res1) if two_out else o0
    none = (None, None)
    (gs, gt), (ls, lt), (rbs, rbt), (cbs, cbt), (pbs, pbt) = (
        coefs.get(s, none) for s in ("g", "lm", "rb", "cb", "pb"))
    get = ins.get
    key = (mode, reverse, two_out, get("v") is not None, get("nv") is not None,
           get("trunc") is not None, get("boot") is not None, get("init") is not None,
           gt is not None, lt is not None, rbt is not None, cbt is not None, pbt is not None)
    args = CpuArgs(out0=o0, out1=o1, x=a3(ins["x"]), v=a3(get("v")), nv=a3(get("nv")),
                   term=a3(get("term"), True), trunc=a3(get("trunc"), True),
                   boot=a2(get("boot")), g=a3(gt), lm=a3(lt), gs=_s(gs), lms=_s(ls),
                   init=a2(get("init")), rho=a3(get("rho")), rb=a3(rbt), cb=a3(cbt),
                   pb=a3(pbt), rbs=_s(rbs), cbs=_s(cbs), pbs=_s(pbs))
    if _cpu_c.handles(key) and _cpu_c.run(key, args, tune.cpu_threads):
        # the C kernel (built at install time): no JIT, no background loading
        if fast is not None and fast[0] is not None and direct:
            plan = record_cpu(fast, None, key, args, ins, coefs, out0, out1, like_idx,
                              layout, tune.cpu_threads, user_out)
            if not user_out:  # (an out= call's plan is its C recording alone)
                _store(fast[0], plan)
    elif (_cpu_first.handles(key) and not _cpu_first.ready(key) and _cpu_first.enabled()
            and _cpu_first.gae(key, *args[:12])):
        # numba not loaded yet for this variant: numpy computed it (bit for bit the same);
        # the kernel loads in a background thread for the next calls
        _cpu_first.warm(key, args)
    else:
        from rl_triton_core.scan import _cpu

        _host.settle()
        fn = _cpu.kernel(*key)
        _cpu.run(fn, args, layout.N, T, tune.cpu_threads)
        _cpu_first._READY.add(key)
        if fast is not None and fast[0] is not None and direct and not user_out:
            _store(fast[0], record_cpu(fast, fn, key, args, ins, coefs, out0, out1,
                                       like_idx, layout, tune.cpu_threads))
    if not direct:
        out0.copy_(res0)
        if two_out:
            out1.copy_(res1)


def _store(key, plan):
    """Keep ``plan`` (if any) for the calls with this key (at most _MAX_PLANS)."""
    if plan is None:
        return
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    try:
        _PLANS[key] = plan
    except TypeError:
        pass


class CpuArgs(NamedTuple):
    """The CPU scan's arguments, named as the numba kernel's parameters
    (``_cpu.kernel``'s ``scan``; the C kernel takes the first twelve): the outputs, an
    array per input slot (a 0-stride stand-in where absent), and per coefficient slot
    ``s`` its per-step array ``s`` and its number ``s + "s"``."""

    out0: object
    out1: object
    x: object
    v: object
    nv: object
    term: object
    trunc: object
    boot: object
    g: object
    lm: object
    gs: float
    lms: float
    init: object
    rho: object
    rb: object
    cb: object
    pb: object
    rbs: float
    cbs: float
    pbs: float


_POS = {name: i for i, name in enumerate(CpuArgs._fields)}
_C_ARRAYS = CpuArgs._fields[:10]  # the C kernel's arrays, in its order (_cscan.run)
_C_NUMBERS = (_POS["gs"], _POS["lms"])  # ... and its two numbers
_CPU = torch.device("cpu")
# a CPU out= call was recorded for the C replay (the front door looks out= calls up then)
out_recorded = False


def _np_of(t, detach, as_u8, shape, strides):
    """A numpy view of CPU tensor ``t``'s memory with these shape and byte strides."""
    if detach:
        t = t.detach()
    if as_u8:
        t = t.view(torch.uint8)
    return _np_view(t.numpy(), shape, strides)


def _front_door(key):
    """(estimator name, time_dim) of a public call's plan key (``_call.forward``'s); None
    for the backward passes' keys (a mode first), whose calls the C replay does not
    repeat."""
    k = key[0]  # (name, type(time_dim), time_dim); a backward pass's starts with its mode
    return (k[0], k[2]) if type(k) is tuple and len(k) == 3 and type(k[1]) is type else None


def c_prefix(name: str) -> bytes:
    """An estimator's prefix in the keys of the C replay (``_cpu_c.replay``)."""
    return name.encode() + b"/"


def _record_c(fast, rec, run, out0, out1, user_out=False):
    """Store the C replay's recording of the CPU record ``rec`` beside it, under the C
    key of the call, where the C replay can repeat it: no input that requires grad; the
    outputs contiguous (it allocates them with torch.empty), or, for an out= call
    (``user_out``), the user's out= tensors, whose overlap with the other tensors the
    C replay checks on each call from the extents recorded here."""
    global out_recorded
    key, raw, _ = fast
    named = _front_door(key)
    if named is None:
        return
    (name, time_dim), tune = named, key[1]
    # the C replay gets the arguments, and the out= slots where there are out= tensors
    args = raw if user_out else raw[:-2]
    if any(raw[idx].requires_grad for _, idx in rec.tensors) or (not user_out and (
            not out0.is_contiguous() or (out1 is not None and not out1.is_contiguous()))):
        return
    ckey = _cpu_c.key(c_prefix(name), args, time_dim, tune)
    if ckey is None:
        return
    n = len(args)
    addr, num, lo, hi = [-1] * n, [-1] * n, [0.0] * n, [0.0] * n
    for pos, idx in rec.tensors:
        addr[idx] = pos
    for pos, idx in rec.numbers:
        num[idx] = _C_NUMBERS.index(pos)  # 0: gamma, 1: lambda
    for idx, lo_, hi_ in rec.checks:
        lo[idx], hi[idx] = float(lo_), float(hi_)
    extents = None
    if user_out:
        addr[n - 2] = 0  # the out= slots: the scan's outputs
        if out1 is not None:
            addr[n - 1] = 1
        extents = tuple(extent(t) if type(t) is torch.Tensor else 0 for t in args)
    crec = _cpu_c.recording(run.prepared, tuple(addr), tuple(num), tuple(lo), tuple(hi),
                            extents)
    if crec is not None:
        shape = None if user_out else tuple(out0.shape)  # None: write into the out= tensors
        alloc = torch.empty if user_out else _host.allocator(shape, out0.dtype)
        _store(ckey, (crec, shape, out0.dtype, tune, out1 is not None, alloc))
        out_recorded = out_recorded or user_out
        if _torchalloc.state == "not loaded":
            # the C replay reads tensors and makes outputs through torch's C++ API from
            # now on: loaded from the cache, or built in the background
            _torchalloc.ensure()


class CpuRun:
    """The run of a recorded CPU call (:class:`_record.Recorded`): the scan's C kernel
    (``prepared``: its call, recorded once, takes the arrays' addresses: the key fixes
    their shapes, strides and dtypes) or the numba kernel ``fn`` (numpy views of the
    tensors, rebuilt from the recorded shapes and strides, ``views``: (position,
    detach, as uint8, shape, byte strides)). False back where the full path must run:
    the backend or the CPU kernel was switched since the recording."""

    __slots__ = ("fn", "kernel_key", "prepared", "views", "N", "T", "threads")
    fatal = False

    def __call__(self, args) -> bool:
        if backend_for(_CPU) != "cpu":  # the backend was switched since the recording
            return False
        from rl_triton_core.scan import _cpu_first

        c_kernel = self.fn is None  # recorded on the C kernel
        if c_kernel != _cpu_c.handles(self.kernel_key):  # RL_TRITON_CORE_CPU_KERNEL changed
            return False
        if not c_kernel and not _cpu_first.ready(self.kernel_key):
            return False  # where the full path would take numpy
        if self.prepared is not None:
            addr = [0] * len(_C_ARRAYS)  # array positions: CpuArgs' first ten
            for pos, *_ in self.views:
                addr[pos] = p = args[pos].data_ptr()
                if not p and args[pos].numel():  # no memory of its own (functionalized)
                    return False
            _cpu_c.run_prepared(self.prepared, args[_C_NUMBERS[0]], args[_C_NUMBERS[1]], addr)
            return True
        for pos, detach, as_u8, shape, strides in self.views:
            args[pos] = _np_of(args[pos], detach, as_u8, shape, strides)
        args = CpuArgs._make(args)
        if c_kernel:
            return _cpu_c.run(self.kernel_key, args, self.threads)
        from rl_triton_core.scan import _cpu  # loaded: the full path ran

        _host.settle()
        _cpu.run(self.fn, args, self.N, self.T, self.threads)
        return True


def record_cpu(fast, fn, kernel_key, args, ins, coefs, out0, out1, like_idx, layout,
               threads, user_out=False):
    """The record (:class:`_record.Recorded`, run by a :class:`CpuRun`) of a call that
    just ran the CPU scan (``fn``: the numba kernel; None: the C kernel) with these
    :class:`CpuArgs` on the user's CPU tensors. None where a tensor was converted or
    copied, a coefficient is a tensor (whose range the full path checks by value), or
    an output is neither a fresh tensor nor, with ``user_out``, the user's out= tensor
    written in place (which only the C replay repeats)."""
    _, raw, index = fast
    if out0.device.type != "cpu":
        return None
    tensors, numbers, checks, views = [], [], [], []
    for slot, t in ins.items():
        if t is None:  # absent: the template's stand-in
            continue
        idx = index.get(slot)
        pos = _POS.get(slot)  # the slot's array, by its name
        if pos is None:
            return None
        a = args[pos]
        if idx is None or raw[idx] is not t or t.dtype in (torch.float16, torch.bfloat16):
            return None
        if a.__array_interface__["data"][0] != t.data_ptr():  # a copy (unmergeable)
            return None
        tensors.append((pos, idx))
        views.append((pos, t.requires_grad, t.dtype == torch.bool, a.shape, a.strides))
    for slot, (_, tensor) in coefs.items():
        if tensor is not None:
            return None
        idx = index.get(slot)
        user = None if idx is None else raw[idx]
        if user is None:  # left out: the template's constant
            continue
        if type(user) is not float and type(user) is not int:
            return None
        numbers.append((_POS[slot + "s"], idx))  # the slot's number
        lo, hi = COEF_RANGE[slot]
        checks.append((idx, lo, math.inf if hi is None else hi))
    like = None if like_idx is None else index.get(like_idx)
    if like_idx is not None and like is None:
        return None
    o0 = args.out0
    if o0.__array_interface__["data"][0] != out0.data_ptr():
        return None
    out_pos, out1_pos = _POS["out0"], _POS["out1"]
    views += [(out_pos, False, False, o0.shape, o0.strides),
              (out1_pos, False, False, o0.shape, o0.strides)]
    run = CpuRun()
    run.fn, run.kernel_key, run.threads, run.N, run.T = fn, kernel_key, threads, layout.N, layout.T
    run.views = tuple(views)
    # the C kernel's call recorded once: a replay passes its tensors' addresses
    run.prepared = _cpu_c.prepare(kernel_key, args, threads) if fn is None else None
    # as the full path: a contiguous output from _host.empty, else like the user's tensor
    alloc = Alloc(like, layout.shape, out0.dtype, _CPU, pooled=out0.is_contiguous())
    two_out = out1 is not None
    rec = Recorded(run, args, tensors=tensors, numbers=numbers, checks=checks,
                   allocs=(alloc, alloc) if two_out else (alloc,),
                   placed=((out_pos, 0), (out1_pos, 1 if two_out else 0)),
                   returns=((True, 0), (True, 1)) if two_out else ((True, 0),))
    if run.prepared is not None:
        _record_c(fast, rec, run, out0, out1, user_out)
    return rec
