"""Every public estimator against the float64 reference, on fresh random inputs: gae,
lambda_returns, discounted_returns, vtrace, retrace (and retrace_from_actions),
eligibility_traces, episodic_cumsum, linear_recurrence.

The case matrix crosses layouts (batch shape, position of the time axis) with T in
{1, 2, 7, 33, 70}; the other choices (dtype, flag dtype and pattern, memory view, how
next values are given, gamma/lmbda as numbers or tensors) are spread over the cases by a
fixed pseudo-random assignment, visible in each test id; on the Triton backends about
half the cases force the segmented path with segments of 16 steps. Values are
random per run: the seed is shown when a test fails (rerun with RL_TEST_SEED=<seed>).
"""

import random

import pytest
import torch
from core_testlib import (
    BACKWARD,
    DTYPES,
    FLAG_KINDS,
    FLAG_PATTERNS,
    FORWARD,
    GAMMA_MODES,
    VIEWS,
    assert_close_to_ref,
    bernoulli,
    drop_axis,
    lib,
    make_done,
    make_flags,
    make_gamma,
    make_threshold,
    place,
    python_plans,
    randn,
    ref,
    run_case,
    spy_c_replay,
    uniform,
)

TS = (1, 2, 7, 33, 70)
# (data shape with None for the time axis, time_dim)
BACKWARD_LAYOUTS = (
    ((None,), -1),
    ((None,), 0),
    ((None, 3), 0),  # time-major [T, B]
    ((3, None), -1),  # [B, T]
    ((3, None, 1), -2),  # TorchRL [B, T, 1]
    ((2, 3, None), 2),  # [B1, B2, T]
    ((2, None, 3), 1),  # time in the middle
)
VALUE_MODES = ("next_values", "bootstrap", "shifted")


def _shape(template, T):
    return tuple(T if s is None else s for s in template)


def _dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def _backward_cases():
    rnd = random.Random(20240601)
    cases = []
    for template, time_dim in BACKWARD_LAYOUTS:
        for T in TS:
            cases.append(dict(
                shape=_shape(template, T), time_dim=time_dim,
                dtype=rnd.choice(DTYPES), kind=rnd.choice(FLAG_KINDS),
                pattern=rnd.choice(FLAG_PATTERNS), view=rnd.choice(VIEWS),
                vmode=rnd.choice(VALUE_MODES), gmode=rnd.choice(GAMMA_MODES),
                lmode=rnd.choice(GAMMA_MODES), seg=rnd.choice((None, 16))))
    return cases


def _case_id(c):
    return "-".join(str(v if not isinstance(v, torch.dtype) else _dtype_id(v))
                    for v in c.values()).replace(" ", "")


BACKWARD_CASES = _backward_cases()


def backward_call(name, gen, *, shape, time_dim, dtype, kind, pattern, view, vmode, gmode,
                  lmode, device, seg=None):
    """(args, kwargs) for one backward estimator, every tensor placed in ``view``."""
    pos = time_dim % len(shape)
    P = lambda x: place(x, view, device)  # noqa: E731

    def coef(mode, make, **kw):
        c = make(gen, shape, mode, dtype, pos=pos, **kw)
        if not isinstance(c, torch.Tensor):
            return c
        return P(c) if c.shape == shape else c.to(device)

    args = []
    if name in ("vtrace", "retrace"):
        args.append(P(randn(gen, shape, dtype, scale=0.7)))  # log_rhos
    args.append(P(randn(gen, shape, dtype)))  # rewards
    if name != "discounted_returns":
        args.append(P(randn(gen, shape, dtype)))  # values / q_values
    term, trunc = make_flags(gen, shape, pattern, kind, dtype)
    kwargs = dict(gamma=coef(gmode, make_gamma), time_dim=time_dim)
    if name == "retrace":
        args.append(P(randn(gen, shape, dtype)))  # expected_next_q
    elif vmode == "next_values":
        kwargs["next_values"] = P(randn(gen, shape, dtype))
    elif vmode == "bootstrap":
        kwargs["bootstrap_value"] = P(randn(gen, drop_axis(shape, pos), dtype))
    if name != "discounted_returns":
        kwargs["lmbda"] = coef(lmode, make_gamma, lo=0.0)
    if name == "vtrace":
        kwargs.update(rho_bar=coef(gmode, make_threshold), c_bar=coef(lmode, make_threshold),
                      pg_rho_bar=coef("float", make_threshold))
    if name == "retrace":
        kwargs["c_bar"] = coef(gmode, make_threshold)
    args += [P(term), None if trunc is None else P(trunc)]
    return args, kwargs


@pytest.mark.parametrize("name", BACKWARD)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=_case_id)
def test_backward_estimator_matches_reference(name, case, impl, gen, seed, segments):
    segments(case["seg"])
    args, kwargs = backward_call(name, gen, device=impl.device, **case)
    run_case(name, args, kwargs, impl=impl, dtype=case["dtype"], seed=seed,
             ctx=_case_id(case))


# ------------------------------------------------------------------- forward scans

