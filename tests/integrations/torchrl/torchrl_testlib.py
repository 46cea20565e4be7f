"""Helpers for the TorchRL adapter tests: TorchRL-layout random data and tolerances."""

from __future__ import annotations

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# |ours - torchrl| <= ATOL * max(1, |torchrl|) elementwise. TorchRL computes its
# discounts (``gamma * (~done).int()``, its geometric series) in float32 even for
# float64 data, and its vectorized forms drop terms below 1e-7: float64 results agree
# to about 1e-6 over T = 200 steps, float32 ones to about 1e-5.
ATOL = {torch.float32: 2e-4, torch.float64: 1e-5}


def assert_close(ours, theirs, dtype=None):
    """Same shape, dtype and device, and values within the tolerance of ``dtype``."""
    if isinstance(theirs, tuple):
        assert isinstance(ours, tuple) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert_close(a, b, dtype)
        return
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.device == theirs.device
    tol = ATOL[dtype or theirs.dtype]
    ours64, theirs64 = ours.double(), theirs.double()
    err = (ours64 - theirs64).abs() / theirs64.abs().clamp_min(1.0)
    assert not torch.isnan(ours64).any()
    assert err.max().item() <= tol, f"max scaled error {err.max().item():.3g} > {tol}"


def flags(gen, shape, p_done=0.15, p_term=0.5, device="cpu"):
    """(done, terminated) bool flags, terminated a random subset of done (TorchRL's invariant)."""
    done = torch.rand(shape, generator=gen) < p_done
    terminated = done & (torch.rand(shape, generator=gen) < p_term)
    return done.to(device), terminated.to(device)


def data(gen, shape, dtype=torch.float32, device="cpu"):
    """state_value, next_state_value, reward (standard normal) and done, terminated."""

    def randn():
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).to(device)

    done, terminated = flags(gen, shape, device=device)
    return randn(), randn(), randn(), done, terminated


def per_step_gamma(gen, shape, dtype=torch.float32, device="cpu", lo=0.9, hi=0.999):
    """A per-step gamma tensor like TorchRL's ``gamma ** steps_to_next_obs``."""
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    return (lo + (hi - lo) * u).to(dtype).to(device)

