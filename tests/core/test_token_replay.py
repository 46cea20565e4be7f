"""The token estimators' recorded launch: a repeated Triton call (same shapes, strides,
dtypes, device and options) replays the recorded kernels (``_tl.Chain``) and gives the
full path's bits, with the numbers of the new call; anything the record did not fix
goes through the full path again (interpreter under ``cpu_plans``, and on CUDA)."""

from __future__ import annotations

import pytest
import torch
from core_testlib import python_plans, spy_c_replay

import rl_triton_core as rc
from rl_triton_core import _tl
from rl_triton_core.scan import _dispatch


@pytest.fixture
def replays(impl, tuned, monkeypatch):
    """Counts the recorded token calls replayed; a fresh table of records."""
    if impl.name == "cpu":
        pytest.skip("the Triton path records launches (the CPU path has its own replay)")
    if impl.is_interp:
        tuned(cpu_plans=True)
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    count = [0]
    real = _tl.Chain.__call__

    def spy(self, args):
        count[0] += 1
        return real(self, args)

    monkeypatch.setattr(_tl.Chain, "__call__", spy)
    class Counted:  # a CUDA call repeated in C (scan/_claunch.py) counts too
        @staticmethod
        def append(res):
            count[0] += 1

    spy_c_replay(monkeypatch, Counted)
    return count


def _data(gen, device, dtype, shape):
    r = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    m = torch.rand(shape, generator=gen) < 0.8
    return r.to(device), v.to(device), m.to(device)


def _full(fn, *a, **k):
    """The same call through the full path (caching off)."""
    with rc.tuning(cached_launch=False):
        return fn(*a, **k)


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x.view(torch.uint8) if x.dtype == torch.bool else x, y), \
                (x - y).abs().max()


@pytest.mark.parametrize("case", ["gae", "gae_whiten_fill", "gae_mul", "returns", "whiten",
                                  "packed", "bf16_whiten"])
def test_repeat_replays_with_the_full_paths_bits(impl, replays, gen, case):
    dtype = torch.bfloat16 if case == "bf16_whiten" else torch.float32
    shape = (37,) if case == "packed" else (3, 37)
    r, v, m = _data(gen, impl.device, dtype, shape)
    cu = torch.tensor([0, 5, 5, 20, 37], device=impl.device) if case == "packed" else None

    def call(gamma, lmbda):
        if case == "returns":
            return rc.masked_returns(r, m, gamma=gamma, time_dim=-1)
        if case == "whiten":
            return rc.masked_whiten(r, m, fill=0.0, count_eps=1e-8)
        return rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, time_dim=-1,
                             skip=case != "gae_mul", cu_seqlens=cu,
                             whiten=case in ("gae_whiten_fill", "bf16_whiten"),
                             fill=0.0 if case == "gae_whiten_fill" else None)

    first = call(0.9, 0.8)
    assert replays[0] == 0
    for gamma, lmbda in ((0.9, 0.8), (0.5, 1.0), (1, 0)):
        got = call(gamma, lmbda)
        _same(got, _full(call, gamma, lmbda))
    assert replays[0] == 3
    _same(first, _full(call, 0.9, 0.8))
    # fresh outputs each time
    again = call(0.9, 0.8)
    a0 = again[0] if isinstance(again, tuple) else again
    f0 = first[0] if isinstance(first, tuple) else first
    assert a0.data_ptr() != f0.data_ptr()
    if case != "whiten":  # out of range on a recorded key: the full path's error
        with pytest.raises(ValueError, match="gamma"):
            call(1.5, 0.8)


def test_not_recorded_where_the_record_would_not_hold(impl, replays, gen):
    r, v, m = _data(gen, impl.device, torch.float32, (40, 3))
    for _ in range(2):  # time-major: the outputs are transposed views
        _same(rc.masked_gae(r, v, m, time_dim=0), _full(rc.masked_gae, r, v, m, time_dim=0))
    assert replays[0] == 0 and not _dispatch._PLANS
    # another stride, dtype or option is another record
    r2, v2, m2 = _data(gen, impl.device, torch.float32, (3, 40))
    rc.masked_gae(r2, v2, m2, time_dim=-1)
    rc.masked_gae(r2, v2, m2, time_dim=-1, whiten=True)
    rc.masked_gae(r2[:, ::2], v2[:, ::2], m2[:, ::2], time_dim=-1)
    assert replays[0] == 0 and len(python_plans()) == 3
    rc.masked_gae(r2[:, ::2], v2[:, ::2], m2[:, ::2], time_dim=-1)
    assert replays[0] == 1


def test_options_are_checked_before_a_recorded_call_is_found(impl, replays, gen):
    """A bad option equal to a recorded one (False == 0, 1 == True) still gets the full
    path's error: options are checked before the lookup, and keyed as checked."""
    r, _, m = _data(gen, impl.device, torch.float32, (3, 40))
    for _ in range(2):
        rc.masked_whiten(r, m, fill=0.0)
        rc.masked_gae(r, r, m, gamma=1.0, lmbda=1.0, time_dim=-1)
    assert replays[0] == 2
    with pytest.raises(TypeError, match="fill"):
        rc.masked_whiten(r, m, fill=False)
    with pytest.raises(TypeError, match="gamma"):
        rc.masked_gae(r, r, m, gamma=True, lmbda=1.0, time_dim=-1)