# (x shape with None for time, number of done axes, time_dim)
FORWARD_LAYOUTS = (
    ((None,), 1, -1),
    ((None, 3), 2, 0),  # time-major [T, B]
    ((None, 3), 1, 0),  # [T] stream with 3 features
    ((3, None), 2, -1),
    ((3, None, 4), 2, -2),  # [B, T, F], done [B, T]
    ((3, None, 1), 3, -2),  # TorchRL [B, T, 1]
    ((2, None, 2, 3), 2, 1),  # two feature axes
)
FORWARD_GAMMA_MODES = ("float", "full", "per_step", "per_stream", "scalar_tensor", "x_full")


def _forward_cases():
    rnd = random.Random(777)
    cases = []
    for template, done_ndim, time_dim in FORWARD_LAYOUTS:
        for T in TS:
            shape = _shape(template, T)
            gmodes = FORWARD_GAMMA_MODES if done_ndim < len(shape) else FORWARD_GAMMA_MODES[:-1]
            cases.append(dict(
                shape=shape, done_ndim=done_ndim, time_dim=time_dim,
                dtype=rnd.choice(DTYPES), kind=rnd.choice(FLAG_KINDS),
                pattern=rnd.choice(("random", "random", "all_done", "none")),
                view=rnd.choice(VIEWS), init=rnd.choice((True, False)),
                gmode=rnd.choice(gmodes), lmode=rnd.choice(gmodes), seg=rnd.choice((None, 16))))
    return cases


FORWARD_CASES = _forward_cases()


def forward_call(name, gen, *, shape, done_ndim, time_dim, dtype, kind, pattern, view, init,
                 gmode, lmode, device, seg=None):
    pos = time_dim % len(shape)
    P = lambda x: place(x, view, device)  # noqa: E731
    done_shape = shape[:done_ndim]
    x = randn(gen, shape, dtype)
    done = make_done(gen, done_shape, pattern, kind, dtype)
    kwargs = dict(time_dim=time_dim)
    if init:
        kwargs["init"] = P(randn(gen, drop_axis(shape, pos), dtype))
    if name == "eligibility_traces":
        for key, mode in (("gamma", gmode), ("lmbda", lmode)):
            if mode == "x_full":  # per-feature discount: x's full shape
                g = make_gamma(gen, shape, "full", dtype)
            else:
                g = make_gamma(gen, done_shape, mode, dtype, pos=pos)
            kwargs[key] = P(g) if isinstance(g, torch.Tensor) and g.dim() else (
                g.to(device) if isinstance(g, torch.Tensor) else g)
    return [P(x), P(done)], kwargs


@pytest.mark.parametrize("name", FORWARD)
@pytest.mark.parametrize("case", FORWARD_CASES, ids=_case_id)
def test_forward_scan_matches_reference(name, case, impl, gen, seed, segments):
    segments(case["seg"])
    args, kwargs = forward_call(name, gen, device=impl.device, **case)
    run_case(name, args, kwargs, impl=impl, dtype=case["dtype"], seed=seed,
             ctx=_case_id(case))


def _linrec_cases():
    rnd = random.Random(99)
    return [dict(shape=_shape(template, T), time_dim=time_dim, dtype=rnd.choice(DTYPES),
                 view=rnd.choice(VIEWS), reverse=rnd.choice((True, False)),
                 init=rnd.choice((True, False)), seg=rnd.choice((None, 16)))
            for template, time_dim in BACKWARD_LAYOUTS for T in TS]


LINREC_CASES = _linrec_cases()


@pytest.mark.parametrize("case", LINREC_CASES, ids=_case_id)
def test_linear_recurrence_matches_reference(case, impl, gen, seed, segments):
    segments(case["seg"])
    shape, pos, dtype = case["shape"], case["time_dim"] % len(case["shape"]), case["dtype"]
    P = lambda x: place(x, case["view"], impl.device)  # noqa: E731
    alpha = randn(gen, shape, dtype)
    beta = uniform(gen, shape, -1.0, 1.0, dtype)
    kwargs = dict(reverse=case["reverse"], time_dim=case["time_dim"])
    if case["init"]:
        kwargs["init"] = P(randn(gen, drop_axis(shape, pos), dtype))
    run_case("linear_recurrence", [P(alpha), P(beta)], kwargs, impl=impl, dtype=dtype,
             seed=seed, ctx=_case_id(case))


# ---------------------------------------------------------------- focused checks


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", BACKWARD + FORWARD + ("linear_recurrence",))
def test_every_dtype_keeps_dtype(name, dtype, impl, gen, seed):
    shape = (4, 33)
    if name in BACKWARD:
        args, kwargs = backward_call(
            name, gen, shape=shape, time_dim=-1, dtype=dtype, kind="float", pattern="random",
            view="contiguous", vmode="bootstrap", gmode="full", lmode="full",
            device=impl.device)
    elif name in FORWARD:
        args, kwargs = forward_call(
            name, gen, shape=shape, done_ndim=2, time_dim=-1, dtype=dtype, kind="float",
            pattern="random", view="contiguous", init=True, gmode="full", lmode="float",
            device=impl.device)
    else:
        args = [randn(gen, shape, dtype).to(impl.device),
                uniform(gen, shape, 0.0, 1.0, dtype).to(impl.device)]
        kwargs = dict(time_dim=-1)
    run_case(name, args, kwargs, impl=impl, dtype=dtype, seed=seed)


