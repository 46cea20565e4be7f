"""Integer and bool data: a TypeError that names the argument, as for mixed float dtypes.

Data (rewards, values, next values, bootstrap values, log ratios, x, init, alpha, beta)
must be floating point; only flags (terminated, truncated, done, mask) may be bool or
integer, and they keep their rule: nonzero means set, whatever the dtype. Every row of
rl_triton_core._table.TABLE is covered, plus retrace_from_actions and the token and
group functions."""

import inspect

import pytest
import torch

import rl_triton_core as rc
from rl_triton_core._table import TABLE

B, T = 3, 8
INT_DTYPES = [torch.int64, torch.int32, torch.bool, torch.uint8]
FLAG_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32]
FLAGS = ("terminated", "truncated", "done")
NOTIME = ("bootstrap_value", "init")  # one value per stream: [B]


@pytest.fixture
def cpu(impl):
    if impl.is_interp:
        pytest.skip("the checks are the backends' shared front door: the CPU path covers them")
    return impl.device


def _tensor(name, dev, gen, dtype=torch.float32):
    shape = (B,) if name in NOTIME else (B, T)
    if name in FLAGS:
        t = torch.rand(shape, generator=gen) < 0.3
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=gen) * 0.5
        if name == "beta":
            t = t.abs().clamp(max=0.9)
    elif dtype == torch.bool:
        t = torch.rand(shape, generator=gen) < 0.5
    else:
        t = torch.randint(0, 3, shape, generator=gen)
    return t.to(dtype).to(dev)


def _args(spec, dev, gen, *, with_optional=()):
    """Valid arguments of one estimator: its required inputs and ``with_optional``."""
    params = inspect.signature(getattr(rc, spec.name)).parameters
    names = [n for n in spec.inputs if n in spec.required or n in with_optional
             or params[n].default is inspect.Parameter.empty]
    return {n: _tensor(n, dev, gen) for n in names}


def _call(spec, args):
    fn = getattr(rc, spec.name)
    kw = dict(args)
    if spec.checks == "forward":
        return fn(kw.pop("x"), kw.pop("done"), time_dim=1, **kw)
    return fn(**kw, time_dim=1)


def _data_cases():
    for name, spec in TABLE.items():
        for arg in spec.inputs:
            if arg not in FLAGS:
                yield pytest.param(name, arg, id=f"{name}-{arg}")


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("name,arg", list(_data_cases()))
def test_integer_data_raises_naming_it(name, arg, dtype, cpu, gen):
    spec = TABLE[name]
    args = _args(spec, cpu, gen, with_optional=(arg,))
    _call(spec, args)  # the float version runs
    args[arg] = _tensor(arg, cpu, gen, dtype)
    keep = {k: v.clone() for k, v in args.items()}
    with pytest.raises(TypeError, match=rf"^{arg} must be a float tensor.*{dtype}"):
        _call(spec, args)
    for k, v in args.items():  # inputs never modified
        assert torch.equal(v, keep[k])


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_data_raises_with_float_data_beside_it(dtype, cpu, gen):
    """Not only where every data tensor is an integer: one among float ones."""
    r, v, te = (_tensor(n, cpu, gen) for n in ("rewards", "values", "terminated"))
    with pytest.raises(TypeError, match="^values must be a float tensor"):
        rc.gae(r, v.to(dtype), te, time_dim=1)
    with pytest.raises(TypeError, match="^rewards must be a float tensor"):
        rc.gae(r.to(dtype), v, te, time_dim=1)
    with pytest.raises(TypeError, match="^rewards must be a float tensor"):
        rc.gae(r.to(dtype), v.double(), te, time_dim=1)


def test_integer_data_raises_with_grad_and_after_a_cached_call(cpu, gen):
    """The autograd path and the cached launch (a float call first) raise the same."""
    r, v, te = (_tensor(n, cpu, gen) for n in ("rewards", "values", "terminated"))
    rc.gae(r, v, te, time_dim=1)
    rc.gae(r, v, te, time_dim=1)
    with pytest.raises(TypeError, match="^rewards must be a float tensor"):
        rc.gae(r.long(), v, te, time_dim=1)
    with pytest.raises(TypeError, match="^rewards must be a float tensor"):
        rc.gae(r.long(), v.requires_grad_(True), te, time_dim=1)


@pytest.mark.parametrize("dtype", FLAG_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(TABLE))
def test_flags_of_any_integer_dtype_still_run(name, dtype, cpu, gen):
    """Flags keep their rule: bool, integer or float, nonzero means set (2 and -1 too)."""
    spec = TABLE[name]
    flags = [n for n in spec.inputs if n in FLAGS]
    args = _args(spec, cpu, gen, with_optional=flags)
    want = _call(spec, args)
    for n in flags:
        set_ = args[n].bool()
        odd = torch.full(set_.shape, 2 if dtype != torch.bool else 1, dtype=dtype, device=cpu)
        if dtype.is_signed and dtype != torch.bool:
            odd[..., ::2] = -1
        args[n] = torch.where(set_, odd, torch.zeros_like(odd))
    got = _call(spec, args)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("arg", ["q_values", "rewards", "target_probs", "behaviour_log_probs"])
def test_retrace_from_actions_integer_data(arg, dtype, cpu, gen):
    A = 4
    args = dict(q_values=torch.randn(B, T, A, generator=gen),
                target_probs=torch.softmax(torch.randn(B, T, A, generator=gen), -1),
                actions=torch.randint(0, A, (B, T), generator=gen),
                behaviour_log_probs=-torch.rand(B, T, generator=gen),
                rewards=torch.randn(B, T, generator=gen),
                terminated=torch.rand(B, T, generator=gen) < 0.3)
    args = {k: v.to(cpu) for k, v in args.items()}
    rc.retrace_from_actions(**args, time_dim=1)
    args[arg] = args[arg].to(dtype)
    with pytest.raises(TypeError, match=f"^{arg} must be a float tensor"):
        rc.retrace_from_actions(**args, time_dim=1)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_token_and_group_functions_integer_data(dtype, cpu, gen):
    r, v = torch.randn(B, T, generator=gen).to(cpu), torch.randn(B, T, generator=gen).to(cpu)
    mask = torch.randint(0, 2, (B, T), generator=gen).to(cpu)
    for fn, args, name in (
            (rc.masked_gae, (r.to(dtype), v, mask), "rewards"),
            (rc.masked_gae, (r, v.to(dtype), mask), "values"),
            (rc.masked_returns, (r.to(dtype), mask), "rewards"),
            (rc.masked_whiten, (r.to(dtype), mask), "x")):
        with pytest.raises(TypeError, match=f"^{name} must be a float tensor"):
            fn(*args, **({} if fn is rc.masked_whiten else {"time_dim": -1}))
    with pytest.raises(TypeError, match="^scores must be a float tensor"):
        rc.group_advantages(r[:, 0].to(dtype), torch.tensor([0, 0, 1], device=cpu))
    for m in (mask.bool(), mask.to(torch.uint8), mask.int(), mask.float()):  # flags: any kind
        rc.masked_gae(r, v, m, time_dim=-1)
