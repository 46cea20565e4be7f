"""The CPU path's cached call (a ``_record.Recorded`` run by ``_dispatch.CpuRun``, and its C replay
``_cscan.replay`` where torch has the DLPack C exchange table): a repeated call with the
same shapes, strides and dtypes replays the recorded call without validation. It
must give the full path's bits, read the call's own numbers, and leave to the full path
whatever it checks by value (a coefficient out of range, a per-step coefficient tensor)
or by environment (the backend)."""

import os

import pytest
import torch
from core_testlib import full_path, spy_c_replay

import rl_triton_core as rc
from rl_triton_core import _record
from rl_triton_core.scan import _cpu_first, _dispatch

pytestmark = pytest.mark.skipif(
    os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
    reason="the numba CPU path only",
)


@pytest.fixture
def plans(monkeypatch):
    """A fresh plan cache; numba from the first call; ``plans.replays``: the plans'
    results, in order."""
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    monkeypatch.setenv("RL_TRITON_CORE_CPU_FIRST", "0")
    replays = []
    real = _record.Recorded.__call__

    def spy(self, raw):
        res = real(self, raw)
        if isinstance(self.run, _dispatch.CpuRun):
            replays.append(res)
        return res

    monkeypatch.setattr(_record.Recorded, "__call__", spy)
    spy_c_replay(monkeypatch, replays)  # the C replay: a hit is a replay, a miss goes on
    return replays


def _data(g, B=6, T=50):
    r, v, nv = (torch.randn(B, T, 1, generator=g) for _ in range(3))
    done = torch.rand(B, T, 1, generator=g) < 0.1
    return r, v, done & (torch.rand(B, T, 1, generator=g) < 0.5), done, nv


_full = full_path


def test_replay_equals_full_path(plans, monkeypatch):
    g = torch.Generator().manual_seed(0)
    r, v, te, done, nv = _data(g)
    rc.gae(r, v, te, done, next_values=nv, gamma=0.9, time_dim=-2)
    assert any(isinstance(getattr(p, "run", None), _dispatch.CpuRun)
               for p in _dispatch._PLANS.values())
    for gamma in (0.9, 0.5, 1):  # the replay reads this call's numbers
        r2, v2, te2, done2, nv2 = _data(g)
        got = rc.gae(r2, v2, te2, done2, next_values=nv2, gamma=gamma, time_dim=-2)
        want = _full(monkeypatch, lambda a=(r2, v2, te2, done2), nv2=nv2, gamma=gamma: rc.gae(
            *a, next_values=nv2, gamma=gamma, time_dim=-2))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(plans) == 3 and all(p is not None for p in plans)


def test_replay_other_estimators(plans, monkeypatch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 40, dtype=torch.float64, generator=g)
    b = torch.rand(3, 40, dtype=torch.float64, generator=g)
    rho = torch.randn(3, 40, dtype=torch.float64, generator=g)
    v = torch.randn(3, 40, dtype=torch.float64, generator=g)
    te = torch.rand(3, 40, generator=g) < 0.1
    calls = [lambda: rc.linear_recurrence(x, b, time_dim=-1),
             lambda: rc.vtrace(rho, x, v, te, bootstrap_value=v[:, 0], time_dim=-1),
             lambda: rc.lambda_returns(x, v, te, time_dim=-1)]
    for call in calls:
        call()
        got, want = call(), _full(monkeypatch, call)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        assert all(torch.equal(a, w) for a, w in zip(got, want))
    assert len(plans) == len(calls) and all(p is not None for p in plans)


def test_replay_leaves_checks_to_the_full_path(plans, monkeypatch):
    g = torch.Generator().manual_seed(2)
    r, v, te, done, nv = _data(g)
    rc.gae(r, v, te, done, next_values=nv, time_dim=-2)
    with pytest.raises(ValueError, match="gamma"):
        rc.gae(r, v, te, done, next_values=nv, gamma=1.5, time_dim=-2)
    with pytest.raises(ValueError, match="gamma"):
        rc.gae(r, v, te, done, next_values=nv, gamma=float("nan"), time_dim=-2)
    assert plans == [None, None]
    with monkeypatch.context() as m:  # another backend: the full path decides
        m.setenv("RL_TRITON_CORE_BACKEND", "triton")
        m.setattr(_dispatch, "_run_triton", lambda *a: None)
        rc.gae(r, v, te, done, next_values=nv, time_dim=-2)
    assert plans == [None, None, None]
    # a per-step gamma is range-checked by value: never a plan
    gam = torch.rand(6, 50, 1, generator=g)
    n = len(_dispatch._PLANS)
    rc.gae(r, v, te, done, next_values=nv, gamma=gam, time_dim=-2)
    assert len(_dispatch._PLANS) == n
    with pytest.raises(ValueError, match="gamma"):
        rc.gae(r, v, te, done, next_values=nv, gamma=gam + 1.5, time_dim=-2)


def test_replay_waits_for_numba_like_the_full_path(plans, monkeypatch):
    """Where the full path would take the numpy first call (the variant's numba kernel
    not ready), the plan does not replay."""
    g = torch.Generator().manual_seed(3)
    r, v, te, done, nv = _data(g)
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")  # numpy's first call is numba's
    rc.gae(r, v, te, done, next_values=nv, time_dim=-2)
    monkeypatch.setenv("RL_TRITON_CORE_CPU_FIRST", "1")
    monkeypatch.setattr(_cpu_first, "ready", lambda key: False)
    monkeypatch.setattr(_cpu_first, "warm", lambda key, args: None)
    rc.gae(r, v, te, done, next_values=nv, time_dim=-2)
    assert plans == [None]


@pytest.mark.parametrize("first", [False, True])
def test_a_number_for_a_bool_option_is_not_a_replay(first, plans):
    """The key marks a number apart from a bool (0 == False and 1 == True in Python): an
    int ``reverse`` after a recorded bool one still gets the full path's TypeError, not
    the recorded direction."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g)
    rc.linear_recurrence(a, b, reverse=first, time_dim=-1)
    rc.linear_recurrence(a, b, reverse=first, time_dim=-1)
    assert plans  # the second call replayed
    with pytest.raises(TypeError, match="reverse"):
        rc.linear_recurrence(a, b, reverse=int(first), time_dim=-1)


def test_a_bool_time_dim_is_not_a_replay(plans):
    """time_dim=True after time_dim=1 (True == 1 in Python) still raises the TypeError."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 8, generator=g), torch.rand(2, 8, generator=g)
    rc.linear_recurrence(a, b, time_dim=1)
    rc.linear_recurrence(a, b, time_dim=1)
    assert plans
    with pytest.raises(TypeError, match="time_dim"):
        rc.linear_recurrence(a, b, time_dim=True)


def test_cpu_arguments_are_named_as_the_kernels_parameters():
    """The CPU scan's argument record (``_dispatch.CpuArgs``) is the numba kernel's
    parameter list by name, and its first twelve the first-call numpy loop's; the plan
    finds an input slot's array and a coefficient's number by these names."""
    import inspect

    from rl_triton_core.scan import _cpu

    fn = _cpu.kernel(1, True, True, True, False, True, True, False, False, False)
    params = tuple(inspect.signature(fn.py_func).parameters)
    fields = _dispatch.CpuArgs._fields
    assert params[:len(fields)] == fields
    assert tuple(inspect.signature(_cpu_first._gae).parameters)[1:] == fields[:12]
    assert {"x", "v", "nv", "term", "trunc", "boot", "init", "rho"} <= set(fields)
    assert all(s in fields and s + "s" in fields for s in ("g", "lm", "rb", "cb", "pb"))
