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


def data_dtype(named: list) -> torch.dtype:
    """The floating dtype shared by the data tensors (float32 if all are int/bool)."""
    dtype = None
    first = None
    for name, t in named:
        if t is None or not t.is_floating_point():
            continue
        if dtype is None:
            dtype, first = t.dtype, name
        elif t.dtype != dtype:
            raise TypeError(
                f"{name} has dtype {t.dtype} but {first} has {dtype}: pass data tensors "
                "of one floating dtype"
            )
    return dtype if dtype is not None else torch.float32


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
