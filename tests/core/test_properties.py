"""Identities between the estimators (rlax-style), as hypothesis property tests.

Random shapes (T up to 300 on the CPU path; up to 70 under the interpreter, where the
kernel is also forced into segments of 16 or 32 steps so T crosses several), random
time_dim and memory views, flag patterns including all-done, none-done and both-set,
tensor gamma. Each identity is checked between library calls, and one side is also
checked against the float64 reference so no identity can hold
vacuously (e.g. two outputs that are both zero, or both wrong the same way).

(a) lambda_returns - values == gae advantages, when V'_t = V_{t+1} at non-done steps;
(b) gae(lmbda=1) == discounted_returns - values, same next values;
(c) discounted_returns == lambda_returns(lmbda=1), any values;
(d) eligibility_traces(gamma = lmbda = 1) == episodic_cumsum;
(e) linear_recurrence(GAE's alpha, beta) == gae;
(f) on-policy vtrace / retrace == gae value targets;
(g) gae_advantages == gae's advantages, bit for bit, and so are their gradients.
"""

import pytest
import torch
from core_testlib import (
    FLAG_KINDS,
    FLAG_PATTERNS,
    VIEWS,
    assert_close_to_ref,
    drop_axis,
    lib,
    make_done,
    make_flags,
    make_gamma,
    place,
    randn,
    ref,
    uniform,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MAX_T = {"cpu": 300, "interp": 70, "cuda": 300}
# With a cold numba cache (a clean checkout, CI) the CPU path compiles for about a second
# per new combination of dtypes and memory layouts, and nearly every example is a new one.
# Each test runs twice, as ``part`` "main" (the main CI tier) and "long" (the long tier,
# marked ``long``), each with its share of the examples: 20 / 6 / 30 in all.
EXAMPLES = {"main": {"cpu": 8, "interp": 3, "cuda": 15},
            "long": {"cpu": 12, "interp": 3, "cuda": 15}}
pytestmark = pytest.mark.parametrize("part", ["main", pytest.param("long", marks=pytest.mark.long)])

SETTINGS = dict(deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(impl_name, part):
    return settings(max_examples=EXAMPLES[part][impl_name], **SETTINGS)


@st.composite
def problems(draw, max_t):
    """A random problem: shape, time axis, dtype, flags, view, gamma, seed for the values."""
    T = draw(st.one_of(st.integers(1, 8), st.integers(1, max_t)))
    batch = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    pos = draw(st.integers(0, len(batch)))
    shape = tuple(batch[:pos]) + (T,) + tuple(batch[pos:])
    time_dim = draw(st.sampled_from([pos, pos - len(shape)]))
    return dict(
        shape=shape, pos=pos, time_dim=time_dim,
        dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        kind=draw(st.sampled_from(FLAG_KINDS)),
        pattern=draw(st.sampled_from(FLAG_PATTERNS)),
        view=draw(st.sampled_from(VIEWS)),
        gmode=draw(st.sampled_from(["float", "full", "per_step", "per_stream"])),
        lmbda=draw(st.sampled_from([0.0, 0.5, 0.95, 1.0, "full"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        seg=draw(st.sampled_from([None, 16, 32])),
    )


def _close(a, b, dtype, ctx):
    """Two library outputs of the same quantity."""
    assert a.shape == b.shape and a.dtype == b.dtype == dtype, ctx
    assert a.numel() > 0, ctx
    assert_close_to_ref(a, b.detach().cpu().double(), dtype, ctx)


class Inputs:
    def __init__(self, p, device):
        self.p = p
        self.gen = torch.Generator().manual_seed(p["seed"])
        self.device = device
        self.shape, self.pos, self.dtype = p["shape"], p["pos"], p["dtype"]

    def place(self, x):
        return place(x, self.p["view"], self.device)

    def randn(self, shape=None):
        return randn(self.gen, self.shape if shape is None else shape, self.dtype)

    def flags(self):
        return make_flags(self.gen, self.shape, self.p["pattern"], self.p["kind"], self.dtype)

    def gamma(self):
        g = make_gamma(self.gen, self.shape, self.p["gmode"], self.dtype, pos=self.pos)
        return self.place(g) if isinstance(g, torch.Tensor) else g

    def lmbda(self):
        if self.p["lmbda"] == "full":
            return self.place(uniform(self.gen, self.shape, 0.0, 1.0, self.dtype))
        return self.p["lmbda"]

    def done_bits(self, term, trunc):
        d = term != 0
        return d if trunc is None else d | (trunc != 0)


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _check_ref(name, out, args, kwargs, dtype, ctx, index=0):
    """``out`` (output ``index`` of ``name``) against the float64 reference."""
    expected = ref(name)(*[_cpu(a) for a in args], **{k: _cpu(v) for k, v in kwargs.items()})
    expected = expected[index] if isinstance(expected, tuple) else expected
    assert_close_to_ref(out, expected, dtype, f"{ctx} vs reference")


def _shifted_next_values(inp, values, done):
    """V'_t = V_{t+1} wherever step t is not done (and t < T-1); random elsewhere."""
    pos = inp.pos
    v = values.movedim(pos, 0)
    nv = inp.randn().movedim(pos, 0).clone()
    keep = ~done.movedim(pos, 0)[:-1]
    nv[:-1] = torch.where(keep, v[1:], nv[:-1])
    return nv.movedim(0, pos).contiguous()


def test_lambda_returns_minus_values_is_gae(impl, segments, part):
    """(a) If V'_t = V_{t+1} at every step that is not done, G_t - V_t = A_t."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]))
    def check(p):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        rewards, values = inp.randn(), inp.randn()
        term, trunc = inp.flags()
        nv = _shifted_next_values(inp, values, inp.done_bits(term, trunc))
        args = [inp.place(rewards), inp.place(values), inp.place(term),
                None if trunc is None else inp.place(trunc)]
        kw = dict(next_values=inp.place(nv), gamma=inp.gamma(), lmbda=inp.lmbda(),
                  time_dim=p["time_dim"])
        ret = lib("lambda_returns")(*args, **kw)
        adv, target = lib("gae")(*args, **kw)
        ctx = f"[{impl.name}] {p}"
        _check_ref("gae", adv, args, kw, p["dtype"], ctx)
        _close(ret - args[1], adv, p["dtype"], ctx)
        _close(ret, target, p["dtype"], ctx)

    check()


def test_gae_lambda_one_is_monte_carlo_minus_values(impl, segments, part):
    """(b) GAE with lmbda = 1 is the discounted return (same next values) minus V."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]))
    def check(p):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        rewards, values = inp.randn(), inp.randn()
        term, trunc = inp.flags()
        nv = inp.place(_shifted_next_values(inp, values, inp.done_bits(term, trunc)))
        flags = [inp.place(term), None if trunc is None else inp.place(trunc)]
        gamma, td = inp.gamma(), p["time_dim"]
        rewards, values = inp.place(rewards), inp.place(values)
        adv, _ = lib("gae")(rewards, values, *flags, next_values=nv, gamma=gamma,
                            lmbda=1.0, time_dim=td)
        kw = dict(next_values=nv, gamma=gamma, time_dim=td)
        mc = lib("discounted_returns")(rewards, *flags, **kw)
        ctx = f"[{impl.name}] {p}"
        _check_ref("discounted_returns", mc, [rewards, *flags], kw, p["dtype"], ctx)
        _close(mc - values, adv, p["dtype"], ctx)

    check()


def test_discounted_returns_is_lambda_returns_with_lambda_one(impl, segments, part):
    """(c) discounted_returns == lambda_returns(lmbda=1) whatever the values, with explicit
    next values, and with bootstrap_value (= next values 0 except V'_{T-1})."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]), st.booleans())
    def check(p, explicit):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        rewards, values = inp.place(inp.randn()), inp.place(inp.randn())
        term, trunc = inp.flags()
        flags = [inp.place(term), None if trunc is None else inp.place(trunc)]
        gamma, td = inp.gamma(), p["time_dim"]
        if explicit:
            nv = inp.place(inp.randn())
            kw_mc = dict(next_values=nv)
        else:
            boot = inp.randn(drop_axis(inp.shape, inp.pos))
            nv = torch.zeros(inp.shape, dtype=inp.dtype)
            nv.movedim(inp.pos, 0)[-1] = boot
            nv = inp.place(nv)
            kw_mc = dict(bootstrap_value=inp.place(boot))
        kw_mc.update(gamma=gamma, time_dim=td)
        mc = lib("discounted_returns")(rewards, *flags, **kw_mc)
        lr = lib("lambda_returns")(rewards, values, *flags, next_values=nv, gamma=gamma,
                                   lmbda=1.0, time_dim=td)
        ctx = f"[{impl.name}] explicit={explicit} {p}"
        _check_ref("discounted_returns", mc, [rewards, *flags], kw_mc, p["dtype"], ctx)
        _close(mc, lr, p["dtype"], ctx)

    check()


@st.composite
def forward_problems(draw, max_t):
    p = draw(problems(max_t))
    n_feat = draw(st.integers(0, 2))
    feats = tuple(draw(st.lists(st.integers(1, 3), min_size=n_feat, max_size=n_feat)))
    x_shape = p["shape"][: p["pos"] + 1] + feats if feats else p["shape"]
    done_ndim = p["pos"] + 1 if feats else len(p["shape"])
    time_dim = draw(st.sampled_from([p["pos"], p["pos"] - len(x_shape)]))
    p.update(x_shape=x_shape, done_ndim=done_ndim, time_dim=time_dim,
             init=draw(st.booleans()), ones_as=draw(st.sampled_from(["float", "tensor"])))
    p["pattern"] = draw(st.sampled_from(["random", "all_done", "none"]))
    return p


def test_traces_without_decay_are_episodic_cumsum(impl, segments, part):
    """(d) eligibility_traces with gamma * lmbda = 1 equals episodic_cumsum."""

    @examples(impl.name, part)
    @given(forward_problems(MAX_T[impl.name]))
    def check(p):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        x_shape = p["x_shape"]
        x = inp.place(inp.randn(x_shape))
        done = inp.place(make_done(inp.gen, x_shape[: p["done_ndim"]], p["pattern"],
                                   p["kind"], inp.dtype))
        kw = dict(time_dim=p["time_dim"])
        if p["init"]:
            kw["init"] = inp.place(inp.randn(drop_axis(x_shape, inp.pos)))
        if p["ones_as"] == "tensor":
            one = inp.place(torch.ones(x_shape[: p["done_ndim"]], dtype=inp.dtype))
        else:
            one = 1.0
        tr = lib("eligibility_traces")(x, done, gamma=one, lmbda=1.0, **kw)
        cs = lib("episodic_cumsum")(x, done, **kw)
        ctx = f"[{impl.name}] {p}"
        _check_ref("episodic_cumsum", cs, [x, done], kw, p["dtype"], ctx)
        _close(tr, cs, p["dtype"], ctx)

    check()


def test_linear_recurrence_with_gae_coefficients_is_gae(impl, segments, part):
    """(e) alpha_t = delta_t, beta_t = gamma_t lmbda_t (1 - done_t), backward: the GAE."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]))
    def check(p):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        rewards, values, nv = inp.randn(), inp.randn(), inp.randn()
        term, trunc = inp.flags()
        gamma, lmbda = inp.gamma(), inp.lmbda()
        f = lambda x: _cpu(x).double() if isinstance(x, torch.Tensor) else x  # noqa: E731
        not_term = 1.0 - (term != 0).double()
        not_done = 1.0 - inp.done_bits(term, trunc).double()
        alpha = f(rewards) + f(gamma) * not_term * f(nv) - f(values)
        beta = torch.broadcast_to(f(gamma) * f(lmbda) * not_done, inp.shape)
        td = p["time_dim"]
        h = lib("linear_recurrence")(inp.place(alpha.to(inp.dtype)),
                                     inp.place(beta.to(inp.dtype)), reverse=True,
                                     time_dim=td)
        args = [inp.place(rewards), inp.place(values), inp.place(term),
                None if trunc is None else inp.place(trunc)]
        kw = dict(next_values=inp.place(nv), gamma=gamma, lmbda=lmbda, time_dim=td)
        adv, _ = lib("gae")(*args, **kw)
        ctx = f"[{impl.name}] {p}"
        _check_ref("gae", adv, args, kw, p["dtype"], ctx)
        # alpha / beta were rounded to the data dtype once: one more rounding step
        _close(h, adv, p["dtype"], ctx)

    check()


def test_on_policy_vtrace_and_retrace_are_gae(impl, segments, part):
    """(f) With log_rhos = 0 and clips >= 1, V-trace's vs are GAE's value targets (c_t =
    lmbda_t), and Retrace with Q = V, E = V' (scalar lmbda) gives the same targets."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]), st.sampled_from([1.0, 1.5]))
    def check(p, clip):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        rewards, values, nv = (inp.place(inp.randn()) for _ in range(3))
        term, trunc = inp.flags()
        flags = [inp.place(term), None if trunc is None else inp.place(trunc)]
        zeros = inp.place(torch.zeros(inp.shape, dtype=inp.dtype))
        gamma, lmbda, td = inp.gamma(), inp.lmbda(), p["time_dim"]
        kw = dict(next_values=nv, gamma=gamma, lmbda=lmbda, time_dim=td)
        _, target = lib("gae")(rewards, values, *flags, **kw)
        vs, _ = lib("vtrace")(zeros, rewards, values, *flags, rho_bar=clip, c_bar=clip,
                               pg_rho_bar=clip, **kw)
        ctx = f"[{impl.name}] clip={clip} {p}"
        _check_ref("vtrace", vs, [zeros, rewards, values, *flags], dict(
            kw, rho_bar=clip, c_bar=clip, pg_rho_bar=clip), p["dtype"], ctx)
        _close(vs, target, p["dtype"], ctx)
        lm = lmbda if isinstance(lmbda, float) else 0.9
        q_ret = lib("retrace")(zeros, rewards, values, nv, *flags, gamma=gamma, lmbda=lm,
                               c_bar=clip, time_dim=td)
        _, target_lm = lib("gae")(rewards, values, *flags, **dict(kw, lmbda=lm))
        _close(q_ret, target_lm, p["dtype"], ctx)

    check()


def test_gae_advantages_is_gaes_first_output(impl, segments, part):
    """(g) The advantages-only form writes one output: the same bits as gae's first, and
    the gradients of gae's with no gradient through the value targets."""

    @examples(impl.name, part)
    @given(problems(MAX_T[impl.name]))
    def check(p):
        segments(p["seg"])
        inp = Inputs(p, impl.device)
        term, trunc = inp.flags()
        leaves = [inp.randn().requires_grad_(True) for _ in range(2)]
        boot = inp.randn(drop_axis(inp.shape, inp.pos)).to(impl.device)
        kw = dict(bootstrap_value=boot, gamma=inp.gamma(),
                  lmbda=inp.lmbda(), time_dim=p["time_dim"])
        args = [inp.place(leaves[0]), inp.place(leaves[1]), inp.place(term),
                None if trunc is None else inp.place(trunc)]
        ctx = f"[{impl.name}] {p}"
        adv = lib("gae_advantages")(*args, **kw)
        want = lib("gae")(*args, **kw)[0]
        plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        _check_ref("gae", adv.detach(), plain, kw, p["dtype"], ctx)
        diff = (adv.detach().double() - want.detach().double()).abs().max().item()
        assert torch.equal(adv.detach(), want.detach()), f"{ctx} forward, max diff {diff}"
        w = inp.randn().to(impl.device)
        got = torch.autograd.grad((adv * w).sum(), leaves, retain_graph=True)
        exp = torch.autograd.grad((want * w).sum(), leaves)
        for g, e in zip(got, exp):
            diff = (g.double() - e.double()).abs().max().item()
            assert torch.equal(g, e), f"{ctx} gradient, max diff {diff}"

    check()
