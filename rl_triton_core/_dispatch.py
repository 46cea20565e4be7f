"""Runs one scan on the chosen backend: the Triton kernel or the numba CPU path.

Inputs arrive validated: tensors that broadcast to ``layout.shape`` (``boot`` and
``init`` to the shape without the time axis), gamma/lambda as (float, tensor).
"""

from __future__ import annotations

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


def _split(value: float):
    hi = float(np.float32(value))
    return hi, float(np.float32(value - hi))


def run(mode, layout: Layout, out_dtype, device, *, x, v=None, nv=None, term=None, trunc=None,
        boot=None, g=(1.0, None), l=(1.0, None), init=None, rho=None, rb=(1.0, None),
        cb=(1.0, None), pb=(1.0, None), reverse=True, two_out=False, like=None):
    """Allocate the outputs and run the scan; returns ``out0`` or ``(out0, out1)``."""
    like = x if like is None else like
    out0 = None
    if like.shape == layout.shape:
        out0 = torch.empty_like(like, dtype=out_dtype, device=device)
        if not layout.mergeable(out0):
            out0 = None
    if out0 is None:
        out0 = torch.empty(layout.shape, dtype=out_dtype, device=device)
    out1 = torch.empty_like(out0) if two_out else None
    if layout.T == 0 or layout.N == 0:
        return (out0, out1) if two_out else out0
    if backend_for(device) == "triton":
        _run_triton(mode, layout, out0, out1, x, v, nv, term, trunc, boot, g, l, init,
                    rho, rb, cb, pb, reverse, two_out)
    else:
        _run_cpu(mode, layout, out0, out1, x, v, nv, term, trunc, boot, g, l, init,
                 rho, rb, cb, pb, reverse, two_out)
    return (out0, out1) if two_out else out0


def _run_triton(mode, layout, out0, out1, x, v, nv, term, trunc, boot, g, l, init, rho, rb, cb,
                pb, reverse, two_out):
    from rl_triton_core import _triton_scan

    def t3(t):
        return (None, 0, 0, 0) if t is None else layout.view3(t)

    def t2(t):
        return (None, 0, 0) if t is None else layout.view3_notime(t)

    def coef(c):
        value, tensor = c
        hi, lo = _split(1.0 if value is None else value)
        return (*t3(tensor), hi, lo)

    def thr(c):
        value, tensor = c
        return (*t3(tensor), 1.0 if value is None else value)

    o = layout.view3(out0)
    xs = t3(x)
    _triton_scan.launch(
        mode, reverse, o[0], out1, o[1:], xs, t3(v), t3(nv), t3(term), t3(trunc), t2(boot),
        coef(g), coef(l), t2(init), t3(rho), thr(rb), thr(cb), thr(pb),
        layout.N, layout.N2, layout.T, two_out, out0.dtype == torch.float64, xs[3] == 1,
    )


_F64 = np.zeros(1)
_U8 = np.zeros(1, dtype=np.uint8)


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

    def a3(t, dummy=_F64):
        if t is None:
            return np.lib.stride_tricks.as_strided(dummy, (N1, N2, T), (0, 0, 0))
        return layout.as_numpy3(host(t))

    def a2(t):
        if t is None:
            return np.lib.stride_tricks.as_strided(_F64, (N1, N2), (0, 0))
        return layout.as_numpy2(host(t))

    direct = on_cpu and out0.dtype in (torch.float32, torch.float64)
    res0 = out0 if direct else torch.empty(layout.shape, dtype=torch.float64)
    res1 = (out1 if direct else torch.empty_like(res0)) if two_out else None
    o0 = layout.as_numpy3(res0)
    o1 = layout.as_numpy3(res1) if two_out else o0
    (gs, gt), (ls, lt), (rbs, rbt), (cbs, cbt), (pbs, pbt) = g, l, rb, cb, pb
    fn = _cpu_scan.kernel(mode, reverse, two_out, v is not None, nv is not None,
                          trunc is not None, boot is not None, init is not None,
                          gt is not None, lt is not None, rbt is not None, cbt is not None,
                          pbt is not None)
    args = (o0, o1, a3(x), a3(v), a3(nv), a3(term, _U8), a3(trunc, _U8), a2(boot), a3(gt),
            a3(lt), _s(gs), _s(ls), a2(init), a3(rho), a3(rbt), a3(cbt), a3(pbt), _s(rbs),
            _s(cbs), _s(pbs))
    _cpu_scan.run(fn, args, layout.N, T)
    if not direct:
        out0.copy_(res0)
        if two_out:
            out1.copy_(res1)
