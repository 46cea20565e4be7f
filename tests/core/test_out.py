"""``out=``: every estimator writes into the caller's tensors and returns them.

For each estimator, random inputs (random flags and options) in both time layouts,
and an ``out`` poisoned with NaN in several memory layouts and dtypes: the result
is the call without ``out`` (bit for bit where the dtype is the data's), the float64
reference within tolerance, the same tensor objects come back, and nothing outside
``out``'s view is written. Then: bad ``out`` arguments, autograd, torch.compile and
the cached launch (which must hand the kernel the caller's tensors).
"""

import random

import pytest
import torch
from core_testlib import TOL, bernoulli, python_plans, uniform

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core import _config, _tl
from rl_triton_core._table import TABLE
from rl_triton_core.scan import _dispatch

LEAD, T, A, F = (2, 3), 9, 3, 2  # two lead axes: a permuted out cannot merge them
TWO_OUT = {n for n, e in TABLE.items() if e.n_out == 2}
NAMES = tuple(TABLE) + ("retrace_from_actions",)  # every row, and the one built on retrace


def _shape(td):
    return LEAD + (T,) if td == -1 else (T,) + LEAD


def _flag(gen, shape, p=0.25):
    bits = bernoulli(gen, shape, p)
    kind = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen))).choice(
        ["bool", "uint8", "float"])
    return {"bool": bits, "uint8": bits.to(torch.uint8), "float": bits.float()}[kind]


def _case(name, gen, td, dtype, dev):
    """(args, kwargs, the data's shape) of a random call of ``name``."""
    rng = random.Random(int(torch.randint(0, 2**31, (1,), generator=gen)))
    shape = _shape(td)

    def data(s=shape, scale=1.0):
        return (torch.randn(s, generator=gen, dtype=torch.float64) * scale).to(dtype).to(dev)

    term = _flag(gen, shape).to(dev)
    trunc = _flag(gen, shape).to(dev) if rng.random() < 0.7 else None
    kw = dict(time_dim=td)
    row = TABLE.get(name, TABLE["retrace"])  # retrace_from_actions: on retrace's row
    if "bootstrap_value" in row.inputs:
        if rng.random() < 0.5:
            kw["next_values"] = data()
        else:
            kw["bootstrap_value"] = data(LEAD)  # the shape without time
        kw["gamma"] = rng.uniform(0.8, 1.0)
        if name != "discounted_returns":
            kw["lmbda"] = rng.uniform(0.5, 1.0)
    if name in ("gae", "gae_advantages", "lambda_returns"):
        return (data(), data(), term, trunc), kw, shape
    if name == "discounted_returns":
        return (data(), term, trunc), kw, shape
    if name == "vtrace":
        kw.update(rho_bar=rng.uniform(0.8, 1.5), c_bar=rng.uniform(0.8, 1.5))
        return (data(scale=0.5), data(), data(), term, trunc), kw, shape
    if name == "retrace":
        kw.update(gamma=rng.uniform(0.8, 1.0), lmbda=rng.uniform(0.5, 1.0), c_bar=1.2)
        return (data(scale=0.5), data(), data(), data(), term, trunc), kw, shape
    if name == "retrace_from_actions":
        q = data(shape + (A,))
        probs = torch.softmax(torch.randn(shape + (A,), generator=gen, dtype=torch.float64),
                              -1).to(dtype).to(dev)
        actions = torch.randint(0, A, shape, generator=gen).to(dev)
        logmu = torch.log(uniform(gen, shape, 0.1, 0.9, torch.float64)).to(dtype).to(dev)
        kw.update(gamma=rng.uniform(0.8, 1.0), lmbda=0.9)
        return (q, probs, actions, logmu, data(), term, trunc), kw, shape
    if name in ("eligibility_traces", "episodic_cumsum"):
        feat = (F,) if td == 0 else ()  # x [T, *lead, F] with done [T, *lead]
        done = term
        if name == "eligibility_traces":
            kw.update(gamma=rng.uniform(0.8, 1.0), lmbda=rng.uniform(0.5, 1.0))
        if rng.random() < 0.7:
            kw["init"] = data(LEAD + feat)
        return (data(shape + feat), done), kw, shape + feat
    if name == "linear_recurrence":
        kw["reverse"] = rng.random() < 0.5
        if rng.random() < 0.7:
            kw["init"] = data(LEAD)
        beta = uniform(gen, shape, 0.3, 1.0, torch.float64).to(dtype).to(dev)
        return (data(), beta), kw, shape
    raise AssertionError(name)


