"""The estimators' C entry (``_cscan.entry``, made by ``estimators._entry``): each public
function's calls without ``out=`` go from the caller's arguments straight to the C
replay. It must map every way of passing the arguments to the row's order exactly as
the Python function does, hand every other call to the function itself (with its own
errors), look like the function to ``inspect``, pickle and dynamo, and never repeat a
plan its table no longer holds."""

import inspect
import os
import pickle
import random
import sys
import weakref

import pytest
import torch
from core_testlib import full_path

import rl_triton_core as rc
from rl_triton_core import estimators
from rl_triton_core.scan import _call, _cpu_c, _dispatch

pytestmark = [
    pytest.mark.skipif(_cpu_c.entry is None, reason="no C entry (extension not built)"),
    pytest.mark.skipif(os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
                       reason="the CPU path only"),
]

NAMES = ("gae", "gae_advantages", "lambda_returns", "discounted_returns", "vtrace",
         "retrace", "eligibility_traces", "episodic_cumsum", "linear_recurrence")


@pytest.fixture
def python_calls(monkeypatch):
    """A fresh plan cache; the list of calls the Python path computed (``_call.forward``):
    a call the C entry's replay took adds none."""
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    seen = []
    real = _call.forward

    def spy(*a, **k):
        seen.append(a[0].name)
        return real(*a, **k)

    monkeypatch.setattr(_call, "forward", spy)
    return seen


def _args(name, g, B, T):
    """Random arguments of ``name`` at [B, T] (batch-major): every parameter but
    time_dim and out, by name (optional ones included at random)."""
    def rnd(*s):
        return torch.randn(*s, generator=g)

    def flags():
        return torch.rand(B, T, generator=g) < 0.1

    coef = dict(gamma=float(torch.rand((), generator=g)),
                lmbda=float(torch.rand((), generator=g)) * 0.9 + 0.05)
    opt = {}
    if name in ("gae", "gae_advantages", "lambda_returns"):
        a = dict(rewards=rnd(B, T), values=rnd(B, T), terminated=flags(), truncated=flags(),
                 **coef)
        opt = dict(bootstrap_value=rnd(B))
    elif name == "discounted_returns":
        a = dict(rewards=rnd(B, T), terminated=flags(), truncated=flags(), gamma=coef["gamma"])
        opt = dict(bootstrap_value=rnd(B))
    elif name == "vtrace":
        a = dict(log_rhos=rnd(B, T) * 0.3, rewards=rnd(B, T), values=rnd(B, T),
                 terminated=flags(), truncated=flags(), **coef, rho_bar=1.0, c_bar=0.9)
        opt = dict(pg_rho_bar=0.8, next_values=rnd(B, T))
    elif name == "retrace":
        a = dict(log_rhos=rnd(B, T) * 0.3, rewards=rnd(B, T), q_values=rnd(B, T),
                 expected_next_q=rnd(B, T), terminated=flags(), **coef)
        opt = dict(truncated=flags(), c_bar=0.9)
    elif name in ("eligibility_traces", "episodic_cumsum"):
        a = dict(x=rnd(B, T), done=flags())
        if name == "eligibility_traces":
            a.update(coef)
        opt = dict(init=rnd(B))
    else:
        a = dict(alpha=torch.rand(B, T, generator=g), beta=rnd(B, T))
        opt = dict(init=rnd(B), reverse=bool(torch.rand((), generator=g) < 0.5))
    a.update({k: v for k, v in opt.items() if torch.rand((), generator=g) < 0.5})
    return a


