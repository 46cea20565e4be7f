"""The functional drop-ins give TorchRL's numbers, with TorchRL's signatures and conventions."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("torchrl")

import rl_triton_torchrl  # noqa: E402
import torchrl.objectives.value.functional as trl  # noqa: E402
from rl_triton_torchrl import functional as ours  # noqa: E402
from torchrl_testlib import DEVICES, assert_close, data, flags, per_step_gamma  # noqa: E402

# name -> the tensors it takes after the coefficients, in TorchRL's order
ARGS = {
    "generalized_advantage_estimate": "gl V NV R D T",
    "vec_generalized_advantage_estimate": "gl V NV R D T",
    "td1_return_estimate": "g NV R D T",
    "vec_td1_return_estimate": "g NV R D T",
    "td1_advantage_estimate": "g V NV R D T",
    "vec_td1_advantage_estimate": "g V NV R D T",
    "td_lambda_return_estimate": "gl NV R D T",
    "vec_td_lambda_return_estimate": "gl NV R D T",
    "td_lambda_advantage_estimate": "gl V NV R D T",
    "vec_td_lambda_advantage_estimate": "gl V NV R D T",
    "vtrace_advantage_estimate": "g LP LM V NV R D T",
}
NAMES = tuple(ARGS)


def call(fn, name, gamma, lmbda, tensors, **kwargs):
    """Call ``fn`` (ours or TorchRL's ``name``) with TorchRL's positional order."""
    spec = ARGS[name].split()
    coefs = [gamma, lmbda] if spec[0] == "gl" else [gamma]
    return fn(*coefs, *(tensors[k] for k in spec[1:]), **kwargs)


def make(gen, batch, T, dtype, device, feat=(1,)):
    shape = (*batch, T, *feat)
    v, nv, r, done, term = data(gen, shape, dtype, device)
    lp = (0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype).to(device)
    lm = (0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype).to(device)
    return {"V": v, "NV": nv, "R": r, "D": done, "T": term, "LP": lp, "LM": lm}


# ------------------------------------------------------------------ API surface


def test_exports_every_torchrl_function():
    assert set(trl.__all__) <= set(ours.__all__)
    for name in trl.__all__:
        assert getattr(rl_triton_torchrl, name) is getattr(ours, name)
    assert set(ours.REPLACED) == set(ARGS)


@pytest.mark.parametrize("name", NAMES)
def test_signature_is_torchrl(name):
    mine = inspect.signature(getattr(ours, name), follow_wrapped=False)
    theirs = inspect.signature(getattr(trl, name))  # TorchRL's, through its time wrapper
    assert list(mine.parameters) == list(theirs.parameters)
    for p, q in zip(mine.parameters.values(), theirs.parameters.values(), strict=True):
        assert (p.kind, p.default) == (q.kind, q.default), name
    assert getattr(ours, name).__wrapped__ is getattr(trl, name)


# ----------------------------------------------------------- same numbers as TorchRL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("gamma_kind", ["scalar", "tensor"])
@pytest.mark.parametrize("T", [1, 3, 5, 200])
@pytest.mark.parametrize("batch", [(), (3,), (7, 3)], ids=["B()", "B3", "B7x3"])
@pytest.mark.parametrize("name", NAMES)
def test_matches_torchrl(name, batch, T, gamma_kind, dtype, device, gen):
    x = make(gen, batch, T, dtype, device)
    if gamma_kind == "scalar":
        gamma = 0.97
    else:
        gamma = per_step_gamma(gen, (*batch, T, 1), dtype, device)
    lmbda = 0.9
    expected = call(getattr(trl, name), name, gamma, lmbda, x)
    got = call(getattr(ours, name), name, gamma, lmbda, x)
    assert_close(got, expected, dtype)


@pytest.mark.parametrize("name", NAMES)
def test_tensor_coefficients_0d(name, gen):
    """The modules pass gamma and lmbda as 0-d buffers."""
    x = make(gen, (4,), 30, torch.float32, "cpu")
    gamma, lmbda = torch.tensor(0.95), torch.tensor(0.8)
    assert_close(call(getattr(ours, name), name, gamma, lmbda, x),
                 call(getattr(trl, name), name, gamma, lmbda, x))


@pytest.mark.parametrize("name", [n for n in NAMES if "lambda" in n])
def test_per_step_lambda(name, gen):
    if name.startswith("vec_"):
        pytest.skip("TorchRL's vectorized TD(lambda) takes a scalar lambda only")
    x = make(gen, (3,), 40, torch.float64, "cpu")
    lmbda = per_step_gamma(gen, (3, 40, 1), torch.float64, "cpu", lo=0.5, hi=1.0)
    assert_close(call(getattr(ours, name), name, 0.95, lmbda, x),
                 call(getattr(trl, name), name, 0.95, lmbda, x))


@pytest.mark.parametrize("name", NAMES)
def test_terminated_defaults_to_done(name, gen):
    x = make(gen, (5,), 20, torch.float32, "cpu")
    x["T"] = None
    spec = ARGS[name].split()[1:]
    args = [0.95, 0.9] if ARGS[name].startswith("gl") else [0.95]

    def run(fn):
        return fn(*args, *(x[k] for k in spec[:-1]))  # terminated left out

    assert_close(run(getattr(ours, name)), run(getattr(trl, name)))


@pytest.mark.parametrize(
    "shape, time_dim",
    [
        ((4, 25, 3), -2),     # [B, T, F]: features trailing
        ((4, 25, 2, 3), -3),  # [B, T, F1, F2]
        ((2, 25, 3, 2), 1),   # positive time_dim
        ((4, 3, 25), -1),     # time last
        ((25,), -1),          # one stream, no feature axis
        ((25, 4), 0),         # time-major
    ],
)
@pytest.mark.parametrize("name", NAMES)
def test_time_dim_and_features(name, shape, time_dim, gen):
    feat_shape = shape
    v, nv, r, done, term = data(gen, feat_shape, torch.float64)
    x = {"V": v, "NV": nv, "R": r, "D": done, "T": term,
         "LP": 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64),
         "LM": 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)}
    expected = call(getattr(trl, name), name, 0.97, 0.9, x, time_dim=time_dim)
    got = call(getattr(ours, name), name, 0.97, 0.9, x, time_dim=time_dim)
    assert_close(got, expected)


@pytest.mark.parametrize("name", NAMES)
def test_two_trajectories_concatenated_equal_the_halves(name, gen):
    """A rollout whose first part ends with done is the two parts computed apart."""
    a = make(gen, (3,), 17, torch.float64, "cpu")
    b = make(gen, (3,), 11, torch.float64, "cpu")
    a["D"][..., -1, :] = True  # the first trajectory ends (terminated or truncated)
    both = {k: torch.cat([a[k], b[k]], dim=-2) for k in a}
    whole = call(getattr(ours, name), name, 0.97, 0.9, both)
    left = call(getattr(ours, name), name, 0.97, 0.9, a)
    right = call(getattr(ours, name), name, 0.97, 0.9, b)
    if isinstance(whole, tuple):
        for w, lft, rgt in zip(whole, left, right, strict=True):
            assert_close(w, torch.cat([lft, rgt], dim=-2))
    else:
        assert_close(whole, torch.cat([left, right], dim=-2))


def test_truncation_bootstraps_from_next_value():
    """done without terminated: the value of the true next state is the bootstrap."""
    r = torch.tensor([1.0, 1.0, 1.0, 1.0]).unsqueeze(-1)
    v = torch.zeros(4, 1)
    nv = torch.tensor([0.0, 10.0, 0.0, 0.0]).unsqueeze(-1)
    done = torch.tensor([False, True, False, False]).unsqueeze(-1)
    term = torch.zeros(4, 1, dtype=torch.bool)
    adv, _ = ours.generalized_advantage_estimate(0.5, 1.0, v, nv, r, done, term)
    # step 1: 1 + 0.5 * 10; step 0: 1 + 0.5 * 6 (the trace stops at the truncation, not V')
    assert adv[:2, 0].tolist() == [4.0, 6.0]
    assert_close(adv, trl.generalized_advantage_estimate(0.5, 1.0, v, nv, r, done, term)[0])


# ----------------------------------------------------------- TorchRL's own paths


@pytest.mark.parametrize("name", ["td1_return_estimate", "td_lambda_return_estimate",
                                  "td1_advantage_estimate", "td_lambda_advantage_estimate"])
def test_rolling_gamma_false_is_torchrl(name, gen):
    x = make(gen, (2,), 12, torch.float64, "cpu")
    gamma = per_step_gamma(gen, (2, 12, 1), torch.float64)
    assert_close(call(getattr(ours, name), name, gamma, 0.9, x, rolling_gamma=False),
                 call(getattr(trl, name), name, gamma, 0.9, x, rolling_gamma=False))


@pytest.mark.parametrize("name", ["vec_td1_return_estimate", "vec_td_lambda_return_estimate"])
def test_rolling_gamma_false_vectorized_raises_like_torchrl(name, gen):
    x = make(gen, (2,), 12, torch.float64, "cpu")
    gamma = per_step_gamma(gen, (2, 12, 1), torch.float64)
    with pytest.raises(NotImplementedError):
        call(getattr(ours, name), name, gamma, 0.9, x, rolling_gamma=False)


@pytest.mark.parametrize("name", NAMES)
def test_shape_mismatch_raises_like_torchrl(name, gen):
    x = make(gen, (2,), 6, torch.float32, "cpu")
    x["R"] = x["R"][:, :5]
    with pytest.raises(RuntimeError, match="must share a unique shape"):
        call(getattr(ours, name), name, 0.9, 0.9, x)


@pytest.mark.parametrize("name", ["generalized_advantage_estimate", "td_lambda_return_estimate"])
def test_bad_time_dim_raises_like_torchrl(name, gen):
    x = make(gen, (2,), 6, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="time dimension are not compatible"):
        call(getattr(ours, name), name, 0.9, 0.9, x, time_dim=-4)


@pytest.mark.parametrize("name", NAMES)
def test_inputs_not_modified(name, gen):
    x = make(gen, (3,), 9, torch.float32, "cpu")
    before = {k: t.clone() for k, t in x.items()}
    call(getattr(ours, name), name, 0.9, 0.9, x)
    for k in x:
        assert torch.equal(x[k], before[k]), k


# --------------------------------------------------------------------- autograd


@pytest.mark.parametrize("name", NAMES)
def test_gradients_reach_rewards(name, gen):
    """differentiable use: the core's backward gives TorchRL's gradients."""
    x = make(gen, (3,), 15, torch.float64, "cpu")
    weights = torch.randn(3, 15, 1, generator=gen, dtype=torch.float64)
    grads = []
    for module in (ours, trl):
        r = x["R"].clone().requires_grad_(True)
        out = call(getattr(module, name), name, 0.95, 0.9, {**x, "R": r})
        out = out[0] if isinstance(out, tuple) else out
        (out * weights).sum().backward()
        grads.append(r.grad)
    assert_close(grads[0], grads[1])


@pytest.mark.parametrize("name", NAMES)
def test_gradients_to_the_data_run_in_the_core(name, gen, monkeypatch):
    """rewards, values and next values that require grad: the core's backward runs (not
    TorchRL's function) and gives TorchRL's gradients to each of them."""
    x = make(gen, (3,), 15, torch.float64, "cpu")
    weights = torch.randn(3, 15, 1, generator=gen, dtype=torch.float64)
    data_keys = [k for k in ("V", "NV", "R") if k in ARGS[name].split()]
    grads = []
    for module in (trl, ours):
        leaves = {k: x[k].clone().requires_grad_(True) for k in data_keys}
        out = call(getattr(module, name), name, 0.95, 0.9, {**x, **leaves})
        out = out[0] if isinstance(out, tuple) else out
        (out * weights).sum().backward()
        grads.append({k: t.grad for k, t in leaves.items()})
        if module is trl:  # from here on no TorchRL function may run
            for fn in ours._TORCHRL:
                monkeypatch.setitem(ours._TORCHRL, fn, None)
    for k in data_keys:
        assert_close(grads[1][k], grads[0][k])


@pytest.mark.parametrize("name", NAMES)
def test_gradients_to_the_coefficients_run_torchrl(name, gen):
    """A gamma (or V-trace log-probability) that requires grad: the core holds it
    constant, so TorchRL's function runs and its gradient reaches it."""
    x = make(gen, (3,), 15, torch.float64, "cpu")
    weights = torch.randn(3, 15, 1, generator=gen, dtype=torch.float64)
    grads = []
    for module in (ours, trl):
        gamma = torch.tensor(0.95, dtype=torch.float64, requires_grad=True)
        lp = x["LP"].clone().requires_grad_(True)
        out = call(getattr(module, name), name, gamma, 0.9, {**x, "LP": lp})
        out = out[0] if isinstance(out, tuple) else out
        (out * weights).sum().backward()
        grads.append((gamma.grad, lp.grad))
    assert grads[0][0] is not None and torch.isfinite(grads[0][0])
    assert_close(grads[0][0], grads[1][0])
    if name == "vtrace_advantage_estimate":
        assert_close(grads[0][1], grads[1][1])


def test_no_grad_mode_uses_the_core(gen, monkeypatch):
    """Inputs that require grad under torch.no_grad() need no autograd: the core runs."""
    x = make(gen, (3,), 15, torch.float32, "cpu")
    calls = []
    monkeypatch.setitem(ours._TORCHRL, "generalized_advantage_estimate",
                        lambda *a, **k: calls.append(1))
    r = x["R"].clone().requires_grad_(True)
    with torch.no_grad():
        adv, _ = ours.generalized_advantage_estimate(0.9, 0.9, x["V"], x["NV"], r, x["D"], x["T"])
    assert not calls and not adv.requires_grad


# ------------------------------------------------------------------------ flags


@pytest.mark.parametrize("flag_dtype", [torch.bool, torch.uint8])
def test_flags_given_as_uint8(flag_dtype, gen):
    """TorchRL needs bool flags; the core also reads uint8 (same result for 0/1)."""
    x = make(gen, (3,), 20, torch.float32, "cpu")
    d, t = x["D"].to(flag_dtype), x["T"].to(flag_dtype)
    adv, _ = ours.generalized_advantage_estimate(0.9, 0.9, x["V"], x["NV"], x["R"], d, t)
    expected, _ = trl.generalized_advantage_estimate(0.9, 0.9, x["V"], x["NV"], x["R"], x["D"],
                                                     x["T"])
    assert_close(adv, expected)


def test_all_done_and_none_done(gen):
    shape = (4, 30, 1)
    v, nv, r, _, _ = data(gen, shape)
    for done in (torch.ones(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.bool)):
        for term in (done, torch.zeros(shape, dtype=torch.bool)):
            assert_close(ours.vec_generalized_advantage_estimate(0.99, 0.95, v, nv, r, done, term),
                         trl.generalized_advantage_estimate(0.99, 0.95, v, nv, r, done, term))
            assert_close(ours.vec_td_lambda_return_estimate(0.99, 0.95, nv, r, done, term),
                         trl.td_lambda_return_estimate(0.99, 0.95, nv, r, done, term))


def test_flags_helper_keeps_terminated_in_done(gen):
    done, term = flags(gen, (50, 1))
    assert not (term & ~done).any()


# ------------------------------------------------------ what TorchRL's arithmetic allows


@pytest.mark.parametrize("name", NAMES)
def test_mixed_float_dtypes_are_promoted(name, gen):
    x = make(gen, (3,), 12, torch.float64, "cpu")
    x["R"] = x["R"].float()  # float32 rewards, float64 values
    assert_close(call(getattr(ours, name), name, 0.95, 0.9, x),
                 call(getattr(trl, name), name, 0.95, 0.9, x))


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_cpu_scalar_tensors_with_cuda_data(name, gen):
    x = make(gen, (3,), 12, torch.float32, "cuda")
    gamma, lmbda = torch.tensor(0.95), torch.tensor(0.9)  # 0-d, on the CPU
    assert_close(call(getattr(ours, name), name, gamma, lmbda, x),
                 call(getattr(trl, name), name, gamma, lmbda, x))


@pytest.mark.parametrize(
    "name, core_fn",
    [("vec_generalized_advantage_estimate", "gae"),
     ("generalized_advantage_estimate", "gae"),
     ("td1_return_estimate", "discounted_returns"),
     ("vec_td1_return_estimate", "lambda_returns"),
     ("td_lambda_advantage_estimate", "lambda_returns"),
     ("vec_td_lambda_return_estimate", "lambda_returns"),
     ("vtrace_advantage_estimate", "vtrace")],
)
def test_one_core_call(name, core_fn, gen, monkeypatch):
    import rl_triton_core

    calls = []
    original = getattr(rl_triton_core, core_fn)
    monkeypatch.setattr(rl_triton_core, core_fn,
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    x = make(gen, (3,), 12, torch.float32, "cpu")
    call(getattr(ours, name), name, 0.95, 0.9, x)
    assert calls == [1]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("name", ["vec_generalized_advantage_estimate", "td1_return_estimate",
                                  "td_lambda_advantage_estimate", "vtrace_advantage_estimate"])
def test_integer_reward_as_torchrl_reads_it(name, dtype):
    """An integer (or bool) reward: TorchRL's arithmetic promotes it to the values' float
    dtype, and so do the drop-ins (the core itself takes float data only)."""
    gen = torch.Generator().manual_seed(0)
    B, T = 3, 11
    tensors = dict(V=torch.randn(B, T, 1, generator=gen), NV=torch.randn(B, T, 1, generator=gen),
                   LP=-torch.rand(B, T, 1, generator=gen), LM=-torch.rand(B, T, 1, generator=gen))
    ints = torch.randint(0, 3, (B, T, 1), generator=gen)
    tensors["R"] = ints > 0 if dtype == torch.bool else ints.to(dtype)
    tensors["D"] = torch.rand(B, T, 1, generator=gen) < 0.2
    tensors["T"] = tensors["D"] & (torch.rand(B, T, 1, generator=gen) < 0.5)
    want = call(getattr(trl, name), name, 0.9, 0.8, tensors)
    got = call(getattr(ours, name), name, 0.9, 0.8, tensors)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
