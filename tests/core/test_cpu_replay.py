"""The C replay of a recorded CPU call (``_cscan.replay``, reached from the estimators'
front door): it must return the full path's bits, and hand every call it cannot repeat
exactly to the Python path, which then checks, records or raises as before."""

import os

import numpy as np
import pytest
import torch
from core_testlib import (
    full_path,
    spy_c_replay,
    torch_ext,  # noqa: F401 (autouse: every test twice, C++ API and DLPack)
)

import rl_triton_core as rc
from rl_triton_core import estimators
from rl_triton_core.scan import _dispatch

pytestmark = [
    pytest.mark.skipif(estimators._replay is None,
                       reason="no C replay (extension not built, or no DLPack C table)"),
    pytest.mark.skipif(os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
                       reason="the CPU path only"),
]



@pytest.fixture
def hits(monkeypatch):
    """A fresh plan cache; ``hits``: the C replay's results that were not None."""
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    got = []
    spy_c_replay(monkeypatch, got)
    return got


_full = full_path


def _bits(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        and np.array_equal(x.numpy(), y.numpy(), equal_nan=True) for x, y in zip(a, b))


def _case(g, i):
    """Random data of case i: layout, flags' dtype, bootstrap or next values, numbers."""
    B = int(torch.randint(1, 40, (), generator=g))
    T = int(torch.randint(1, 300, (), generator=g))
    dtype = (torch.float32, torch.float64)[i % 2]
    time_major = i % 3 == 0
    shape = (T, B) if time_major else (B, T)
    r, v = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g,
                                                                     dtype=dtype)
    p = float(torch.rand((), generator=g)) * 0.1
    flag = (torch.bool, torch.float32, torch.uint8)[i % 3]
    te = (torch.rand(shape, generator=g) < p).to(flag)
    tr = (torch.rand(shape, generator=g) < p).to(flag)
    if i % 4 == 1:  # a stream view: every other column of a wider tensor
        wide = torch.randn(shape[0], 2 * shape[1], generator=g, dtype=dtype)
        r = wide[:, ::2]
    kw = dict(gamma=float(torch.rand((), generator=g)),
              lmbda=float(torch.rand((), generator=g)), time_dim=0 if time_major else -1)
    if i % 5 == 2:
        kw["bootstrap_value"] = torch.randn(B, generator=g, dtype=dtype)
    if i % 5 == 3:
        kw["next_values"] = torch.randn(shape, generator=g, dtype=dtype)
    return r, v, te, tr, kw


NAMES = ("gae", "lambda_returns", "discounted_returns")


