"""Runs one scan on the chosen backend: the Triton kernel or the numba CPU path.

Inputs arrive validated: tensors that broadcast to ``layout.shape`` (``boot`` and
``init`` to the shape without the time axis), gamma/lambda as (float, tensor).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

from rl_triton_core._layout import Layout

_BACKENDS = ("auto", "triton", "cpu")


def backend_for(device: torch.device) -> str:
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


def run(mode, layout: Layout, out_dtype, device, *, x, v=None, nv=None, term=None, trunc=None,
        boot=None, g=(1.0, None), l=(1.0, None), init=None, rho=None, rb=(1.0, None),
        cb=(1.0, None), pb=(1.0, None), reverse=True, two_out=False, fast=None, out=None):
    """Allocate the outputs and run the scan; returns ``out0`` or ``(out0, out1)``.

    ``out_dtype``: the data's dtype (the outputs' unless ``out`` is given; float64
    data makes the kernel compute in float64). ``out``: validated ``(out0, out1 or
    None)`` of _validate.outputs to write into. The scan writes into them directly
    where the layout addresses them as [N1, N2, T] (two outputs: with the same
    strides); otherwise into fresh tensors that are then copied into them.
    ``fast``: ``(key, slots)`` of _fastpath: record this call's launch for reuse.
    """
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
        out0 = None
        if x.shape == layout.shape:
            out0 = torch.empty_like(x, dtype=out_dtype, device=device)
            like_idx = 0
            if not layout.mergeable(out0):
                out0, like_idx = None, None
        if out0 is None:
            out0 = torch.empty(layout.shape, dtype=out_dtype, device=device)
        out1 = torch.empty_like(out0) if two_out else None
    if layout.T == 0 or layout.N == 0:
        if out is not None:
            out0, out1 = ret
        return (out0, out1) if two_out else out0
    inputs = dict(x=x, v=v, nv=nv, term=term, trunc=trunc, boot=boot, init=init, rho=rho,
                  g=g, l=l, rb=rb, cb=cb, pb=pb)
    if backend_for(device) == "triton":
        if device.type == "cuda" and device.index != torch.cuda.current_device():
            # Triton launches on the current device: make it the inputs' one
            with torch.cuda.device(device):
                _run_triton(mode, layout, out0, out1, inputs, reverse, two_out, fast, like_idx,
                            out_dtype, out is not None)
        else:
            _run_triton(mode, layout, out0, out1, inputs, reverse, two_out, fast, like_idx,
                        out_dtype, out is not None)
    else:
        _run_cpu(mode, layout, out0, out1, x, v, nv, term, trunc, boot, g, l, init,
                 rho, rb, cb, pb, reverse, two_out)
    if user is not None:
        user[0].copy_(out0)
        if two_out:
            user[1].copy_(out1)
    if out is not None:
        out0, out1 = ret
    return (out0, out1) if two_out else out0


def _run_triton(mode, layout, out0, out1, inputs, reverse, two_out, fast, like_idx, out_dtype,
                user_out):
    from rl_triton_core import _fastpath, _triton_scan

    slots = {}
    used = {}  # for the fast path: what each pointer / scalar argument came from
    pos = _triton_scan.ARG_START
    for name, count in _triton_scan.ARG_ORDER:
        item = inputs[name]
        if name in ("g", "l", "rb", "cb", "pb"):
            value, tensor = item
            view = (None, 0, 0, 0) if tensor is None else layout.view3(tensor)
            slots[name] = (*view, *_fastpath.split(1.0 if value is None else value))
            if tensor is not None:
                used[name] = ("tensor", pos, view[0])
            else:
                used[name] = ("number", pos + 4, None)
        elif item is None:
            slots[name] = (None,) + (0,) * (count - 1)
        else:
            view = layout.view3(item) if count == 4 else layout.view3_notime(item)
            slots[name] = view
            used[name] = ("tensor", pos, view[0])
        pos += count
    o = layout.view3(out0)
    args, ws_spec, launched = _triton_scan.launch(
        o[0], out1, o[1:], slots, mode, reverse, layout.N, layout.N2, layout.T, two_out,
        out_dtype == torch.float64, _time_contiguous(slots["x"][3], o[3]))
    if fast is not None and (out0.device.type == "cuda" or _fastpath.CPU_PLANS):
        key, user_slots = fast
        _fastpath.record(key, user_slots, used, args, ws_spec, launched, out0, out1,
                         like_idx, out_dtype, layout.shape, user_out)


def _time_contiguous(x_time_stride, out_time_stride) -> bool:
    """Whether the tile should run along time (batch-major) or along streams: the data's
    layout, or the output's where the data is broadcast along time (an upstream
    gradient expanded from a sum, in the backward passes)."""
    return (x_time_stride if x_time_stride != 0 else out_time_stride) == 1


_F64 = np.zeros(1)
_U8 = np.zeros(1, dtype=np.uint8)


@functools.lru_cache(maxsize=256)
def _dummy(flag: bool, shape):
    """A 0-stride stand-in for an absent input (never read: its switch is off)."""
    return np.lib.stride_tricks.as_strided(_U8 if flag else _F64, shape, (0,) * len(shape))


def _s(value):
    return 1.0 if value is None else value


def _run_cpu(mode, layout, out0, out1, x, v, nv, term, trunc, boot, g, l, init, rho, rb, cb, pb,
             reverse, two_out):
    from rl_triton_core import _cpu_scan

    N1, N2, T = layout.N1, layout.N2, layout.T
    on_cpu = out0.device.type == "cpu"

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
    (gs, gt), (ls, lt), (rbs, rbt), (cbs, cbt), (pbs, pbt) = g, l, rb, cb, pb
    fn = _cpu_scan.kernel(mode, reverse, two_out, v is not None, nv is not None,
                          trunc is not None, boot is not None, init is not None,
                          gt is not None, lt is not None, rbt is not None, cbt is not None,
                          pbt is not None)
    args = (o0, o1, a3(x), a3(v), a3(nv), a3(term, True), a3(trunc, True), a2(boot), a3(gt),
            a3(lt), _s(gs), _s(ls), a2(init), a3(rho), a3(rbt), a3(cbt), a3(pbt), _s(rbs),
            _s(cbs), _s(pbs))
    _cpu_scan.run(fn, args, layout.N, T)
    if not direct:
        out0.copy_(res0)
        if two_out:
            out1.copy_(res1)
