"""The cached launch: a repeated call with the same shapes, strides, dtypes and
device skips validation, layout work and Triton's argument binding.

The first call of a configuration goes through the full path (validation,
layouts, ``scan_kernel[grid](...)``) and records a :class:`Plan`: the kernel's
positional arguments with the tensor slots marked, the compiled kernels and
their constexprs. Later calls with the same key only check the scalar
coefficients, allocate the outputs (or take the caller's ``out=`` tensors, whose
shapes, strides, dtypes and alignments are part of the key, and check only that
their memory does not overlap the inputs') and hand the argument list to the
compiled kernels' launcher. Nothing here reads tensor data: no host synchronisation.
"""

from __future__ import annotations

import functools
import math
import os
import struct

import torch
from triton import knobs

from rl_triton_core._validate import extent

# the inputs of one call, in this order, as the user passed them, then the out= tensors
SLOTS = ("x", "v", "nv", "term", "trunc", "boot", "init", "rho", "g", "l", "rb", "cb", "pb",
         "out0", "out1")
_OUT0, _OUT1 = SLOTS.index("out0"), SLOTS.index("out1")
_NOT_A_SLOT = object()  # a malformed out= argument: no key, the full path says why
_COEF_RANGE = {"g": (0.0, 1.0), "l": (0.0, 1.0), "rb": (0.0, float("inf")),
               "cb": (0.0, float("inf")), "pb": (0.0, float("inf"))}
_PLANS: dict = {}
_F32_MAX = 3.4e38  # float32 max, with room so the rounded hi stays finite
_MAX_PLANS = 512
ENABLED = os.environ.get("RL_TRITON_CORE_FASTPATH", "1") == "1"
# Tests set this to record and replay plans for CPU tensors under the interpreter
# (with Plan._launch replaced), so the argument rebuilding is checked without a GPU.
CPU_PLANS = False
_launcher_ok = True


def key_of(prefix, slots):
    """The cache key of a call, or None where only the full path applies."""
    if not ENABLED or not _launcher_ok:
        return None
    key = [prefix, os.environ.get("RL_TRITON_CORE_BACKEND")]
    for s in slots:
        if s is None:
            key.append(None)
        elif type(s) is float or type(s) is int:
            key.append(0)
        elif type(s) is torch.Tensor and (s.is_cuda or CPU_PLANS):
            key.append((s.shape, s.stride(), s.dtype, s.device, s.data_ptr() % 16,
                        s.requires_grad))
        else:
            return None
    return tuple(key)


def out_slots(out, two_out):
    """The (out0, out1) slots of an ``out=`` argument as the user passed it."""
    if out is None:
        return None, None
    if not two_out:
        return out, None
    if type(out) in (tuple, list) and len(out) == 2:
        return out[0], out[1]
    return _NOT_A_SLOT, _NOT_A_SLOT


def lookup(key, slots):
    """Run the cached plan for ``key``; None if there is none or a check needs the full path."""
    if key is None:
        return None
    try:
        plan = _PLANS.get(key)
    except TypeError:  # an unhashable argument (e.g. a list time_dim): the full path says why
        return None
    if plan is None:
        return None
    return plan(slots)


@functools.lru_cache(maxsize=256)  # a training loop passes the same few coefficients
def split(value: float):
    """A float as two float32s (hi, lo) with hi + lo == value to ~48 bits: the kernel
    takes float32 scalars and rebuilds float64 ones from the pair (every scalar
    coefficient: gamma, lambda and the clip thresholds)."""
    if not abs(value) < _F32_MAX:  # inf (an unclipped threshold), beyond float32, NaN
        return (value if value != value else math.copysign(math.inf, value)), 0.0
    hi = struct.unpack("f", struct.pack("f", value))[0]
    return hi, struct.unpack("f", struct.pack("f", value - hi))[0]