def _call(name, r, v, te, tr, kw):
    if name == "discounted_returns":
        kw = {k: x for k, x in kw.items() if k not in ("lmbda", "next_values")}
        return rc.discounted_returns(r, te, tr, **kw)
    return getattr(rc, name)(r, v, te, tr, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_replay_equals_full_path(name, hits, monkeypatch):
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    for i in range(12):
        r, v, te, tr, kw = _case(g, i)
        before = [t.clone() for t in (r, v, te, tr)]
        first = _call(name, r, v, te, tr, kw)
        n = len(hits)
        # new data of the same key: the replay reads these tensors and these numbers
        r2, v2, te2, tr2 = (t.clone() if t.is_contiguous() else t for t in (r, v, te, tr))
        r2 = r2 + 1 if r2.is_contiguous() else r2
        kw2 = dict(kw, gamma=kw["gamma"] / 2)
        got = _call(name, r2, v2, te2, tr2, kw2)
        want = _full(monkeypatch, lambda a=(r2, v2, te2, tr2, kw2): _call(name, *a))
        assert _bits(got, want), f"{name} case {i} seed={seed}"
        assert _bits(_full(monkeypatch, lambda a=(r, v, te, tr, kw): _call(name, *a)), first)
        assert all(torch.equal(a, b) for a, b in zip((r, v, te, tr), before))
        if r.dtype == torch.float32 and r.is_contiguous():
            assert len(hits) == n + 1, f"{name} case {i}: the C replay did not take it"


def test_outputs_are_ordinary_tensors(hits):
    r, v = torch.randn(4, 20), torch.randn(4, 20)
    d = torch.rand(4, 20) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    adv, ret = rc.gae(r, v, d, time_dim=-1)
    assert len(hits) == 1
    assert adv.is_contiguous() and adv.untyped_storage().resizable() and adv._base is None
    assert adv.data_ptr() != ret.data_ptr() and not adv.requires_grad
    adv.resize_(100)  # a tensor of torch's own allocator


def test_grad_and_subclasses_take_the_python_path(hits):
    r, v = torch.randn(4, 20), torch.randn(4, 20)
    d = torch.rand(4, 20) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    vg = v.clone().requires_grad_()
    adv, _ = rc.gae(r, vg, d, time_dim=-1)
    assert adv.requires_grad and not hits
    adv.sum().backward()
    assert vg.grad is not None
    with torch.no_grad():
        rc.gae(r, vg, d, time_dim=-1)
    assert not hits  # a tensor that requires grad never replays in C
    rc.gae(r, torch.nn.Parameter(v, requires_grad=False), d, time_dim=-1)
    assert not hits  # a subclass neither
    rc.gae(r, v, d, time_dim=-1)
    assert len(hits) == 1


def test_metadata_changed_in_place_is_a_new_key(hits, monkeypatch):
    r, v = torch.randn(4, 20), torch.randn(4, 20)
    d = torch.rand(4, 20) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    for t in (r, v):
        t.resize_(5, 16).normal_()
    d = torch.rand(5, 16) < 0.1
    got = rc.gae(r, v, d, time_dim=-1)
    assert not hits and got[0].shape == (5, 16)
    assert _bits(got, _full(monkeypatch, lambda: rc.gae(r, v, d, time_dim=-1)))
    r.t_()  # the same object, transposed: another key again
    v.t_()
    got = rc.gae(r, v, d.t(), time_dim=0)
    assert not hits
    assert _bits(got, _full(monkeypatch, lambda: rc.gae(r, v, d.t(), time_dim=0)))


def test_checks_and_switches_go_to_the_python_path(hits, monkeypatch):
    r, v = torch.randn(4, 20), torch.randn(4, 20)
    d = torch.rand(4, 20) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            rc.gae(r, v, d, gamma=bad, time_dim=-1)
    with pytest.raises(TypeError):
        rc.gae(r, v, d, time_dim=True)  # a bool is not the int it equals
    with rc.tuning(cpu_threads=1):  # another tuning: recorded apart
        rc.gae(r, v, d, time_dim=-1)
    assert not hits
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
    monkeypatch.setenv("RL_TRITON_CORE_CPU_FIRST", "0")
    rc.gae(r, v, d, time_dim=-1)
    assert not hits
    monkeypatch.delenv("RL_TRITON_CORE_CPU_KERNEL")
    rc.gae(r, v, d, time_dim=-1)
    assert len(hits) == 1


def test_a_negative_view_is_not_replayed(hits):
    """``z.conj().imag`` is a real view with the negative bit: its memory holds the
    values' negatives. After a recorded call of the same layout the replay must not read
    that memory as the values: the call gives the values' result, every time."""
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(4, 20, generator=g), torch.randn(4, 20, generator=g)
    d = torch.rand(4, 20, generator=g) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    z = torch.complex(torch.randn(4, 20, generator=g), r.clone())
    neg = z.conj().imag  # the values -r, stored as r with the negative bit
    assert neg.is_neg() and torch.equal(neg, -r)
    got = rc.gae(neg, v, d, time_dim=-1)
    assert not hits
    want = rc.gae(-r, v, d, time_dim=-1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    again = rc.gae(neg, v, d, time_dim=-1)  # and again: no plan reads its memory either
    assert torch.equal(again[0], want[0]) and torch.equal(again[1], want[1])


def _out_call(name, r, v, te, tr, kw, out):
    if name == "discounted_returns":
        kw = {k: x for k, x in kw.items() if k not in ("lmbda", "next_values")}
        return rc.discounted_returns(r, te, tr, **kw, out=out)
    return getattr(rc, name)(r, v, te, tr, **kw, out=out)


def _poisoned(like, n, layout):
    """n out= tensors shaped like ``like``, NaN-filled: contiguous, or every other
    element of a wider tensor (a strided view)."""
    outs = []
    for _ in range(n):
        if layout == "strided":
            wide = torch.full(like.shape[:-1] + (2 * like.shape[-1],), float("nan"),
                              dtype=like.dtype)
            outs.append(wide[..., ::2])
        else:
            outs.append(torch.full_like(like, float("nan"), memory_format=torch.contiguous_format))
    return outs


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("name", NAMES)
def test_out_replay_writes_the_full_paths_bits(name, layout, hits, monkeypatch):
    """A CPU call with out= is recorded for the C replay: a repeat with other out=
    tensors (NaN-poisoned) of the same key writes the full path's bits into them and
    returns them."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    n_out = 2 if name == "gae" else 1
    for i in range(8):
        r, v, te, tr, kw = _case(g, i)
        before = [t.clone() for t in (r, v, te, tr)]
        want = _full(monkeypatch, lambda a=(r, v, te, tr, kw): _call(name, *a))
        want = want if isinstance(want, tuple) else (want,)
        for k in range(3):
            outs = _poisoned(r, n_out, layout)
            out = tuple(outs) if n_out == 2 else outs[0]
            n = len(hits)
            got = _out_call(name, r, v, te, tr, kw, out)
            got = got if isinstance(got, tuple) else (got,)
            ctx = f"{name} {layout} case {i} call {k} seed={seed}"
            assert all(x is o for x, o in zip(got, outs)), ctx + ": not the out= tensors"
            for x, w in zip(outs, want):
                assert np.array_equal(x.numpy(), w.numpy(), equal_nan=True), ctx
            if k and r.dtype == torch.float32 and r.is_contiguous():
                assert len(hits) == n + 1, ctx + ": the C replay did not take it"
        assert all(torch.equal(a, b) for a, b in zip((r, v, te, tr), before))


def test_out_replay_still_refuses_overlap_and_grad(hits):
    """A repeated out= call whose out= tensors share memory with an input or with each
    other, or require grad, goes to the Python path, which raises as on the first call."""
    r, v = torch.randn(4, 64), torch.randn(4, 64)
    d = torch.rand(4, 64) < 0.1
    r0 = r.clone()
    o0, o1 = torch.empty(4, 64), torch.empty(4, 64)
    rc.gae(r, v, d, time_dim=-1, out=(o0, o1))
    rc.gae(r, v, d, time_dim=-1, out=(o0, o1))
    assert len(hits) == 1
    with pytest.raises(ValueError, match="overlaps"):
        rc.gae(r, v, d, time_dim=-1, out=(r, o1))  # the same key: the rewards' memory
    with pytest.raises(ValueError, match="overlap"):
        rc.gae(r, v, d, time_dim=-1, out=(o0, o0))
    with pytest.raises(RuntimeError, match="out="):
        rc.gae(r, v, d, time_dim=-1, out=(o0, o1.clone().requires_grad_()))
    assert len(hits) == 1
    assert torch.equal(r, r0)  # the refused calls wrote nothing into the rewards