def _poisoned(shape, dtype, dev, layout, td):
    """(out tensor, the buffer it views): NaN everywhere, in ``layout``."""
    if layout == "contiguous":
        buf = torch.full(shape, float("nan"), dtype=dtype, device=dev)
        return buf, buf
    tdp = td % len(shape)
    if layout == "transposed":  # time moved to the other end in memory: non-contiguous
        other = len(shape) - 1 if tdp == 0 else 0
        buf = torch.full(shape, float("nan"), dtype=dtype, device=dev).movedim(tdp, other)
        buf = buf.contiguous()
        return buf.movedim(other, tdp), buf
    if layout == "strided":  # every other element along time
        big = list(shape)
        big[tdp] *= 2
        buf = torch.full(big, float("nan"), dtype=dtype, device=dev)
        return buf[tuple(slice(None, None, 2) if i == tdp else slice(None)
                         for i in range(len(big)))], buf
    if layout == "unmergeable":  # the two lead (or trailing) axes permuted: no single stride
        a, b = (0, 1) if td == -1 else (1, 2)
        perm = list(shape)
        perm[a], perm[b] = perm[b], perm[a]
        buf = torch.full(perm, float("nan"), dtype=dtype, device=dev)
        return buf.transpose(a, b), buf
    raise AssertionError(layout)


# (out layout of each output, data dtype, out dtype)
OUTS = {
    "contiguous": (("contiguous", "contiguous"), torch.float32, torch.float32),
    "transposed_f64_out": (("transposed", "transposed"), torch.float32, torch.float64),
    "strided": (("strided", "strided"), torch.float32, torch.float32),
    "unmergeable_f64_out": (("unmergeable", "unmergeable"), torch.float32, torch.float64),
    "mixed_layouts": (("contiguous", "transposed"), torch.float32, torch.float32),
    "bf16_data_f32_out": (("contiguous", "strided"), torch.bfloat16, torch.float32),
    "f64_data_f32_out": (("transposed", "contiguous"), torch.float64, torch.float32),
}


def _check_values(got, want, expected, data_dtype, out_dtype, ctx):
    """``got`` (in out_dtype) against the call without out (``want``) and the float64
    reference (``expected``, or None)."""
    assert got.dtype == out_dtype and got.shape == want.shape, ctx
    if out_dtype == data_dtype and got.device.type != "cuda":
        assert torch.equal(got, want), f"{ctx}: differs from the call without out"
    elif out_dtype == data_dtype:
        # on the GPU another out layout is another kernel specialisation, whose code may
        # contract multiply-adds differently (seen: 1-ulp differences in V-trace's pg)
        eps = 8 * torch.finfo(out_dtype).eps
        scale = max(1.0, want.double().abs().max().item())
        torch.testing.assert_close(got, want, rtol=eps, atol=eps * scale,
                                   msg=f"{ctx}: differs from the call without out")
    else:
        coarse = out_dtype if TOL[out_dtype] > TOL[data_dtype] else data_dtype
        tol = TOL[coarse] * max(1.0, want.double().abs().max().item())
        err = (got.double() - want.double()).abs().max().item()
        assert err <= 2 * tol, f"{ctx}: {err} from the call without out"
    if expected is not None:
        # fp32 accumulation in the kernel: an f32/f64 out of low-precision data is f32-accurate
        acc = out_dtype if out_dtype != torch.float64 else data_dtype
        if data_dtype != torch.float64 and acc == torch.float64:
            acc = torch.float32
        tol = TOL[acc] * max(1.0, expected.abs().max().item())
        err = (got.detach().cpu().double() - expected).abs().max().item()
        assert err <= 2 * tol, f"{ctx}: {err} from the float64 reference"