@pytest.mark.parametrize("pattern", FLAG_PATTERNS)
@pytest.mark.parametrize("kind", FLAG_KINDS)
@pytest.mark.parametrize("name", BACKWARD)
def test_flag_patterns_and_dtypes(name, kind, pattern, impl, gen, seed):
    args, kwargs = backward_call(
        name, gen, shape=(3, 7), time_dim=-1, dtype=torch.float32, kind=kind,
        pattern=pattern, view="contiguous", vmode="next_values", gmode="float", lmode="float",
        device=impl.device)
    run_case(name, args, kwargs, impl=impl, dtype=torch.float32, seed=seed, ctx=pattern)


@pytest.mark.parametrize("name", BACKWARD)
def test_both_flags_count_as_terminated(name, impl, gen, seed):
    shape = (3, 33)
    args, kwargs = backward_call(
        name, gen, shape=shape, time_dim=-1, dtype=torch.float64, kind="bool",
        pattern="no_truncated", view="contiguous", vmode="next_values", gmode="float",
        lmode="float", device=impl.device)
    term = args[-2]
    (both,) = run_case(name, args[:-1] + [term.clone()], kwargs, impl=impl,
                       dtype=torch.float64, seed=seed)[:1]
    (only_term,) = run_case(name, args[:-1] + [None], kwargs, impl=impl, dtype=torch.float64,
                            seed=seed)[:1]
    torch.testing.assert_close(both, only_term, rtol=0, atol=0)