def _as_call(fn, a, rng):
    """``a`` passed to ``fn`` some random legal way: as many leading positional
    parameters as a random cut allows, the rest as keywords in a random order."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.name not in ("time_dim", "out")]
    npos = 0
    for p in params:
        if p.kind is not p.POSITIONAL_OR_KEYWORD or p.name not in a:
            break
        npos += 1
    npos = rng.randint(0, npos)
    pos = [a[p.name] for p in params[:npos]]
    kw = [(k, v) for k, v in a.items() if k not in {p.name for p in params[:npos]}]
    rng.shuffle(kw)
    return pos, dict(kw + [("time_dim", -1)])


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def test_each_entry_is_its_function():
    for name in NAMES:
        e = getattr(rc, name)
        fn = e.__wrapped__
        assert type(e) is _cpu_c.Entry and inspect.isfunction(fn)
        assert e.__name__ == name and e.__doc__ == fn.__doc__ and e.__module__ == fn.__module__
        assert inspect.signature(e) == inspect.signature(fn)
        assert pickle.loads(pickle.dumps(e)) is e
        assert name in repr(e)
        assert getattr(e, "__original_fn") is fn  # noqa: B009 (what dynamo traces)
        assert weakref.ref(e)() is e


@pytest.mark.parametrize("name", NAMES)
def test_every_way_of_passing_arguments_is_the_functions(name, python_calls, monkeypatch):
    """Random arguments passed random legal ways: the entry's result equals, bit for bit,
    the Python function's on the full path; on CPU, GAE and TD(lambda) are repeated in C
    from the second call on (no Python path ran)."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    e = getattr(rc, name)
    replays = name in ("gae", "gae_advantages", "lambda_returns", "discounted_returns")
    for i in range(6):
        B = int(torch.randint(1, 9, (), generator=g))
        T = int(torch.randint(1, 70, (), generator=g))
        a = _args(name, g, B, T)
        before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
        pos, kw = _as_call(e, a, rng)
        first = e(*pos, **kw)
        pos, kw = _as_call(e, a, rng)  # another way: the same call, the same key
        n = len(python_calls)
        got = e(*pos, **kw)
        if replays:
            assert len(python_calls) == n, f"{name} case {i} seed={seed}: not replayed in C"
        want = full_path(monkeypatch, lambda a=a: e.__wrapped__(**a, time_dim=-1))
        assert _same(first, want) and _same(got, want), f"{name} case {i} seed={seed}"
        for k, v in before.items():
            assert not isinstance(v, torch.Tensor) or torch.equal(a[k], v)


def test_other_calls_are_the_functions_own(python_calls):
    g = torch.Generator().manual_seed(1)
    r, v = torch.randn(3, 40, generator=g), torch.randn(3, 40, generator=g)
    d = torch.rand(3, 40, generator=g) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    with pytest.raises(TypeError, match="time_dim"):
        rc.gae(r, v, d)
    with pytest.raises(TypeError, match="bogus"):
        rc.gae(r, v, d, time_dim=-1, bogus=1)
    with pytest.raises(TypeError, match="positional"):
        rc.gae(r, v, d, None, None, time_dim=-1)
    with pytest.raises(TypeError, match="multiple values"):
        rc.gae(r, v, d, terminated=d, time_dim=-1)
    with pytest.raises(TypeError, match="values"):
        rc.gae(r, terminated=d, time_dim=-1)
    with pytest.raises(ValueError, match="gamma"):
        rc.gae(r, v, d, gamma=1.5, time_dim=-1)
    out = (torch.full_like(r, float("nan")), torch.full_like(r, float("nan")))
    got = rc.gae(r, v, d, time_dim=-1, out=out)
    assert got[0] is out[0] and _same(got, rc.gae(r, v, d, time_dim=-1))
    kw = {"time_dim": -1, "gamma": 0.5}  # keywords from a dict
    assert _same(rc.gae(r, v, d, **kw), rc.gae.__wrapped__(r, v, d, **kw))