@pytest.mark.parametrize("out_kind", list(OUTS))
@pytest.mark.parametrize("td", [-1, 0])
@pytest.mark.parametrize("name", NAMES)
def test_out_matches_and_is_returned(name, td, out_kind, impl, gen):
    layouts, dtype, out_dtype = OUTS[out_kind]
    dev = impl.device
    args, kw, shape = _case(name, gen, td, dtype, dev)
    fn = getattr(rc, name)
    want = fn(*args, **kw)
    want = want if isinstance(want, tuple) else (want,)
    n = 2 if name in TWO_OUT else 1
    made = [_poisoned(shape, out_dtype, dev, layouts[k], td) for k in range(n)]
    outs = tuple(o for o, _ in made)
    got = fn(*args, **kw, out=outs if n == 2 else outs[0])
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == n
    if name == "retrace_from_actions":
        expected = (None,)
    else:
        cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
        expected = getattr(ref, name)(*cpu, **{k: (v.cpu() if isinstance(v, torch.Tensor)
                                                   else v) for k, v in kw.items()})
        expected = expected if isinstance(expected, tuple) else (expected,)
    for k in range(n):
        ctx = f"{name} out[{k}] ({out_kind}, time_dim={td}, {impl.name})"
        assert got[k] is outs[k], f"{ctx}: not the caller's tensor"
        _check_values(got[k], want[k], expected[k], dtype, out_dtype, ctx)
        out, buf = made[k]
        # every element of out written; nothing around it (the strided buffer's gaps)
        assert not out.isnan().any(), ctx
        assert buf.isnan().sum().item() == buf.numel() - out.numel(), ctx


@pytest.mark.parametrize("name", NAMES)
def test_out_reused_in_a_loop(name, impl, gen, monkeypatch):
    """The hot loop: one out reused for fresh data of the same layout; each call
    overwrites it. On CUDA the later calls are the cached launch (no new plan)."""
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    fn = getattr(rc, name)
    n = 2 if name in TWO_OUT else 1
    args, kw, shape = _case(name, gen, -1, torch.float32, impl.device)
    outs = tuple(torch.full(shape, float("nan"), device=impl.device) for _ in range(n))
    plans = []
    for _ in range(3):
        # fresh values in place (float flags too: both calls below see the same inputs)
        for t in (*args, *kw.values()):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.mul_(torch.rand(t.shape, generator=gen).to(t.device) + 0.5)
        got = fn(*args, **kw, out=outs if n == 2 else outs[0])
        want = fn(*args, **kw)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w, o in zip(got, want, outs):
            assert g is o and torch.equal(g, w)
        plans.append(len(python_plans()))
    assert plans[0] == plans[-1]
    if (impl.device.type == "cuda" and _config.current_tuning().cached_launch
            and _dispatch._replay_ok):
        # one scan plan without out, one with; retrace_from_actions also keeps its pass
        # over the actions' plan for each (out is part of its key)
        assert plans[0] == 2 + 2 * (name == "retrace_from_actions")


# ------------------------------------------------------------------------ bad out