class Plan:
    __slots__ = ("template", "tensor_pos", "number_pos", "checks", "like", "dtype", "shape",
                 "two_out", "out1_pos", "dummy_pos", "ws_pos", "ws_spec", "kernels", "device",
                 "user_out", "in_extents", "out_extents")

    def _overlap(self, slots):
        """Whether an out= tensor shares memory with an input or the other output: the
        pointers against byte extents fixed by the key (no sync, no data read)."""
        outs = []
        for idx, ext in self.out_extents:
            p = slots[idx].data_ptr()
            outs.append((p, p + ext))
        for idx, ext in self.in_extents:
            p = slots[idx].data_ptr()
            q = p + ext
            for lo, hi in outs:
                if p < hi and lo < q:
                    return True
        return len(outs) == 2 and outs[0][0] < outs[1][1] and outs[1][0] < outs[0][1]

    def __call__(self, slots):
        for idx, lo, hi in self.checks:
            value = slots[idx]
            if not lo <= value <= hi:  # also catches NaN: the full path raises the error
                return None
        device = self.device
        if self.user_out:
            if self._overlap(slots):  # the full path raises the error
                return None
            out0, out1 = slots[_OUT0], slots[_OUT1]
        else:
            if self.like is not None:
                out0 = torch.empty_like(slots[self.like], dtype=self.dtype)
            else:
                out0 = torch.empty(self.shape, dtype=self.dtype, device=device)
            out1 = torch.empty_like(out0) if self.two_out else None
        args = list(self.template)
        args[0] = out0
        args[1] = out1 if out1 is not None else out0
        for pos in self.dummy_pos:
            args[pos] = out0
        for pos, idx in self.tensor_pos:
            args[pos] = slots[idx]
        for pos, idx in self.number_pos:
            args[pos], args[pos + 1] = split(float(slots[idx]))
        if self.ws_spec is not None:
            alloc = torch.zeros if self.ws_spec[2] else torch.empty
            args[self.ws_pos] = alloc(self.ws_spec[0], dtype=self.ws_spec[1], device=device)
        self._launch(args, device)
        return (out0, out1) if self.two_out else out0

    def _launch(self, args, device):
        if device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                self._run(args, device)
        else:
            self._run(args, device)

    def _run(self, args, device):
        global _launcher_ok
        stream = torch.cuda.current_stream(device).cuda_stream
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        try:
            for kernel, grid, consts in self.kernels:
                full = (*args, *consts)
                meta = kernel.launch_metadata(grid, stream, *full)
                kernel.run(grid[0], grid[1], 1, stream, kernel.function, kernel.packed_metadata,
                           meta, enter, leave, *full)
        except TypeError:  # a Triton whose launcher takes other arguments: stop using it
            _launcher_ok = False
            _PLANS.clear()
            raise


def record(key, slots, used, args, ws_spec, launched, out0, out1, like_idx, dtype, shape,
           user_out=False):
    """Store the plan of a call that just ran through the full path.

    ``used``: per slot name, the (tensor the kernel received, position of its
    pointer in ``args``) -- a pointer that is not the user's tensor (a copy)
    makes the call uncacheable. Scalars: their position (the float32 pair's first).
    ``user_out``: ``out0``/``out1`` are the caller's out= tensors (slots out0/out1),
    which a replay writes into again.
    """
    if key is None or launched is None:
        return
    if user_out:
        for idx, t in ((_OUT0, out0), (_OUT1, out1)):
            user = slots[idx]
            if (t is None) != (user is None) or (t is not None and (
                    type(user) is not torch.Tensor or t.data_ptr() != user.data_ptr())):
                return
    from rl_triton_core._triton_scan import scan_kernel

    plan = Plan()
    plan.tensor_pos, plan.number_pos, plan.checks, plan.dummy_pos = [], [], [], []
    for name, entry in used.items():
        idx = SLOTS.index(name)
        user = slots[idx]
        kind, pos, given = entry
        if kind == "tensor":
            if not isinstance(user, torch.Tensor) or given.data_ptr() != user.data_ptr():
                return
            plan.tensor_pos.append((pos, idx))
        elif kind == "number":
            if user is None:  # an option this estimator does not take: the template's constant
                continue
            if isinstance(user, torch.Tensor):
                return
            plan.number_pos.append((pos, idx))
            plan.checks.append((idx, *_COEF_RANGE[name]))
    template = list(args)
    for pos, a in enumerate(template):
        if isinstance(a, torch.Tensor):
            template[pos] = None
            if pos > 1 and all(p != pos for p, _ in plan.tensor_pos):
                plan.dummy_pos.append(pos)
    plan.ws_spec = ws_spec
    plan.ws_pos = len(args) - 7  # WS, N, N2, T, SEG_LEN, S, UNIT
    if ws_spec is not None and plan.ws_pos in plan.dummy_pos:
        plan.dummy_pos.remove(plan.ws_pos)
    plan.template = template
    names = scan_kernel.arg_names[len(args):]
    plan.kernels = [(k, grid, [consts[n] for n in names]) for k, grid, consts in launched]
    plan.like = like_idx
    plan.dtype = dtype
    plan.shape = shape
    plan.two_out = out1 is not None
    plan.device = out0.device
    plan.user_out = user_out
    plan.out_extents, plan.in_extents = [], []
    if user_out:
        for idx, t in enumerate(slots):
            if type(t) is torch.Tensor and t.numel():
                (plan.out_extents if idx >= _OUT0 else plan.in_extents).append((idx, extent(t)))
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    try:
        _PLANS[key] = plan
    except TypeError:
        pass