def test_a_cleared_table_is_not_repeated(python_calls):
    """The replay remembers its last lookups; a plan its table dropped (cleared, or the
    table replaced) must not be repeated from that memory."""
    g = torch.Generator().manual_seed(2)
    r, v = torch.randn(4, 30, generator=g), torch.randn(4, 30, generator=g)
    d = torch.rand(4, 30, generator=g) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"]  # recorded, then repeated in C
    _dispatch._PLANS.clear()
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"] * 2  # recorded again
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"] * 2
    for key in list(_dispatch._PLANS):  # the recording dropped by key
        del _dispatch._PLANS[key]
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"] * 3


def test_an_environment_switch_is_read_each_call(python_calls, monkeypatch):
    """The replay remembers the two switches while the environment's pointers are the
    same: a value changed in place (an existing variable set again) must be seen."""
    monkeypatch.setenv("RL_TRITON_CORE_CPU_FIRST", "0")
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "c")  # exists before the calls
    g = torch.Generator().manual_seed(3)
    r, v = torch.randn(4, 30, generator=g), torch.randn(4, 30, generator=g)
    d = torch.rand(4, 30, generator=g) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"]
    os.environ["RL_TRITON_CORE_CPU_KERNEL"] = "numba"  # the C path off: Python's
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"] * 2
    os.environ["RL_TRITON_CORE_CPU_KERNEL"] = "c"
    rc.gae(r, v, d, time_dim=-1)
    assert python_calls == ["gae"] * 2


def test_a_repeated_call_runs_no_python(python_calls):
    """A replayed call runs neither the Python function nor the front door (profiled
    frames); a call with out= is the function's own."""
    g = torch.Generator().manual_seed(5)
    r, v = torch.randn(4, 30, generator=g), torch.randn(4, 30, generator=g)
    d = torch.rand(4, 30, generator=g) < 0.1
    codes = {rc.gae.__wrapped__.__code__: "gae", estimators._front.__code__: "_front"}
    frames = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            frames.append(codes[frame.f_code])

    def profiled(fn):
        sys.setprofile(prof)
        try:
            return fn()
        finally:
            sys.setprofile(None)

    profiled(lambda: rc.gae(r, v, d, time_dim=-1))
    assert frames == ["_front"]  # recorded: the entry, then the front door
    frames.clear()
    profiled(lambda: rc.gae(r, v, d, gamma=0.9, time_dim=-1, out=None))
    assert frames == [] and python_calls == ["gae"]
    out = (torch.empty_like(r), torch.empty_like(r))
    profiled(lambda: rc.gae(r, v, d, time_dim=-1, out=out))
    assert frames == ["gae", "_front"]


def test_dynamo_traces_the_function():
    """Under torch.compile(fullgraph=True) the entry is not called: dynamo traces the
    Python function (the entry's ``__original_fn``), whose custom op is in the graph."""
    g = torch.Generator().manual_seed(4)
    r, v = torch.randn(3, 20, generator=g), torch.randn(3, 20, generator=g)
    d = torch.rand(3, 20, generator=g) < 0.1

    @torch.compile(fullgraph=True, backend="eager")
    def f(r, v, d):
        adv, _ = rc.gae(r, v, d, gamma=0.9, time_dim=-1)
        return adv + rc.eligibility_traces(r, d, time_dim=-1)

    want = rc.gae(r, v, d, gamma=0.9, time_dim=-1)[0] + rc.eligibility_traces(r, d, time_dim=-1)
    torch.testing.assert_close(f(r, v, d), want)


def test_the_spy_sees_every_replay(monkeypatch):
    """With ``estimators._replay`` swapped (the tests' spies), the entry steps aside and
    the function's own front door calls the swapped one."""
    seen = []
    real = estimators._replay
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    monkeypatch.setattr(estimators, "_replay", lambda *a: seen.append(1) or real(*a))
    r, v = torch.randn(2, 10), torch.randn(2, 10)
    d = torch.rand(2, 10) < 0.1
    rc.gae(r, v, d, time_dim=-1)
    rc.gae(r, v, d, time_dim=-1)
    assert len(seen) == 2
