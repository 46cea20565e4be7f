"""Input checks: a ValueError or TypeError that names the argument; shapes, dtypes and
devices only (no data-dependent check, hence no host synchronisation, on CUDA)."""

from __future__ import annotations

import math
import numbers

import torch

from rl_triton_core._layout import aligned_strides

_FLAG_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def tensor(name: str, t, *, flag: bool = False) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor: "
                        "convert it first (e.g. .to_dense(), or pad a nested tensor)")
    if t.is_meta:
        raise ValueError(f"{name} is a meta tensor (shape only, no data): pass a tensor "
                         "with data, on the CPU or a GPU")
    if flag and t.requires_grad:
        raise ValueError(f"{name} is a flag (nonzero means set) and takes no gradient, but "
                         "it requires grad: pass it detached (e.g. .detach() or .bool())")
    if t.is_complex():
        raise TypeError(f"{name} must be real (float, int or bool), got dtype {t.dtype}")
    if flag and not (t.dtype in _FLAG_DTYPES or t.is_floating_point()):
        raise TypeError(f"{name} must be bool, integer or float 0/1 flags, got dtype {t.dtype}")
    return t


def optional(name: str, t, *, flag: bool = False):
    return None if t is None else tensor(name, t, flag=flag)


def same_shape(name: str, t: torch.Tensor, ref_name: str, shape) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the same shape as {ref_name} {tuple(shape)}, got {tuple(t.shape)}"
        )


def broadcastable(name: str, t: torch.Tensor, shape, what: str) -> list:
    strides = aligned_strides(t, tuple(shape))
    if strides is None:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to {what} {tuple(shape)}"
        )
    return strides


def floating(name: str, t: torch.Tensor) -> torch.Tensor:
    """A data tensor (rewards, values, x, ...) must be floating point: integer and bool
    dtypes are for flags and masks only (a dtype check, no host synchronisation)."""
    if not t.is_floating_point():
        raise TypeError(
            f"{name} must be a float tensor, got dtype {t.dtype}: data takes a floating "
            f"dtype (only flags and masks may be bool or integer), e.g. {name}.float()"
        )
    return t


def data_dtype(named: list) -> torch.dtype:
    """The floating dtype shared by the data tensors (None entries skipped); a TypeError
    naming the first one that is not floating, or that differs from the first."""
    dtype = None
    first = None
    for name, t in named:
        if t is None:
            continue
        floating(name, t)
        if dtype is None:
            dtype, first = t.dtype, name
        elif t.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {first} has {dtype}: pass data tensors "
                "of one floating dtype"
            )
    return dtype


def same_device(named: list) -> torch.device:
    device = None
    first = None
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            continue
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError(
                f"{name} is on {t.device} but {first} is on {device}: all tensors of a call "
                "must be on one device"
            )
    return device


def coefficient(name: str, value, shape, lo: float = 0.0, hi: float | None = 1.0):
    """A Python number in [lo, hi] or a tensor broadcastable to ``shape``.

    Returns (float or None, tensor or None). A CPU tensor's range is checked; a
    CUDA tensor's is not (that would synchronise the host).
    """
    if isinstance(value, torch.Tensor):
        if value.is_complex() or not (value.is_floating_point() or value.dtype in _FLAG_DTYPES):
            raise TypeError(f"{name} tensor must be real, got dtype {value.dtype}")
        broadcastable(name, value, shape, "the data's shape")
        if value.device.type != "cpu":
            return None, value
        if value.numel() != 1:
            if value.numel() > 0:
                bad = torch.isnan(value) | (value < lo)
                if hi is not None:
                    bad |= value > hi
                if bool(bad.any()):
                    raise ValueError(
                        f"{name} must lie in [{lo}, {hi}], got a tensor with values outside"
                    )
            return None, value
        value = float(value.reshape(()))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
    value = float(value)
    if math.isnan(value) or value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must lie in {rng}, got {value}")
    return value, None


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def extent(t: torch.Tensor) -> int:
    """Bytes from ``t.data_ptr()`` to one past its last element (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _internal_overlap(t: torch.Tensor) -> bool:
    """True where two indices of ``t`` may share memory (an expanded or unfolded view).

    Sorted by stride, each axis must step past everything the smaller ones span; a
    view that fails this without overlapping is not made by slicing, transposing or
    reshaping, and is rejected as well (as PyTorch does for views too hard to tell)."""
    span = 0
    for s, n in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if s <= span:
            return True
        span += (n - 1) * s
    return False


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges of ``a`` and ``b`` intersect (pointers only, no sync)."""
    ea, eb = extent(a), extent(b)
    if not ea or not eb or a.device != b.device:
        return False
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + eb and pb < pa + ea


def outputs(out, two_out: bool, shape, device, inputs=None) -> tuple:
    """Check an ``out=`` argument; returns ``(out0, out1-or-None)``.

    ``out``: a tensor, or for the two-output estimators a tuple (or list) of two;
    floating dtype (any: the scan casts on store), the data's ``shape`` and
    ``device``, no internal overlap, no negative bit (its memory is not its values).
    ``inputs``: (name, tensor-or-None) pairs that the outputs must not overlap (byte
    ranges of the pointers: metadata only, no host synchronisation); None skips that
    check and the last two (tracing: fake tensors have no memory)."""
    if two_out:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(
                "out must be a tuple of two tensors (one per output), got "
                f"{type(out).__name__}" + (f" of length {len(out)}"
                                           if isinstance(out, (tuple, list)) else "")
            )
        named = (("out[0]", out[0]), ("out[1]", out[1]))
    else:
        named = (("out", out),)
    shape = tuple(shape)
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have the data's shape {shape}, got {tuple(t.shape)}")
        if device is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but the data is on {device}")
        if inputs is not None and t.is_neg():  # (tracing: the op's result is copied in)
            raise ValueError(
                f"{name} has the negative bit set (a view such as z.conj().imag, whose "
                "memory holds its values' negatives): the scan writes memory; pass a tensor "
                "that holds its values"
            )
        if inputs is not None and _internal_overlap(t):
            raise ValueError(
                f"{name} has overlapping elements (e.g. an expanded view, stride "
                f"{tuple(t.stride())}): every output element needs its own memory"
            )
    if inputs is not None:
        for name, t in named:
            for iname, src in inputs:
                if isinstance(src, torch.Tensor) and overlaps(t, src):
                    raise ValueError(
                        f"{name} overlaps the memory of {iname}: out must not share memory "
                        "with an input"
                    )
        if two_out and overlaps(named[0][1], named[1][1]):
            raise ValueError("out[0] and out[1] overlap: the two outputs need separate memory")
    return (named[0][1], named[1][1] if two_out else None)
