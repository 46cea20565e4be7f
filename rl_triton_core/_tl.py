"""Triton helpers the scan's and the token estimators' kernels share.

Device side: a load in the compute dtype, a flag read as a bool whatever its dtype, and
a Python number passed as float32 hi and lo halves (``_host.split``) read back in the
compute dtype. Host side: the run of a recorded launch (:class:`Replay`, for
``_record.Recorded``): compiled kernels repeated through their own launcher.

Imported by the Triton launchers only (``scan._launch``, ``scan._actions``, ``tokens``
where it records a call, ``token._token_kernel``): the CPU path never imports Triton.
"""

import torch
import triton
import triton.language as tl
from triton import knobs


@triton.jit
def load(P, off, m, FP64: tl.constexpr):
    """``P[off]`` where ``m`` (0 elsewhere) in the compute dtype: float64 for float64
    data, float32 otherwise."""
    x = tl.load(P + off, mask=m, other=0)
    if FP64:
        return x.to(tl.float64)
    else:
        return x.to(tl.float32)


@triton.jit
def flag(P, off, m):
    """A flag as a bool, False where ``m`` is: nonzero means set, as ``flag.bool()``
    reads it (2.0, -1 and NaN are set, -0.0 is not), whatever its dtype."""
    ety: tl.constexpr = P.dtype.element_ty
    if ety.is_floating():
        # a float flag read in 16-bit pieces: set where any piece is nonzero, the sign bit
        # aside (-0.0 is clear; NaN and inf are set). Loaded as floats (or as integers of
        # their width), the flags made the scan's layout pass run the forward scans in the
        # flag load's layout instead of the data's: another scan tree, 1 ulp off the
        # result of the same flags as bool. (Byte offsets in int64: an element offset that
        # fits int32 may not, times the pieces.)
        nh: tl.constexpr = ety.primitive_bitwidth // 16
        q = P.to(tl.pointer_type(tl.int16)) + off.to(tl.int64) * nh
        acc = tl.load(q + (nh - 1), mask=m, other=0) & 0x7FFF  # the sign's piece (LE)
        for j in tl.static_range(nh - 1):
            acc = acc | tl.load(q + j, mask=m, other=0)
        return acc != 0
    else:
        return tl.load(P + off, mask=m, other=0) != 0


@triton.jit
def number(hi, lo, FP64: tl.constexpr):
    """A Python float passed as float32 ``hi`` + ``lo`` (``_host.split``): their sum in
    float64 for float64 data (exact to ~48 bits), ``hi`` otherwise."""
    if FP64:
        one = tl.full([], 1.0, tl.float64)  # (not .to: the interpreter passes floats)
        return hi * one + lo * one
    else:
        return hi


# ------------------------------------------------------------ launches by name


def launch(jit_fn, grid, kw: dict, consts: dict, num_warps: int):
    """Launch ``jit_fn`` with its arguments by parameter name (``kw``: every argument
    that is not a constexpr; ``consts``: the constexprs). Returns (the compiled kernel,
    ``kw``'s values in the kernel's parameter order: what a record of the launch
    replays). A parameter missing from ``kw`` raises KeyError. Launched on the device of
    the first CUDA tensor in ``kw`` (Triton launches on the current one)."""
    device = next((v.device for v in kw.values()
                   if isinstance(v, torch.Tensor) and v.is_cuda), None)
    if device is not None and device.index != torch._C._cuda_getDevice():
        with torch.cuda.device(device):
            compiled = jit_fn[grid](**kw, **consts, num_warps=num_warps)
    else:
        compiled = jit_fn[grid](**kw, **consts, num_warps=num_warps)
    return compiled, [kw[n] for n in jit_fn.arg_names[:len(kw)]]


# ------------------------------------------------------------ recorded launches


class Replay:
    """The run of a recorded Triton launch (:class:`_record.Recorded`): the compiled
    kernels ``[(kernel, grid, constexpr values)]`` of ``jit_fn``, repeated with a call's
    positional arguments on ``device``. False back: this Triton's launcher takes other
    arguments, so no record can be replayed (``fatal``)."""

    __slots__ = ("jit_fn", "kernels", "device")
    fatal = True

    def __init__(self, jit_fn, launched, n_args, device):
        names = jit_fn.arg_names[n_args:]
        self.jit_fn, self.device = jit_fn, device
        self.kernels = [(k, grid, [consts[n] for n in names]) for k, grid, consts in launched]

    def __call__(self, args) -> bool:
        return replay(self.jit_fn, self.kernels, args, self.device)


def replay(jit_fn, kernels, args, device) -> bool:
    """Repeat a recorded launch of ``jit_fn``: its compiled kernels
    ``[(kernel, grid, constexpr values)]`` with these positional arguments, on
    ``device`` (made current for the launch). CPU tensors (the interpreter, the tests'
    ``cpu_plans``) go through Triton's own launch. False: this Triton's launcher takes
    other arguments (nothing was launched)."""
    if device.type != "cuda":
        names = jit_fn.arg_names[len(args):]
        for _, grid, consts in kernels:
            jit_fn[grid](*args, **dict(zip(names, consts)))
        return True
    if device.index != torch._C._cuda_getDevice():
        with torch.cuda.device(device):
            return run_compiled(kernels, args, device)
    return run_compiled(kernels, args, device)


def _hook(h):
    """A launch hook, or None where there is none: None, or an empty chain of them
    (``triton.knobs.HookChain``, whose launch metadata would be built for nothing)."""
    return None if h is None or getattr(h, "calls", True) == [] else h


def run_compiled(kernels, args, device) -> bool:
    """Launch compiled kernels ``[(kernel, grid, constexpr values)]`` with these
    positional arguments on the current stream of ``device`` (the current device),
    through the compiled kernels' own launcher, without Triton's argument binding.
    False: this Triton's launcher takes other arguments (nothing was launched)."""
    stream = torch._C._cuda_getCurrentRawStream(device.index)
    enter, leave = _hook(knobs.runtime.launch_enter_hook), _hook(knobs.runtime.launch_exit_hook)
    try:
        for kernel, grid, consts in kernels:
            full = (*args, *consts)
            # the launch metadata is for the enter hook only (a profiler's)
            meta = None if enter is None else kernel.launch_metadata(grid, stream, *full)
            kernel.run(grid[0], grid[1], 1, stream, kernel.function, kernel.packed_metadata,
                       meta, enter, leave, *full)
    except TypeError:  # a Triton whose launcher takes other arguments (before launching)
        return False
    return True


class Chain:
    """The run of a recorded call of several kernels (``_record.Recorded``): each
    :class:`Replay` of ``parts`` (``[(replay, lo, hi)]``) on its slice of the one
    argument list. False back where a launcher takes other arguments (``fatal``)."""

    __slots__ = ("parts",)
    fatal = True

    def __init__(self, parts):
        self.parts = tuple(parts)

    def __call__(self, args) -> bool:
        for run, lo, hi in self.parts:
            if not run(args[lo:hi]):
                return False
        return True
