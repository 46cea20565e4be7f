"""Layouts: every tensor of a call is seen as a strided [N1, N2, T] view, without copying.

The data's shape is ``lead + (T,) + trail`` with the time axis at ``time_dim``.
Streams are indexed by ``n = n1 * N2 + n2`` with ``N1 = prod(lead)`` and
``N2 = prod(trail)``; a tensor that broadcasts to the data (flags, per-step
gamma, a ``done`` without the feature axes) gets stride 0 on the axes it lacks.
Only when a group of axes cannot be merged into one stride (a rare
non-mergeable view) is that one tensor copied.
"""

from __future__ import annotations

import math

import torch


def normalize_time_dim(time_dim, ndim: int, name: str = "time_dim") -> int:
    if isinstance(time_dim, bool) or not isinstance(time_dim, int):
        raise TypeError(f"{name} must be an int, got {type(time_dim).__name__}")
    if ndim == 0:
        raise ValueError(f"{name}: the data has no axes (a 0-d tensor has no time axis)")
    if not -ndim <= time_dim < ndim:
        raise ValueError(
            f"{name}={time_dim} is out of range for data with {ndim} dimensions "
            f"(expected {-ndim} <= {name} < {ndim})"
        )
    return time_dim % ndim


def _merge(sizes, strides):
    """One stride for a group of axes, or None if they do not merge."""
    merged = 0
    expected = None
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if size == 1:
            continue
        if expected is None:
            merged = stride
        elif stride != expected:
            return None
        expected = stride * size
    return merged


def aligned_strides(t: torch.Tensor, shape: tuple) -> list | None:
    """Strides of ``t`` broadcast (right-aligned) to ``shape``; None if not broadcastable."""
    nd = len(shape)
    if t.dim() > nd:
        return None
    out = [0] * nd
    off = nd - t.dim()
    for i, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if size == shape[off + i]:
            out[off + i] = stride if size != 1 else 0
        elif size == 1:
            out[off + i] = 0
        else:
            return None
    return out


def _np_view(a, shape, strides):
    """A strided view of numpy array ``a``'s memory (fast path for contiguous ``a``)."""
    import numpy as np

    try:
        return np.ndarray(shape, a.dtype, a, strides=strides)
    except ValueError:  # a is itself a non-contiguous view
        return np.lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


class Layout:
    """Shape bookkeeping for one call: the data shape and its time axis."""

    __slots__ = ("shape", "td", "T", "N1", "N2", "lead", "trail")

    def __init__(self, shape: tuple, td: int):
        self.shape = tuple(shape)
        self.td = td
        self.T = shape[td]
        self.lead = self.shape[:td]
        self.trail = self.shape[td + 1 :]
        self.N1 = math.prod(self.lead)
        self.N2 = math.prod(self.trail)

    @property
    def N(self) -> int:
        return self.N1 * self.N2

    def mergeable(self, t: torch.Tensor) -> bool:
        strides = aligned_strides(t, self.shape)
        td = self.td
        return (
            _merge(self.lead, strides[:td]) is not None
            and _merge(self.trail, strides[td + 1 :]) is not None
        )

    def view3(self, t: torch.Tensor, strides: list | None = None):
        """(tensor, s1, s2, st): ``t`` (already known to broadcast) as [N1, N2, T] strides.

        Returns the tensor whose ``data_ptr`` the strides are relative to (``t``
        itself unless a copy was needed).
        """
        if strides is None:
            strides = aligned_strides(t, self.shape)
        td = self.td
        s1 = _merge(self.lead, strides[:td])
        s2 = _merge(self.trail, strides[td + 1 :])
        if s1 is None or s2 is None:
            t = t.expand(self.shape).movedim(td, -1).reshape(self.N1, self.N2, self.T).contiguous()
            return t, self.N2 * self.T, self.T, 1
        return t, s1, s2, strides[td]

    def view3_notime(self, t: torch.Tensor):
        """(tensor, s1, s2) for a tensor with the data's shape minus the time axis."""
        shape = self.lead + self.trail
        strides = aligned_strides(t, shape)
        nl = len(self.lead)
        s1 = _merge(self.lead, strides[:nl])
        s2 = _merge(self.trail, strides[nl:])
        if s1 is None or s2 is None:
            t = t.expand(shape).reshape(self.N1, self.N2).contiguous()
            return t, self.N2, 1
        return t, s1, s2

    def as_numpy3(self, t: torch.Tensor):
        """A numpy [N1, N2, T] strided view of a CPU tensor (no copy unless unmergeable)."""

        base, s1, s2, st = self.view3(t)
        a = base.numpy()
        item = a.itemsize
        return _np_view(a, (self.N1, self.N2, self.T), (s1 * item, s2 * item, st * item))

    def as_numpy2(self, t: torch.Tensor):

        base, s1, s2 = self.view3_notime(t)
        a = base.numpy()
        item = a.itemsize
        return _np_view(a, (self.N1, self.N2), (s1 * item, s2 * item))
