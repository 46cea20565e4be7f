"""Bad input: a ValueError or TypeError whose message names the offending argument.

Each case builds valid inputs, breaks exactly one thing, and checks the exception type
and that the message names the argument. A control test runs every case's valid version
first, so a case cannot pass because its "valid" part was already broken.
"""

import pytest
import torch

import rl_triton_core as rtc

B, T = 3, 7


def _data(dev, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    r = torch.randn(B, T, generator=g).to(dtype).to(dev)
    v = torch.randn(B, T, generator=g).to(dtype).to(dev)
    term = (torch.rand(B, T, generator=g) < 0.2).to(dev)
    return r, v, term


def _gae(dev, **changes):
    """gae with valid defaults; ``changes`` replaces arguments (positional ones by name)."""
    r, v, term = _data(dev)
    a = dict(rewards=r, values=v, terminated=term, truncated=torch.zeros_like(term))
    kw = dict(gamma=0.9, lmbda=0.8, time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.gae(a["rewards"], a["values"], a["terminated"], a["truncated"], **kw)


def _gae_advantages(dev, **changes):
    """gae_advantages (gae's checks, one output) with valid defaults."""
    r, v, term = _data(dev)
    a = dict(rewards=r, values=v, terminated=term)
    kw = dict(gamma=0.9, lmbda=0.8, time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.gae_advantages(a["rewards"], a["values"], a["terminated"], **kw)


def _lambda_returns(dev, **changes):
    r, v, term = _data(dev)
    a = dict(rewards=r, values=v, terminated=term)
    kw = dict(gamma=0.9, lmbda=0.8, time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.lambda_returns(a["rewards"], a["values"], a["terminated"], **kw)


def _discounted(dev, **changes):
    r, _, term = _data(dev)
    a = dict(rewards=r, terminated=term)
    kw = dict(gamma=0.9, bootstrap_value=torch.zeros(B, device=dev), time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.discounted_returns(a["rewards"], a["terminated"], **kw)


def _traces(dev, **changes):
    x = torch.randn(B, T, 4, device=dev)
    a = dict(x=x, done=torch.zeros(B, T, dtype=torch.bool, device=dev))
    kw = dict(gamma=0.9, lmbda=0.8, time_dim=-2, init=torch.zeros(B, 4, device=dev))
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.eligibility_traces(a["x"], a["done"], **kw)


def _cumsum(dev, **changes):
    a = dict(x=torch.randn(B, T, device=dev),
             done=torch.zeros(B, T, dtype=torch.uint8, device=dev))
    kw = dict(init=torch.zeros(B, device=dev), time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.episodic_cumsum(a["x"], a["done"], **kw)


def _linrec(dev, **changes):
    a = dict(alpha=torch.randn(B, T, device=dev), beta=torch.rand(B, T, device=dev))
    kw = dict(reverse=True, init=torch.zeros(B, device=dev), time_dim=-1)
    for k, val in changes.items():
        (a if k in a else kw)[k] = val
    return rtc.linear_recurrence(a["alpha"], a["beta"], **kw)


def both(*names):
    """A regex matching a message that names every one of ``names``."""
    return "(?s)" + "".join(f"(?=.*{n})" for n in names)


Z = torch.zeros
# id: (call, {argument: bad value as a function of the device}, exception, match)
CASES = {
    "rewards_not_tensor": (_gae, dict(rewards=lambda d: [0.0] * T), TypeError, "rewards"),
    "values_shape": (_gae, dict(values=lambda d: Z(B, T + 1, device=d)), ValueError, "values"),
    "values_missing_batch": (_lambda_returns, dict(values=lambda d: Z(T, device=d)), ValueError,
                             "values"),
    "terminated_shape": (_gae, dict(terminated=lambda d: Z(B, T - 2, dtype=torch.bool,
                                                           device=d)), ValueError,
                         "terminated"),
    "terminated_not_tensor": (_lambda_returns, dict(terminated=lambda d: [False] * T),
                              TypeError, "terminated"),
    "truncated_shape": (_gae, dict(truncated=lambda d: Z(B + 1, T, dtype=torch.bool, device=d)),
                        ValueError, "truncated"),
    "next_values_shape": (_gae, dict(next_values=lambda d: Z(B, T - 1, device=d)), ValueError,
                          "next_values"),
    "bootstrap_value_shape": (_gae, dict(bootstrap_value=lambda d: Z(B + 2, device=d)),
                              ValueError, "bootstrap_value"),
    "bootstrap_value_with_time_axis": (_discounted, dict(bootstrap_value=lambda d: Z(B, T, 2,
                                                                                   device=d)),
                                       ValueError, "bootstrap_value"),
    "next_values_and_bootstrap_value": (
        _gae, dict(next_values=lambda d: Z(B, T, device=d),
                   bootstrap_value=lambda d: Z(B, device=d)),
        ValueError, both("next_values", "bootstrap_value")),
    "gamma_above_one": (_gae, dict(gamma=lambda d: 1.01), ValueError, "gamma"),
    "advantages_lmbda_above_one": (_gae_advantages, dict(lmbda=lambda d: 1.5), ValueError,
                                   "lmbda"),
    "advantages_values_shape": (_gae_advantages, dict(values=lambda d: Z(B, T + 1, device=d)),
                                ValueError, "values"),
    "advantages_rewards_int": (_gae_advantages, dict(rewards=lambda d: Z(B, T, dtype=torch.int64,
                                                                        device=d)),
                               TypeError, "rewards"),
    "gamma_negative": (_gae, dict(gamma=lambda d: -0.1), ValueError, "gamma"),
    "gamma_nan": (_lambda_returns, dict(gamma=lambda d: float("nan")), ValueError, "gamma"),
    "gamma_string": (_gae, dict(gamma=lambda d: "0.99"), TypeError, "gamma"),
    "gamma_none": (_discounted, dict(gamma=lambda d: None), TypeError, "gamma"),
    "gamma_tensor_not_broadcastable": (_gae, dict(gamma=lambda d: torch.full((B + 1, 1), 0.9,
                                                                            device=d)),
                                       ValueError, "gamma"),
    "gamma_tensor_complex": (_gae, dict(gamma=lambda d: torch.full((B, T), 0.9,
                                                                   dtype=torch.complex64,
                                                                   device=d)),
                             TypeError, "gamma"),
    "lmbda_above_one": (_gae, dict(lmbda=lambda d: 1.5), ValueError, "lmbda"),
    "lmbda_negative": (_lambda_returns, dict(lmbda=lambda d: -1e-3), ValueError, "lmbda"),
    "lmbda_nan": (_gae, dict(lmbda=lambda d: float("nan")), ValueError, "lmbda"),
    "time_dim_out_of_range": (_gae, dict(time_dim=lambda d: 2), ValueError, "time_dim"),
    "time_dim_out_of_range_negative": (_lambda_returns, dict(time_dim=lambda d: -3), ValueError,
                                       "time_dim"),
    "time_dim_float": (_gae, dict(time_dim=lambda d: 1.0), TypeError, "time_dim"),
    "time_dim_string": (_cumsum, dict(time_dim=lambda d: "-1"), TypeError, "time_dim"),
    "values_complex": (_gae, dict(values=lambda d: Z(B, T, dtype=torch.complex64, device=d)),
                       TypeError, "values"),
    "rewards_complex": (_discounted, dict(rewards=lambda d: Z(B, T, dtype=torch.complex64,
                                                              device=d)),
                        TypeError, "rewards"),
    "terminated_complex": (_gae, dict(terminated=lambda d: Z(B, T, dtype=torch.complex64,
                                                             device=d)),
                           TypeError, "terminated"),
    "truncated_complex": (_gae, dict(truncated=lambda d: Z(B, T, dtype=torch.complex64,
                                                           device=d)),
                          TypeError, "truncated"),
    "values_float64_rewards_float32": (_gae, dict(values=lambda d: Z(B, T, dtype=torch.float64,
                                                                     device=d)),
                                       (TypeError, ValueError), "values"),
    "next_values_float16": (_gae, dict(next_values=lambda d: Z(B, T, dtype=torch.float16,
                                                               device=d)),
                            (TypeError, ValueError), "next_values"),
    "beta_shape": (_linrec, dict(beta=lambda d: torch.rand(B, T + 1, device=d)), ValueError,
                   "beta"),
    "alpha_not_tensor": (_linrec, dict(alpha=lambda d: 1.0), TypeError, "alpha"),
    "reverse_not_bool": (_linrec, dict(reverse=lambda d: "backward"), TypeError, "reverse"),
    "reverse_int": (_linrec, dict(reverse=lambda d: 1), TypeError, "reverse"),
    "linrec_init_shape": (_linrec, dict(init=lambda d: Z(B, T, device=d)), ValueError, "init"),
    "traces_done_not_prefix": (_traces, dict(done=lambda d: Z(B, 4, dtype=torch.bool,
                                                              device=d)),
                               ValueError, "done"),
    "traces_done_longer_than_x": (_traces, dict(done=lambda d: Z(B, T, 4, 2, dtype=torch.bool,
                                                                 device=d)),
                                  ValueError, "done"),
    "traces_done_not_tensor": (_traces, dict(done=lambda d: None), TypeError, "done"),
    "traces_init_shape": (_traces, dict(init=lambda d: Z(B, T, 4, device=d)), ValueError,
                          "init"),
    "traces_gamma_above_one": (_traces, dict(gamma=lambda d: 2.0), ValueError, "gamma"),
    "traces_lmbda_string": (_traces, dict(lmbda=lambda d: "high"), TypeError, "lmbda"),
    "cumsum_x_not_tensor": (_cumsum, dict(x=lambda d: [1.0, 2.0]), TypeError, r"\bx\b"),
    "cumsum_done_shape": (_cumsum, dict(done=lambda d: Z(B, T - 1, device=d)), ValueError,
                          "done"),
    "cumsum_init_shape": (_cumsum, dict(init=lambda d: Z(B + 1, device=d)), ValueError,
                          "init"),
    "out_single_tensor_for_two_outputs": (_gae, dict(out=lambda d: Z(B, T, device=d)),
                                          TypeError, "out"),
    "out_shape": (_lambda_returns, dict(out=lambda d: Z(B, T + 1, device=d)), ValueError,
                  "out"),
    "out_int_dtype": (_cumsum, dict(out=lambda d: Z(B, T, dtype=torch.int64, device=d)),
                      TypeError, "out"),
    "out_expanded": (_linrec, dict(out=lambda d: Z(B, 1, device=d).expand(B, T)), ValueError,
                     "out"),
}
CALLS = {_gae: "gae", _gae_advantages: "gae_advantages", _lambda_returns: "lambda_returns",
         _discounted: "discounted_returns", _traces: "eligibility_traces",
         _cumsum: "episodic_cumsum", _linrec: "linear_recurrence"}


def test_enough_distinct_cases():
    assert len(CASES) >= 22
    assert set(CALLS) == {c[0] for c in CASES.values()}


@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS.values()))
def test_valid_defaults_run(call, impl):
    """The unbroken version of every case runs (so each bad case fails for its one change)."""
    out = call(impl.device)
    out = out if isinstance(out, tuple) else (out,)
    for o in out:
        assert o.shape[0] == B and torch.isfinite(o).all()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_names_the_argument(case, impl):
    call, changes, exc, match = CASES[case]
    bad = {k: f(impl.device) for k, f in changes.items()}
    with pytest.raises(exc, match=match):
        call(impl.device, **bad)


@pytest.mark.parametrize("value", ["gpu", "numba", "tritonn"])
def test_unknown_backend(value, impl, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", value)
    with pytest.raises(ValueError, match="RL_TRITON_CORE_BACKEND"):
        _gae(impl.device)


def test_gamma_tensor_out_of_range_on_cpu(impl):
    """A CPU gamma tensor is range-checked (a CUDA one is not: that would sync the host)."""
    if impl.device.type != "cpu":
        pytest.skip("range of a CUDA gamma tensor is not checked")
    with pytest.raises(ValueError, match="gamma"):
        _gae(impl.device, gamma=torch.full((T,), 1.5))


@pytest.mark.gpu
@pytest.mark.parametrize("arg", ["values", "terminated", "next_values", "gamma"])
def test_mixed_devices(arg, impl):
    if impl.device.type != "cuda":
        pytest.skip("needs CUDA tensors")
    bad = dict(values=Z(B, T), terminated=Z(B, T, dtype=torch.bool), next_values=Z(B, T),
               gamma=torch.full((B, T), 0.9))[arg]
    with pytest.raises((ValueError, TypeError), match=arg):
        _gae(impl.device, **{arg: bad})