@pytest.mark.parametrize("name", ("gae", "lambda_returns"))
def test_explicit_next_values_equal_shifted_with_bootstrap(name, impl, gen, seed):
    shape, pos = (2, 33, 1), 1
    dtype = torch.float64
    rewards, values = randn(gen, shape, dtype), randn(gen, shape, dtype)
    term, trunc = make_flags(gen, shape, "random", "bool", dtype)
    boot = randn(gen, (2, 1), dtype)
    nv = torch.cat([values[:, 1:], boot[:, None]], dim=pos)
    dev = impl.device
    base = [rewards.to(dev), values.to(dev), term.to(dev), trunc.to(dev)]
    kw = dict(gamma=0.97, lmbda=0.9, time_dim=-2)
    a = run_case(name, base, dict(kw, bootstrap_value=boot.to(dev)), impl=impl, dtype=dtype,
                 seed=seed)
    b = run_case(name, base, dict(kw, next_values=nv.to(dev)), impl=impl, dtype=dtype,
                 seed=seed)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    # no bootstrap_value means V'_{T-1} = 0
    nv0 = torch.cat([values[:, 1:], torch.zeros_like(boot[:, None])], dim=pos)
    c = run_case(name, base, kw, impl=impl, dtype=dtype, seed=seed)
    d = run_case(name, base, dict(kw, next_values=nv0.to(dev)), impl=impl, dtype=dtype,
                 seed=seed)
    for x, y in zip(c, d, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


GAMMA_SHAPES = ((), (1,), (33,), (4, 1), (4, 33), (1, 33))


@pytest.mark.parametrize("gshape", GAMMA_SHAPES, ids=str)
@pytest.mark.parametrize("name", BACKWARD)
def test_gamma_lmbda_broadcast_shapes(name, gshape, impl, gen, seed):
    dtype = torch.float32
    args, kwargs = backward_call(
        name, gen, shape=(4, 33), time_dim=-1, dtype=dtype, kind="uint8", pattern="random",
        view="contiguous", vmode="bootstrap", gmode="float", lmode="float",
        device=impl.device)
    kwargs["gamma"] = uniform(gen, gshape, 0.5, 1.0, dtype).to(impl.device)
    if "lmbda" in kwargs:
        kwargs["lmbda"] = uniform(gen, gshape, 0.0, 1.0, dtype).to(impl.device)
    run_case(name, args, kwargs, impl=impl, dtype=dtype, seed=seed, ctx=str(gshape))


def _outputs(name, args, kwargs):
    out = lib(name)(*args, **kwargs)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("name", BACKWARD + FORWARD + ("linear_recurrence",))
def test_nan_stays_in_its_stream(name, impl, gen, seed):
    """A NaN at step t of stream b reaches no other stream, and (backward) no later step /
    (forward) no earlier step of stream b; everything else still matches the reference."""
    B, T, t_nan, b_nan = 4, 33, 17, 2
    dtype = torch.float32
    if name in BACKWARD:
        args, kwargs = backward_call(
            name, gen, shape=(B, T), time_dim=-1, dtype=dtype, kind="bool", pattern="random",
            view="contiguous", vmode="next_values", gmode="float", lmode="float",
            device=impl.device)
    elif name in FORWARD:
        args, kwargs = forward_call(
            name, gen, shape=(B, T), done_ndim=2, time_dim=-1, dtype=dtype, kind="bool",
            pattern="random", view="contiguous", init=True, gmode="float", lmode="float",
            device=impl.device)
    else:
        args = [randn(gen, (B, T), dtype).to(impl.device),
                uniform(gen, (B, T), 0.0, 1.0, dtype).to(impl.device)]
        kwargs = dict(reverse=bool(seed % 2), time_dim=-1)
    data = 1 if name in ("vtrace", "retrace") else 0  # rewards / x / alpha
    args[data][b_nan, t_nan] = float("nan")
    backward = name in BACKWARD or kwargs.get("reverse", False)
    got = _outputs(name, args, kwargs)
    expected = ref(name)(*[a.cpu() if isinstance(a, torch.Tensor) else a for a in args],
                         **{k: v.cpu() if isinstance(v, torch.Tensor) else v
                            for k, v in kwargs.items()})
    expected = expected if isinstance(expected, tuple) else (expected,)
    unaffected = torch.ones(B, T, dtype=torch.bool)
    if backward:
        unaffected[b_nan, : t_nan + 1] = False
    else:
        unaffected[b_nan, t_nan:] = False
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        ctx = f"{name} [{impl.name}, seed={seed}] output {k}"
        assert torch.isnan(g[b_nan, t_nan].cpu()), f"{ctx}: the NaN step itself is not NaN"
        assert torch.isfinite(g.cpu()[unaffected]).all(), f"{ctx}: NaN leaked"
        assert_close_to_ref(g, e, dtype, ctx, mask=unaffected)


@pytest.mark.parametrize("shape,time_dim", [((0,), -1), ((3, 0), -1), ((0, 3), 0),
                                            ((2, 0, 1), -2)], ids=str)
@pytest.mark.parametrize("name", BACKWARD + FORWARD + ("linear_recurrence",))
def test_empty_time_axis(name, shape, time_dim, impl, seed):
    dtype = torch.float32
    z = torch.zeros(shape, dtype=dtype, device=impl.device)
    done = torch.zeros(shape, dtype=torch.bool, device=impl.device)
    if name == "discounted_returns":
        args = [z, done]
    elif name == "vtrace":
        args = [z, z.clone(), z.clone(), done]
    elif name == "retrace":
        args = [z, z.clone(), z.clone(), z.clone(), done]
    elif name in BACKWARD:
        args = [z, z.clone(), done]
    elif name in FORWARD:
        args = [z, done]
    else:
        args = [z, z.clone()]
    got = _outputs(name, args, dict(time_dim=time_dim))
    n_out = 2 if name in ("gae", "vtrace") else 1
    assert len(got) == n_out
    for g in got:
        assert isinstance(g, torch.Tensor) and tuple(g.shape) == shape and g.dtype == dtype


@pytest.mark.parametrize("name", BACKWARD + FORWARD)
def test_two_episodes_in_one_stream_equal_two_streams(name, impl, gen, seed):
    """One stream holding two episodes (done at the boundary; next values given) equals the
    two halves computed separately, and both equal the reference."""
    dtype, T1, T2, B = torch.float64, 20, 13, 3
    T = T1 + T2
    dev = impl.device
    x = randn(gen, (B, T), dtype)
    values = randn(gen, (B, T), dtype)
    nv = randn(gen, (B, T), dtype)
    log_rhos = randn(gen, (B, T), dtype, scale=0.7)
    term = bernoulli(gen, (B, T), 0.1)
    trunc = bernoulli(gen, (B, T), 0.1) & ~term
    # the boundary: stream 0 terminates, stream 1 truncates, stream 2 both
    term[:, T1 - 1] = torch.tensor([True, False, True])
    trunc[:, T1 - 1] = torch.tensor([False, True, True])
    gamma = uniform(gen, (B, T), 0.8, 1.0, dtype)

    def call(sl):
        if name in FORWARD:
            done = term[:, sl] | trunc[:, sl]
            kw = dict(gamma=gamma[:, sl].to(dev), lmbda=0.9) if name == "eligibility_traces" \
                else {}
            kw["time_dim"] = -1
            args = [x[:, sl].to(dev), done.to(dev)]
        else:
            kw = dict(gamma=gamma[:, sl].to(dev), time_dim=-1)
            args = [log_rhos[:, sl].to(dev)] if name in ("vtrace", "retrace") else []
            args.append(x[:, sl].to(dev))
            if name != "discounted_returns":
                args.append(values[:, sl].to(dev))
                kw["lmbda"] = 0.9
            if name == "retrace":
                args.append(nv[:, sl].to(dev))  # expected_next_q
            else:
                kw["next_values"] = nv[:, sl].to(dev)
            args += [term[:, sl].to(dev), trunc[:, sl].to(dev)]
        return run_case(name, args, kw, impl=impl, dtype=dtype, seed=seed)

    whole = call(slice(None))
    first, second = call(slice(0, T1)), call(slice(T1, T))
    for w, a, b in zip(whole, first, second, strict=True):
        torch.testing.assert_close(w, torch.cat([a, b], dim=1), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["batch_major", "time_major"])
@pytest.mark.parametrize("next_given", [False, True])
def test_retrace_from_actions_matches_reference(layout, next_given, dtype, impl, gen, seed):
    """The per-action convenience form equals reference.retrace on Q_t = q[a_t],
    log rho_t = log pi(a_t) - log mu(a_t), E_t = sum_a pi(a|s_{t+1}) Q(s_{t+1}, a), with
    row t+1 as the next state (the last row from bootstrap_*) unless next_* is given.
    float32 takes the Triton pass over the actions (_actions) on the Triton backends."""
    B, T, A = 3, 33, 4
    dev = impl.device
    q = randn(gen, (B, T, A), dtype)
    probs = torch.softmax(randn(gen, (B, T, A), dtype), -1)
    actions = torch.randint(0, A, (B, T), generator=gen)
    log_mu = torch.log(uniform(gen, (B, T), 0.1, 1.0, dtype))
    rewards = randn(gen, (B, T), dtype)
    term, trunc = make_flags(gen, (B, T), "random", "bool", dtype)
    kw = dict(gamma=0.95, lmbda=0.9, c_bar=1.2, time_dim=-1)
    if next_given:
        nq = randn(gen, (B, T, A), dtype)
        nprobs = torch.softmax(randn(gen, (B, T, A), dtype), -1)
        kw.update(next_q_values=nq, next_target_probs=nprobs)
    else:
        bq = randn(gen, (B, A), dtype)
        bprobs = torch.softmax(randn(gen, (B, A), dtype), -1)
        kw.update(bootstrap_q_values=bq, bootstrap_target_probs=bprobs)
        nq = torch.cat([q[:, 1:], bq[:, None]], 1)
        nprobs = torch.cat([probs[:, 1:], bprobs[:, None]], 1)
    # reference inputs, batch-major, float64 (of the very values passed)
    q64, p64, mu64, r64, nq64, np64 = (x.double() for x in (q, probs, log_mu, rewards, nq,
                                                             nprobs))
    idx = actions[..., None]
    q_taken = q64.gather(-1, idx)[..., 0]
    log_rhos = p64.gather(-1, idx)[..., 0].log() - mu64
    e = ref("expected_next_q_from_actions")(np64, nq64)
    expected = ref("retrace")(log_rhos, r64, q_taken, e, term, trunc, **{
        k: kw[k] for k in ("gamma", "lmbda", "c_bar", "time_dim")})
    step_args = [actions, log_mu, rewards, term, trunc]
    act_args = [q, probs]
    if layout == "time_major":  # [T, B] and [T, B, A], time_dim=0
        step_args = [a.transpose(0, 1) for a in step_args]
        act_args = [a.transpose(0, 1) for a in act_args]
        kw = {k: (v.transpose(0, 1) if isinstance(v, torch.Tensor) and v.dim() == 3 else v)
              for k, v in kw.items()}
        kw["time_dim"] = 0
        expected = expected.transpose(0, 1)
    a, lm, r, te, tr = (x.to(dev) for x in step_args)
    qq, pp = (x.to(dev) for x in act_args)
    kw = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = lib("retrace_from_actions")(qq, pp, a, lm, r, te, tr, **kw)
    assert_close_to_ref(got, expected, dtype, f"retrace_from_actions [{impl.name}, seed={seed}]")


@pytest.mark.parametrize("case", ["batch_major", "time_major", "lead_trail", "strided_actions",
                                  "next_given", "one_step", "many_actions", "half", "long",
                                  "no_boot"])
def test_action_pieces_kernel_equals_torch_ops(case, impl, gen, seed):
    """The Triton pass over the actions (_actions.pieces) against the torch ops of the
    CPU path (_action_pieces), piece by piece, on random layouts: the time axis first,
    in the middle or last, an action axis that is not contiguous, int32 actions, a
    broadcast bootstrap row; outputs poisoned by fresh allocation, never zero-filled."""
    if impl.name == "cpu":
        pytest.skip("the Triton backends' pass")
    from rl_triton_core._layout import Layout
    from rl_triton_core.scan import _actions, _from_actions

    dev = impl.device
    A = {"many_actions": 37, "one_step": 3}.get(case, 5)
    shape, td = {"batch_major": ((4, 40), 1), "time_major": ((40, 4), 0),
                 "lead_trail": ((2, 17, 3), 1), "one_step": ((6, 1), 1),
                 "long": ((2, 300), 1)}.get(case, ((3, 50), 1))
    dtype = torch.bfloat16 if case == "half" else torch.float32
    q = randn(gen, (*shape, A), dtype)
    p = torch.softmax(randn(gen, (*shape, A)), -1).to(dtype)
    if case == "strided_actions":  # the action axis with a stride of 7 elements
        q = randn(gen, (*shape, 7 * A), dtype)[..., ::7]
        p = torch.softmax(randn(gen, (*shape, A)), -1).movedim(-1, 0).contiguous().movedim(0, -1)
    actions = torch.randint(0, A, shape, generator=gen, dtype=torch.int32)
    log_mu = torch.log(uniform(gen, shape, 0.05, 1.0))
    nq = np_ = None
    notime = shape[:td] + shape[td + 1:] + (A,)
    boot = [randn(gen, (A,)).expand(notime), torch.softmax(randn(gen, notime), -1)]
    if case == "next_given":
        nq, np_ = randn(gen, (*shape, A)), torch.softmax(randn(gen, (*shape, A)), -1)
        boot = []
    to = (lambda x: None if x is None else x.to(dev))
    rewards = randn(gen, shape).to(dev)
    given = boot
    if case == "no_boot":  # bootstrap rows of 0
        given, boot = [None, None], [torch.zeros(notime), torch.zeros(notime)]
    got = _actions.pieces(Layout(shape, td), (to(q), to(p), to(actions), to(log_mu), to(nq),
                          to(np_), *(to(b) for b in given or (None, None)), rewards))
    want = _from_actions._action_pieces(q, p, actions, log_mu, nq, np_, boot, td, torch.float32)
    for name, g, w in zip(("log_rhos", "q_taken", "expected_next_q"), got, want):
        assert g.shape == w.shape and g.dtype == torch.float32, name
        torch.testing.assert_close(g.cpu(), w.float(), rtol=2e-6, atol=2e-6,
                                   msg=lambda m, n=name: f"{n} [{case}, seed={seed}]: {m}")


@pytest.mark.parametrize("case", ["batch_major", "time_major", "lead_trail", "strided_actions",
                                  "next_given", "no_boot", "many_actions", "row_tile",
                                  "long_row", "broadcast_flags", "bad_action"])
def test_fused_pass_equals_two_passes_and_reference(case, impl, gen, seed, tuned, monkeypatch):
    """retrace_from_actions in one fused pass (the pieces built as the scan's
    coefficients) against the float64 reference and against the pass over the actions
    plus retrace's scan (``fused_actions=False``), on random layouts: the time axis first,
    in the middle or last, a strided action axis, int32 actions, a whole-row tile, flags
    broadcast over streams; an action out of range gives NaN at its step and the steps
    its trace reaches, the others equal the two-pass path."""
    if impl.name == "cpu":
        pytest.skip("the Triton backends' pass")
    if case == "bad_action" and impl.device.type != "cuda":
        pytest.skip("CPU actions are checked by value (a ValueError)")
    if case == "long_row" and impl.device.type != "cuda":
        pytest.skip("16 warps of 4096-step rows: minutes in the interpreter")
    from rl_triton_core.scan import _actions, _dispatch

    tuned(fused_actions=True)
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    fused_calls = []
    real = _actions.fused
    monkeypatch.setattr(_actions, "fused", lambda *a, **k: fused_calls.append(
        real(*a, **k)) or fused_calls[-1])
    dev = impl.device
    A = {"many_actions": 19, "long_row": 3}.get(case, 5)
    shape, td = {"time_major": ((37, 3), 0), "lead_trail": ((2, 21, 3), 1),
                 "row_tile": ((140, 200), 1), "long_row": ((140, 4096), 1)}.get(
                     case, ((3, 45), 1))
    q = randn(gen, (*shape, A))
    p = torch.softmax(randn(gen, (*shape, A)), -1)
    if case == "strided_actions":
        q = randn(gen, (*shape, 3 * A))[..., ::3]
    # int64 actions where whole rows of 2048+ steps once gave wrong targets on the H200
    adt = torch.int64 if case in ("long_row", "row_tile", "many_actions") else torch.int32
    actions = torch.randint(0, A, shape, generator=gen, dtype=adt)
    if case == "bad_action":
        actions[1, 30] = A
    log_mu = torch.log(uniform(gen, shape, 0.05, 1.0))
    rewards = randn(gen, shape)
    fshape = shape
    if case == "broadcast_flags":
        fshape = (1, shape[1])
    term, trunc = make_flags(gen, fshape, "random", "bool", torch.float32)
    kw = dict(gamma=0.93, lmbda=0.85, c_bar=1.3, time_dim=td)
    notime = shape[:td] + shape[td + 1:] + (A,)
    if case == "next_given":
        kw.update(next_q_values=randn(gen, (*shape, A)),
                  next_target_probs=torch.softmax(randn(gen, (*shape, A)), -1))
    elif case != "no_boot":
        kw.update(bootstrap_q_values=randn(gen, notime),
                  bootstrap_target_probs=torch.softmax(randn(gen, notime), -1))
    args = [x.to(dev) for x in (q, p, actions, log_mu, rewards, term, trunc)]
    kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    # the fused pass allocates its output: NaN in the block the allocator hands out next
    torch.full(shape, float("nan"), device=dev)
    got = lib("retrace_from_actions")(*args, **kw)
    if case == "long_row":  # 8 steps a thread: the fused pass declines, two passes run
        assert fused_calls == [None]
    else:
        assert len(fused_calls) == 1 and fused_calls[0] is got  # the fused pass ran
    tuned(fused_actions=False)
    two = lib("retrace_from_actions")(*args, **kw)
    assert got.shape == shape and got.dtype == torch.float32
    if case == "bad_action":
        bad = torch.zeros(shape, dtype=torch.bool)
        bad[1, :31] = True  # step 30's Q_t, and its ratio in the trace of step 29
        g, w = got.cpu(), two.cpu()
        assert g[1, 30].isnan() and w[1, 30].isnan()
        torch.testing.assert_close(g[~bad], w[~bad], rtol=1e-5, atol=1e-5)
        return
    torch.testing.assert_close(got.cpu(), two.cpu(), rtol=1e-5, atol=1e-5,
                               msg=lambda m: f"fused vs two passes [{case}, seed={seed}]: {m}")
    # the float64 reference on the pieces by torch ops
    from rl_triton_core.scan import _from_actions

    nq, np_ = kw.get("next_q_values"), kw.get("next_target_probs")
    boot = [] if nq is not None else [
        kw.get("bootstrap_q_values", torch.zeros(notime)).cpu().double(),
        kw.get("bootstrap_target_probs", torch.zeros(notime)).cpu().double()]
    lr, qt, e = _from_actions._action_pieces(
        q.double(), p.double(), actions, log_mu.double(),
        None if nq is None else nq.cpu().double(), None if np_ is None else np_.cpu().double(),
        boot, td, torch.float64)
    want = ref("retrace")(lr, rewards.double(), qt, e, term.expand(shape), trunc.expand(shape),
                          gamma=0.93, lmbda=0.85, c_bar=1.3, time_dim=td)
    assert_close_to_ref(got, want, torch.float32, f"fused [{case}, {impl.name}, seed={seed}]")


def test_fused_pass_rule():
    """The fused pass takes a plan only without time segments and with at most 4 steps a
    thread; by default only batch-major rows of 16-1024 steps (where it measured
    faster on the H200), wherever allowed when forced on, never when off; its own tiles
    hold at most 4 steps a thread."""
    from rl_triton_core._config import Tuning
    from rl_triton_core.scan import _actions

    pays = _actions._fused_pays
    default, on, off = Tuning(fused_actions=None), Tuning(fused_actions=True), Tuning(
        fused_actions=False)
    assert pays(4096, 128, 4, 128, 1, 4, True, default)
    assert pays(256, 1024, 1, 1024, 1, 8, True, default)
    assert not pays(512, 4096, 1, 4096, 1, 16, True, default)  # 8 steps a thread
    assert not pays(512, 4096, 1, 4096, 1, 16, True, on)
    assert not pays(16, 131072, 1, 128, 16, 4, True, on)  # time segments
    assert pays(32768, 32, *_actions._fused_tile(32)[:2], 1, 1, True, default)
    assert not pays(32768, 8, 4, 16, 1, 1, True, default)  # under 16 steps: two passes
    assert pays(32768, 8, 4, 16, 1, 1, True, on)
    assert not pays(1024, 2048, 1, 2048, 1, 16, True, default)  # long rows: two passes
    assert not pays(4096, 128, 16, 16, 1, 4, False, default)  # time-major
    assert pays(4096, 128, 4, 128, 1, 4, True, on)
    assert not pays(4096, 128, 4, 128, 1, 4, True, off)
    for T in (1, 16, 32, 45, 128, 200, 512, 1000, 1024):
        bn, bt, w = _actions._fused_tile(T)
        assert bt >= T and bn * bt <= 4 * 32 * w and 1 <= w <= 16


def test_action_pieces_out_of_range_action_is_nan(impl, gen):
    """On the Triton backends an action outside [0, A) gives NaN for its step's Q_t and
    log rho (no host check on CUDA, no device assert); the other steps are exact."""
    if impl.name == "cpu":
        pytest.skip("the Triton backends' pass")
    from rl_triton_core._layout import Layout
    from rl_triton_core.scan import _actions

    shape, A = (2, 20), 4
    q, p = randn(gen, (*shape, A)), torch.softmax(randn(gen, (*shape, A)), -1)
    actions = torch.randint(0, A, shape, generator=gen)
    actions[0, 3], actions[1, 7] = A, -1
    boot = [torch.zeros(2, A), torch.zeros(2, A)]
    dev = impl.device
    lr, qt, e = _actions.pieces(Layout(shape, 1), (
        q.to(dev), p.to(dev), actions.to(dev), torch.zeros(shape, device=dev), None, None,
        *(b.to(dev) for b in boot), torch.zeros(shape, device=dev)))
    bad = torch.zeros(shape, dtype=torch.bool)
    bad[0, 3] = bad[1, 7] = True
    assert lr.cpu()[bad].isnan().all() and qt.cpu()[bad].isnan().all()
    ok = actions.clamp(0, A - 1)[..., None]
    assert torch.equal(qt.cpu()[~bad], q.gather(-1, ok)[..., 0][~bad])
    assert not e.isnan().any()


@pytest.mark.parametrize("path", ["fused", "two_pass"])
@pytest.mark.parametrize("boot", ["given", "none", "next"])
def test_retrace_from_actions_cached_call(boot, path, impl, gen, seed, tuned, monkeypatch):
    """A repeated retrace_from_actions call (same shapes, strides, dtypes) skips the checks
    and replays the recorded launch: the fused pass (pieces and scan in one kernel), or
    the pass over the actions and then retrace's scan where time is split into segments.
    On fresh data each call it equals the float64 reference, the plan is recorded once
    and used after, a CPU action out of range still raises, and inputs needing autograd
    take the full path."""
    if impl.name == "cpu":
        pytest.skip("the Triton backends' cached call")
    from rl_triton_core.scan import _actions

    if impl.name == "interp":
        tuned(cpu_plans=True)
    tuned(fused_actions=path == "fused")
    from rl_triton_core.scan import _dispatch

    monkeypatch.setattr(_dispatch, "_PLANS", {})
    calls = []
    from rl_triton_core import _record

    kernel = _actions.fused_kernel if path == "fused" else _actions.actions_kernel

    def ours(rec):  # the record of the fused pass, or of the pieces' pass
        return getattr(getattr(rec, "run", None), "jit_fn", None) is kernel

    real = _record.Recorded.__call__

    def spy(self, raw):
        if ours(self):
            calls.append(1)
        return real(self, raw)

    monkeypatch.setattr(_record.Recorded, "__call__", spy)
    replays = []
    spy_c_replay(monkeypatch, replays)
    B, T, A, dev = 3, 40, 5, impl.device

    def case():
        q, p = randn(gen, (B, T, A)), torch.softmax(randn(gen, (B, T, A)), -1)
        a = torch.randint(0, A, (B, T), generator=gen)
        mu = torch.log(uniform(gen, (B, T), 0.1, 1.0))
        r = randn(gen, (B, T))
        te, tr = make_flags(gen, (B, T), "random", "bool", torch.float32)
        kw = dict(gamma=float(uniform(gen, (), 0.8, 1.0)), lmbda=0.9, time_dim=-1)
        bq, bp = randn(gen, (B, A)), torch.softmax(randn(gen, (B, A)), -1)
        if boot == "given":
            kw.update(bootstrap_q_values=bq, bootstrap_target_probs=bp)
            nq, np_ = torch.cat([q[:, 1:], bq[:, None]], 1), torch.cat([p[:, 1:], bp[:, None]], 1)
        elif boot == "none":
            nq = torch.cat([q[:, 1:], torch.zeros(B, 1, A)], 1)
            np_ = torch.cat([p[:, 1:], torch.zeros(B, 1, A)], 1)
        else:
            nq, np_ = randn(gen, (B, T, A)), torch.softmax(randn(gen, (B, T, A)), -1)
            kw.update(next_q_values=nq, next_target_probs=np_)
        idx = a[..., None]
        want = ref("retrace")(p.double().gather(-1, idx)[..., 0].log() - mu.double(), r.double(),
                              q.double().gather(-1, idx)[..., 0],
                              ref("expected_next_q_from_actions")(np_.double(), nq.double()),
                              te, tr, gamma=kw["gamma"], lmbda=0.9, time_dim=-1)
        args = [x.to(dev) for x in (q, p, a, mu, r, te, tr)]
        kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        return args, kw, want

    for trial in range(3):
        args, kw, want = case()
        got = lib("retrace_from_actions")(*args, **kw)
        assert_close_to_ref(got, want, torch.float32, f"trial {trial} [{impl.name}, seed={seed}]")
    # the fused pass's plan; or the pass's plan and the scan's. The two repeats take the
    # fused plan, or the C replay where the C launch recorded the fused pass; the two-pass
    # repeats take the pieces' plan, then the scan's plan or its C replay
    plans = python_plans()
    assert len(plans) == (1 if path == "fused" else 2)
    assert len(calls) + len(replays) == 2 if path == "fused" else len(calls) == 2
    assert sum(ours(p) for p in plans) == 1
    args, kw, _ = case()
    if impl.name == "interp":
        args[2][1, 7] = A
        with pytest.raises(ValueError, match="actions must lie"):
            lib("retrace_from_actions")(*args, **kw)
        args[2][1, 7] = 0
    args[0] = args[0].requires_grad_()
    n = len(calls)
    lib("retrace_from_actions")(*args, **kw)
    assert len(calls) == n  # autograd inputs: the full path (torch ops), no replay


@pytest.mark.parametrize("name", ["eligibility_traces", "episodic_cumsum"])
def test_forward_scans_repeat_a_recorded_cpu_call(name, gen, monkeypatch):
    """``done`` without feature axes reaches the kernel as the caller's own tensor, so a
    repeated CPU call replays its record instead of validating again (the flags were once
    reshaped into a new tensor object every call, which the CPU record refuses: 52 µs a
    call at 64x32 on a 2-core host instead of 22). The replay gives the first call's bits
    and the reference's values."""
    import os

    import rl_triton_core as rc
    import rl_triton_core.reference as reference
    from rl_triton_core.scan import _dispatch

    if os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton":
        pytest.skip("the CPU path's record")
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    x = randn(gen, (5, 40))
    done = bernoulli(gen, (5, 40), 0.1)
    fn = getattr(rc, name)
    outs = [fn(x, done, time_dim=-1) for _ in range(4)]  # (the first may run numpy)
    assert _dispatch._PLANS, "no record of the repeated call"
    assert all(torch.equal(o, outs[0]) for o in outs)
    want = getattr(reference, name)(x.double(), done, time_dim=-1)
    torch.testing.assert_close(outs[-1].double(), want, rtol=1e-5, atol=1e-5)