def _z(*shape, dtype=torch.float32, dev="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=dev)


# id: (estimator: 'gae' (two outputs) or 'linrec' (one), out as a function of (device,
#      the call's input tensors), exception)
BAD = {
    "one_out_tuple": ("linrec", lambda d, ins: (_z(3, 7, dev=d),), TypeError),
    "one_out_list": ("linrec", lambda d, ins: [_z(3, 7, dev=d)], TypeError),
    "one_out_number": ("linrec", lambda d, ins: 0.0, TypeError),
    "two_out_single_tensor": ("gae", lambda d, ins: _z(3, 7, dev=d), TypeError),
    "two_out_three_tensors": ("gae", lambda d, ins: (_z(3, 7, dev=d),) * 3, TypeError),
    "two_out_second_not_tensor": ("gae", lambda d, ins: (_z(3, 7, dev=d), None), TypeError),
    "int_dtype": ("linrec", lambda d, ins: _z(3, 7, dtype=torch.int32, dev=d), TypeError),
    "bool_dtype": ("gae", lambda d, ins: (_z(3, 7, dev=d), _z(3, 7, dtype=torch.bool, dev=d)),
                   TypeError),
    "complex_dtype": ("linrec", lambda d, ins: _z(3, 7, dtype=torch.complex64, dev=d),
                      TypeError),
    "wrong_shape": ("linrec", lambda d, ins: _z(3, 8, dev=d), ValueError),
    "broadcastable_shape": ("linrec", lambda d, ins: _z(1, 7, dev=d), ValueError),
    "wrong_shape_second": ("gae", lambda d, ins: (_z(3, 7, dev=d), _z(7, 3, dev=d)),
                           ValueError),
    "expanded": ("linrec", lambda d, ins: _z(3, 1, dev=d).expand(3, 7), ValueError),
    "is_an_input": ("linrec", lambda d, ins: ins[0], ValueError),
    "views_an_input": ("gae", lambda d, ins: (_z(3, 7, dev=d), ins[1][:, :]), ValueError),
    "overlaps_init": ("linrec", lambda d, ins: ins[3][2:23].view(3, 7), ValueError),
    "is_the_float_flags": ("gae", lambda d, ins: (_z(3, 7, dev=d), ins[3]), ValueError),
    "overlaps_bootstrap_value": ("gae", lambda d, ins: (ins[5][1:22].view(3, 7), _z(3, 7, dev=d)),
                                 ValueError),
    "outputs_overlap": ("gae", lambda d, ins: (lambda o: (o, o))(_z(3, 7, dev=d)), ValueError),
    "outputs_partly_overlap": ("gae", lambda d, ins: (lambda b: (b[:3], b[2:5]))(
        _z(5, 7, dev=d)), ValueError),
}


def _bad_call(which, dev, make_out):
    """gae (two outputs) or linear_recurrence (one) with ``out=make_out(device, inputs)``;
    some inputs are views into a bigger buffer (the last of ``inputs``), next to which
    an out may lie (fine) or overlap them (an error)."""
    if which == "gae":
        r = torch.randn(3, 7, device=dev)
        v = torch.randn(3, 7, device=dev)
        term = torch.zeros(3, 7, dtype=torch.bool, device=dev)
        trunc = torch.zeros(3, 7, device=dev)  # float flags
        buf = torch.zeros(3 + 21, device=dev)
        boot = buf[:3]
        return rc.gae(r, v, term, trunc, bootstrap_value=boot,
                      out=make_out(dev, (r, v, term, trunc, boot, buf)), time_dim=-1)
    a = torch.randn(3, 7, device=dev)
    b = torch.rand(3, 7, device=dev)
    buf = torch.zeros(3 + 21, device=dev)
    init = buf[:3]
    return rc.linear_recurrence(a, b, init=init, out=make_out(dev, (a, b, init, buf)), time_dim=-1)


def test_enough_bad_out_cases():
    assert len(BAD) >= 15


@pytest.mark.parametrize("which", ["gae", "linrec"])
def test_bad_out_controls_run(which, impl):
    """The valid version of the bad cases runs (each bad case breaks one thing)."""
    if which == "gae":  # out[0] right after bootstrap_value in its buffer
        got = _bad_call("gae", impl.device, lambda d, ins: (ins[-1][3:].view(3, 7),
                                                             _z(3, 7, dev=d)))
        assert got[0].shape == (3, 7) and torch.isfinite(got[0]).all()
    else:  # out right after init in its buffer
        got = _bad_call("linrec", impl.device, lambda d, ins: ins[-1][3:].view(3, 7))
        assert got.shape == (3, 7) and torch.isfinite(got).all()


@pytest.mark.parametrize("case", list(BAD))
def test_bad_out_names_out(case, impl):
    which, make, exc = BAD[case]
    with pytest.raises(exc, match=r"\bout\b|out\[[01]\]"):
        _bad_call(which, impl.device, make)


def test_wrong_device_names_out(impl):
    if impl.device.type != "cuda":
        pytest.skip("needs CUDA tensors")
    with pytest.raises(ValueError, match="out"):
        _bad_call("linrec", impl.device, lambda d, ins: _z(3, 7))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("who", ["input", "out"])
def test_out_with_autograd_raises(name, who, impl, gen):
    fn = getattr(rc, name)
    args, kw, shape = _case(name, gen, -1, torch.float32, impl.device)
    n = 2 if name in TWO_OUT else 1
    outs = tuple(torch.empty(shape, device=impl.device) for _ in range(n))
    if who == "input":
        data = 1 if name in ("gae", "lambda_returns", "vtrace", "retrace") else 0
        args = list(args)
        args[data] = args[data].clone().requires_grad_()
    else:
        outs = tuple(o.requires_grad_() for o in outs)
    out = outs if n == 2 else outs[0]
    with pytest.raises(RuntimeError, match="out=.*automatic differentiation"):
        fn(*args, **kw, out=out)
    with torch.no_grad():  # without grad mode it is an ordinary call
        got = fn(*args, **kw, out=out)
    assert (got if n == 2 else (got,))[0] is outs[0]


# ------------------------------------------------------------------------ torch.compile


def _step(r, v, term, trunc, boot, adv, tgt, lam, h):
    a, t = rc.gae(r, v, term, trunc, bootstrap_value=boot, gamma=0.97, lmbda=0.9,
                  out=(adv, tgt), time_dim=-1)
    lam_ = rc.lambda_returns(r, v, term, trunc, bootstrap_value=boot, out=lam, time_dim=-1)
    h_ = rc.linear_recurrence(r, torch.sigmoid(v), reverse=False, out=h, time_dim=-1)
    return (a * 2).sum() + t.mean() + lam_.sum() + h_.sum(), (a, t, lam_, h_)


def test_out_under_torch_compile(monkeypatch):
    """Traced with out= (fullgraph): the op stays functional and its result is copied
    into out; the compiled step fills the caller's tensors with the eager numbers."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    torch._dynamo.reset()
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    g = torch.Generator().manual_seed(0)
    for _ in range(2):  # the second call reuses the graph on fresh data
        r, v = torch.randn(3, 20, generator=g), torch.randn(3, 20, generator=g)
        term, trunc = torch.rand(3, 20, generator=g) < 0.1, torch.rand(3, 20, generator=g) < 0.1
        boot = torch.randn(3, generator=g)
        outs = [torch.full((3, 20), float("nan")) for _ in range(3)]
        outs.append(torch.full((20, 3), float("nan"), dtype=torch.float64).T)
        loss, returned = compiled(r, v, term, trunc, boot, *outs)
        assert all(o is p for o, p in zip(returned, outs))  # the caller's tensors
        want_outs = [torch.empty((3, 20)) for _ in range(3)] + [torch.empty((3, 20),
                                                                           dtype=torch.float64)]
        want, _ = _step(r, v, term, trunc, boot, *want_outs)
        torch.testing.assert_close(loss, want)
        for o, w in zip(outs, want_outs):  # the f64 out: eager computes in f64 on the CPU path
            torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------ cached launch


@pytest.mark.parametrize("name", ["gae", "vtrace", "lambda_returns", "episodic_cumsum",
                                  "linear_recurrence"])
def test_cached_plan_writes_into_out(name, gen, monkeypatch, captured_launches, tuned):
    """The cached launch (CUDA; replayed here on the CPU with the launch captured) hands
    the kernel the caller's out tensors, allocates none, and is keyed on their layout."""
    full_args, plan_args = captured_launches.full, captured_launches.replayed
    fn = getattr(rc, name)
    n = 2 if name in TWO_OUT else 1

    def fresh_out(shape, kind="transposed"):
        return tuple(_poisoned(shape, torch.float64, "cpu", kind, -1)[0] for _ in range(n))

    args, kw, shape = _case(name, gen, -1, torch.float32, "cpu")
    out = fresh_out(shape)
    fn(*args, **kw, out=out if n == 2 else out[0])  # full path: records the plan
    assert len(full_args) == 1 and len(_dispatch._PLANS) == 1
    assert full_args[0][0] is out[0]
    assert full_args[0][1] is (out[1] if n == 2 else None)  # one output: OUT1 is None

    out2 = fresh_out(shape)  # same layout, other memory: replayed into out2
    allocs = []
    real = {f: getattr(torch, f) for f in ("empty", "empty_like", "empty_strided")}
    for f, r in real.items():
        monkeypatch.setattr(torch, f, lambda *a, _r=r, **k: allocs.append(a) or _r(*a, **k))
    got = fn(*args, **kw, out=out2 if n == 2 else out2[0])
    for f, r in real.items():
        monkeypatch.setattr(torch, f, r)
    assert len(plan_args) == 1 and len(full_args) == 1, "not replayed from the plan"
    assert not allocs, "the cached launch allocated although out= was given"
    got = got if isinstance(got, tuple) else (got,)
    assert all(g is o for g, o in zip(got, out2))
    assert plan_args[0][0] is out2[0]
    assert plan_args[0][1] is (out2[1] if n == 2 else None)
    # the replayed argument list is the full path's for the same call
    tuned(cached_launch=False)
    fn(*args, **kw, out=out2 if n == 2 else out2[0])
    want = full_args[1]
    user = [t for t in (*args, *kw.values(), *out2) if isinstance(t, torch.Tensor)]
    assert len(want) == len(plan_args[0])
    for pos, (w, g) in enumerate(zip(want, plan_args[0])):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype, pos
            if pos < 2 or any(w.data_ptr() == a.data_ptr() for a in user):
                assert g.data_ptr() == w.data_ptr(), pos
        else:
            assert type(g) is type(w) and g == w, (pos, g, w)


def test_cached_plan_is_keyed_on_out(gen, monkeypatch, tuned):
    """Another out layout or dtype, an out that now overlaps an input, or no out: not the
    recorded plan (a new one, or the full path that raises)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(cpu_plans=True)
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    replays = []
    monkeypatch.setattr(_tl.Replay, "__call__",
                        lambda self, args: replays.append(args) or True)
    a = torch.randn(3, 16, generator=gen)
    b = torch.rand(3, 16, generator=gen)
    rc.linear_recurrence(a, b, out=torch.empty(3, 16), time_dim=-1)
    assert len(_dispatch._PLANS) == 1
    rc.linear_recurrence(a, b, out=torch.empty(16, 3).T, time_dim=-1)  # other strides
    rc.linear_recurrence(a, b, out=torch.empty(3, 16, dtype=torch.float64),
                         time_dim=-1)  # other dtype
    rc.linear_recurrence(a, b, time_dim=-1)  # no out
    assert len(_dispatch._PLANS) == 4 and not replays
    rc.linear_recurrence(a, b, out=torch.empty(3, 16), time_dim=-1)
    assert len(replays) == 1
    buf = torch.empty(2, 3, 16)
    a2 = buf[0]
    a2.copy_(a)
    with pytest.raises(ValueError, match="out"):  # the plan's key matches; its check does not
        rc.linear_recurrence(a2, b, out=a2, time_dim=-1)
    with pytest.raises(ValueError, match="out"):
        rc.linear_recurrence(a2, b, out=buf.view(-1)[8:56].view(3, 16), time_dim=-1)
    assert len(replays) == 1
    rc.linear_recurrence(a2, b, out=buf[1], time_dim=-1)  # adjacent, not overlapping: replayed
    assert len(replays) == 2 and replays[1][0] is not None
