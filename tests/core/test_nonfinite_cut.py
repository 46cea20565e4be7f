"""Non-finite values stop at done flags (semantics.md: "A done flag cuts everything").

Every stream holds three stretches of steps cut apart by done flags (two boundaries,
the same in every stream, plus random flags elsewhere). NaN, +inf or -inf is planted in
every data input of one stretch (the victim): rewards, values, next values, log-ratios,
Q values, x, alpha/beta, and the bootstrap value or init where they belong to it. Then

* every output of the other two stretches is finite and equals the float64 reference
  run on that stretch alone;
* backward, with upstream gradients that are finite elsewhere and non-finite on the
  victim's outputs, the gradient of every input of the other stretches is finite and
  equals autograd through the reference run on that stretch alone;
* the float64 reference run on the whole stream obeys the same (CPU cases).

On the CPU path, in the Triton interpreter (tiny shapes, batch-major and time-major;
several chunks, the three-launch segmented scan and the one-launch look-back forced by
tuning knobs) and, marked ``gpu``, on CUDA at realistic shapes. The primitive has no
flags: there a zero beta is the cut (docs/semantics.md).
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from core_testlib import assert_close_to_ref

import rl_triton_core as rc
from rl_triton_core import reference as ref
from rl_triton_core._table import TABLE

# every row of the table, retrace_from_actions (on retrace's row) and the primitive
# run forward in time
CASES = tuple(TABLE) + ("retrace_from_actions", "linear_recurrence_forward")
# the rows that bootstrap from next_values or bootstrap_value
RETURNS = tuple(n for n, e in TABLE.items() if "bootstrap_value" in e.inputs)
FORWARD = tuple(n for n, e in TABLE.items() if e.checks == "forward")
LINREC = ("linear_recurrence", "linear_recurrence_forward")
# the inputs each case differentiates (next_values / bootstrap_value where given)
GRADS = {"gae": ("rewards", "values", "next_values", "bootstrap_value"),
         "gae_advantages": ("rewards", "values", "next_values", "bootstrap_value"),
         "lambda_returns": ("rewards", "values", "next_values", "bootstrap_value"),
         "discounted_returns": ("rewards", "next_values", "bootstrap_value"),
         "vtrace": ("rewards", "values", "next_values", "bootstrap_value"),
         "retrace": (), "retrace_from_actions": (),
         "eligibility_traces": ("x", "init"), "episodic_cumsum": ("x", "init"),
         "linear_recurrence": ("alpha", "beta", "init"),
         "linear_recurrence_forward": ("alpha", "beta", "init")}
# the poisoned stretch's own arithmetic warns in numpy / the interpreter (0 * inf, inf - inf)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
POISONS = {"nan": float("nan"), "inf": float("inf"), "-inf": -float("inf")}
A = 3  # actions of retrace_from_actions
GAMMA, LMBDA = 0.97, 0.9


# ------------------------------------------------------------------------- problems


def _vmodes(case):
    """How V' is given: "shifted" (values shifted, a bootstrap value; the boundaries
    are terminated, since after a truncation slot t+1 would be the old episode's) or
    "next" (explicit next values / expected next Q: the boundaries may be truncated)."""
    if case in RETURNS:
        return ("shifted", "next")
    if case == "retrace":
        return ("next",)
    return ("shifted",)


def make_problem(case, gen, B, T, vmode, victim, poison, p_flag=0.1, bounds=None):
    """Canonical [B, T(, A)] inputs (float64 values exactly representable in float32),
    the stretches [(lo, hi)] and the victim's index; the victim's inputs are poisoned.
    ``bounds``: the two boundary steps (default: random, one in each third)."""
    if bounds is None:
        b1 = int(torch.randint(1, T // 3, (), generator=gen))
        b2 = int(torch.randint(T // 3 + 1, 2 * T // 3, (), generator=gen))
    else:
        b1, b2 = bounds
    regions = [(0, b1 + 1), (b1 + 1, b2 + 1), (b2 + 1, T)]

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).float().double()

    def rand_flags():
        return torch.rand((B, T), generator=gen) < p_flag

    P = {"T": T, "regions": regions, "victim": victim, "case": case, "vmode": vmode}
    term, trunc = rand_flags(), rand_flags()
    for b in (b1, b2):
        if vmode == "next" and bool(torch.rand((), generator=gen) < 0.5):
            trunc[:, b], term[:, b] = True, False  # a truncation: V'_b is still given
        else:
            term[:, b] = True
    if case in FORWARD:
        P["done"] = term | trunc
        P["x"] = randn(B, T)
        P["init"] = randn(B)
    elif case in LINREC:
        P["alpha"] = randn(B, T)
        P["beta"] = (0.3 + 0.7 * torch.rand((B, T), generator=gen, dtype=torch.float64)
                     ).float().double()
        # the cuts: beta_b = 0 at the stretch's last step (reverse) / first step (forward)
        cuts = (b1, b2) if case == "linear_recurrence" else (b1 + 1, b2 + 1)
        for c in cuts:
            P["beta"][:, c] = 0.0
        P["cuts"] = cuts
        P["init"] = randn(B)
    else:
        P["terminated"], P["truncated"] = term, trunc
        P["rewards"] = randn(B, T)
        if case == "retrace_from_actions":
            P["q_values"] = randn(B, T, A)
            probs = torch.rand((B, T, A), generator=gen, dtype=torch.float64) + 0.1
            P["target_probs"] = (probs / probs.sum(-1, keepdim=True)).float().double()
            P["actions"] = torch.randint(0, A, (B, T), generator=gen)
            P["behaviour_log_probs"] = (torch.rand((B, T), generator=gen, dtype=torch.float64)
                                        * 0.9 + 0.05).log().float().double()
        else:
            P["values"] = randn(B, T)
            P["next_values"] = randn(B, T) if vmode == "next" else None
            P["bootstrap_value"] = randn(B) if vmode == "shifted" else None
            if case in ("vtrace", "retrace"):
                P["log_rhos"] = randn(B, T, scale=0.5)
    _poison(P, gen, poison)
    return P


def _poison(P, gen, value):
    """Plant ``value`` in every data input of the victim stretch: at its first and last
    step and a few random steps, in every stream (and in its bootstrap value / init)."""
    lo, hi = P["regions"][P["victim"]]
    steps = {lo, hi - 1} | {int(s) for s in torch.randint(lo, hi, (3,), generator=gen)}
    steps = sorted(steps)
    first, last = P["victim"] == 0, hi == P["T"]
    for name in ("rewards", "values", "next_values", "log_rhos", "x", "alpha",
                 "behaviour_log_probs"):
        if P.get(name) is not None:
            P[name][:, steps] = value
    if P["case"] in LINREC:  # NaN/inf betas too, except at the cuts (they stay 0)
        bsteps = [s for s in steps if s not in P["cuts"]]
        P["beta"][:, bsteps] = value
    if P["case"] == "retrace_from_actions":
        P["q_values"][:, steps, 0] = value
        P["target_probs"][:, steps, 1] = value
    if P["case"] == "retrace":
        P["q_values"] = P.pop("values")
        P["expected_next_q"] = P.pop("next_values")
        P["q_values"][:, steps] = value
    if last and P.get("bootstrap_value") is not None:
        P["bootstrap_value"][:] = value
    reverse_init = P["case"] == "linear_recurrence"
    if P.get("init") is not None and ((last and reverse_init) or (first and not reverse_init)):
        P["init"][:] = value
    P["poisoned_steps"] = steps


# ------------------------------------------------------------------------- calling


def _lay(x, tm):
    """Canonical [B, T, ...] -> the layout under test (time-major: [T, B, ...])."""
    return x.transpose(0, 1).contiguous() if tm else x.contiguous()


def _unlay(x, tm):
    return x.transpose(0, 1) if tm else x


def call(mod, P, lo, hi, *, tm, device, dtype, grad):
    """Run ``mod`` (rc or the reference) on steps [lo, hi) of problem P in the layout
    under test. Returns (outputs canonical [B, hi-lo], {input name: leaf tensor})."""
    case, T = P["case"], P["T"]
    td = 0 if tm else -1
    first, last = lo == 0, hi == T
    leaves = {}

    def data(name):
        x = P.get(name)
        if x is None:
            return None
        x = _lay(x[:, lo:hi], tm)
        if x.is_floating_point():
            x = x.to(dtype)
            if grad and name in GRADS[case]:
                x.requires_grad_(True)
                leaves[name] = x
        return x.to(device)

    def side(name, present):  # no time axis: bootstrap value (last step), init (first)
        x = P.get(name)
        if x is None or not present:
            return None
        x = x.to(device=device, dtype=dtype)
        if grad and name in GRADS[case]:
            x.requires_grad_(True)
            leaves[name] = x
        return x

    if case in ("gae", "gae_advantages", "lambda_returns", "vtrace"):
        args = [data("rewards"), data("values"), data("terminated"), data("truncated")]
        if case == "vtrace":
            args = [data("log_rhos")] + args
        kw = dict(next_values=data("next_values"),
                  bootstrap_value=side("bootstrap_value", last), gamma=GAMMA, time_dim=td)
        if case != "vtrace":
            kw["lmbda"] = LMBDA
        out = getattr(mod, case)(*args, **kw)
    elif case == "discounted_returns":
        out = mod.discounted_returns(
            data("rewards"), data("terminated"), data("truncated"),
            next_values=data("next_values"), bootstrap_value=side("bootstrap_value", last),
            gamma=GAMMA, time_dim=td)
    elif case == "retrace":
        out = mod.retrace(data("log_rhos"), data("rewards"), data("q_values"),
                          data("expected_next_q"), data("terminated"), data("truncated"),
                          gamma=GAMMA, lmbda=LMBDA, c_bar=1.0, time_dim=td)
    elif case == "retrace_from_actions":
        q, p, a, blp = (data(n) for n in ("q_values", "target_probs", "actions",
                                          "behaviour_log_probs"))
        r, term, trunc = data("rewards"), data("terminated"), data("truncated")
        if mod is rc:
            out = rc.retrace_from_actions(q, p, a, blp, r, term, trunc, gamma=GAMMA,
                                          lmbda=LMBDA, time_dim=td)
        else:  # the same construction in float64, then the reference Retrace
            idx = a.long().unsqueeze(-1)
            q_taken = q.gather(-1, idx).squeeze(-1)
            log_rhos = p.gather(-1, idx).squeeze(-1).log() - blp
            e_own = ref.expected_next_q_from_actions(p, q)
            e = torch.cat([e_own.narrow(td, 1, hi - lo - 1),
                           torch.zeros_like(e_own.narrow(td, 0, 1))], td)
            out = ref.retrace(log_rhos, r, q_taken, e, term, trunc, gamma=GAMMA, lmbda=LMBDA,
                              time_dim=td)
    elif case in FORWARD:
        kw = dict(init=side("init", first), time_dim=td)
        if case == "eligibility_traces":
            kw.update(gamma=GAMMA, lmbda=LMBDA)
        out = getattr(mod, case)(data("x"), data("done"), **kw)
    else:
        reverse = case == "linear_recurrence"
        out = mod.linear_recurrence(data("alpha"), data("beta"), reverse=reverse,
                                    init=side("init", last if reverse else first),
                                    time_dim=td)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(_unlay(o, tm) for o in out), leaves


def _upstream(P, outs, gen):
    """Upstream gradients (canonical): random and finite, non-finite on the victim."""
    lo, hi = P["regions"][P["victim"]]
    gs = []
    for o in outs:
        g = torch.randn(tuple(o.shape), generator=gen, dtype=torch.float64).float().double()
        g[:, lo:hi:2] = float("nan")
        g[:, lo + 1:hi:2] = float("inf")
        gs.append(g)
    return gs


def _grads(outs, leaves, gs, tm):
    names = list(leaves)
    pairs = [(o, g) for o, g in zip(outs, gs) if o.requires_grad]
    res = torch.autograd.grad([o for o, _ in pairs],
                              [leaves[n] for n in names],
                              grad_outputs=[g.to(device=o.device, dtype=o.dtype)
                                            for o, g in pairs], allow_unused=True)
    return {n: (None if r is None else (r if leaves[n].dim() == 1 else _unlay(r, tm)))
            for n, r in zip(names, res)}


def check(P, *, tm, device, dtype, gen, mod=rc, ctx=""):
    """The library (or the reference, ``mod``) on the whole poisoned stream against the
    reference on each other stretch alone: outputs, then gradients."""
    T, regions, victim = P["T"], P["regions"], P["victim"]
    grad = bool(GRADS[P["case"]])
    outs, leaves = call(mod, P, 0, T, tm=tm, device=device, dtype=dtype, grad=grad)
    gs = _upstream(P, outs, gen)
    got_g = _grads(outs, leaves, gs, tm) if grad and leaves else {}
    out_dtype = outs[0].dtype
    for k, (lo, hi) in enumerate(regions):
        if k == victim:
            continue
        c = f"{P['case']} {ctx} stretch {k} [{lo}, {hi}) victim {regions[victim]}"
        want, wleaves = call(ref, P, lo, hi, tm=tm, device="cpu", dtype=torch.float64,
                             grad=grad)
        for j, (o, w) in enumerate(zip(outs, want, strict=True)):
            got = o[:, lo:hi].detach()
            assert bool(torch.isfinite(got.cpu()).all()), f"{c}: output {j} not finite"
            assert_close_to_ref(got, w.detach(), out_dtype, f"{c} output {j}")
        if not (grad and wleaves):
            continue
        want_g = _grads(want, wleaves, [g[:, lo:hi] for g in gs], tm)
        for name, w in want_g.items():
            g = got_g.get(name)
            if w is None:
                continue
            assert g is not None, f"{c}: no gradient for {name}"
            if leaves[name].dim() > 1:
                g = g[:, lo:hi]
                if P["case"] in LINREC and name == "beta":
                    # dL/dbeta_t = u_t h_{t -+ 1} at a cut reads the other side (IEEE)
                    keep = [t - lo for t in range(lo, hi) if t not in P["cuts"]]
                    g, w = g[:, keep], w[:, keep]
            assert bool(torch.isfinite(g.cpu()).all()), f"{c}: gradient of {name} not finite"
            assert_close_to_ref(g.detach(), w.detach(), out_dtype, f"{c} d/d{name}")


def _cases():
    for case in CASES:
        for vmode in _vmodes(case):
            yield case, vmode


ALL = [pytest.param(c, v, id=f"{c}-{v}") for c, v in _cases()]


# ----------------------------------------------------------------------- the tests


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("tm", [False, True], ids=["batch_major", "time_major"])
@pytest.mark.parametrize("case,vmode", ALL)
def test_cpu_path(case, vmode, tm, victim, poison, monkeypatch, seed):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    gen = torch.Generator().manual_seed(seed)
    P = make_problem(case, gen, 3, 40, vmode, victim, POISONS[poison])
    check(P, tm=tm, device="cpu", dtype=torch.float32, gen=gen, ctx=f"[cpu seed={seed}]")


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
@pytest.mark.parametrize("tm", [False, True], ids=["batch_major", "time_major"])
@pytest.mark.parametrize("case,vmode", ALL)
def test_reference(case, vmode, tm, victim, poison, seed):
    """The float64 oracle itself: the whole poisoned stream against its stretches."""
    gen = torch.Generator().manual_seed(seed)
    P = make_problem(case, gen, 3, 40, vmode, victim, POISONS[poison])
    check(P, tm=tm, device="cpu", dtype=torch.float64, gen=gen, mod=ref,
          ctx=f"[reference seed={seed}]")


LONG = [pytest.param(c, v, id=f"{c}-{v}") for c, v in _cases()
        if c in ("gae", "lambda_returns", "vtrace", "retrace", "eligibility_traces",
                 "linear_recurrence")]


@pytest.mark.parametrize("case,vmode", LONG)
def test_cpu_path_time_segments(case, vmode, tuned, monkeypatch, seed):
    """The CPU path's split of a few long streams into time segments (4 threads): the
    middle stretch, poisoned, spans several segments; the ends are short (the reference
    is a Python loop)."""
    from rl_triton_core.scan import _cpu

    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    monkeypatch.setattr(_cpu, "_MIN_WORK", 0, raising=False)
    tuned(cpu_threads=4)
    gen = torch.Generator().manual_seed(seed)
    T, n = 4096, 150
    P = make_problem(case, gen, 2, T, vmode, 1, float("nan"), p_flag=0.01,
                     bounds=(n - 1, T - n - 1))
    check(P, tm=False, device="cpu", dtype=torch.float32, gen=gen, ctx=f"[cpu seed={seed}]")


INTERP_PLANS = {
    # name: (T, tuning knobs)
    "one_chunk": (40, {}),
    "chunks": (40, dict(tile=(2, 16, 1))),
    "segments": (48, dict(segment_len=16, tile=(2, 16, 1), look_back=False)),
    "look_back": (48, dict(segment_len=16, look_back=True, look_window=2)),
}


def _interp_params():
    cycle = itertools.cycle(POISONS)
    for case, vmode in _cases():
        for tm, plans in ((False, tuple(INTERP_PLANS)), (True, ("one_chunk", "look_back"))):
            for plan in plans:
                poison = next(cycle)
                yield pytest.param(case, vmode, tm, plan, poison,
                                   id=f"{case}-{vmode}-{'tm' if tm else 'bm'}-{plan}-{poison}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="interpreter only (the GPU cases are below)")
@pytest.mark.parametrize("case,vmode,tm,plan,poison", list(_interp_params()))
def test_interpreter(case, vmode, tm, plan, poison, tuned, monkeypatch, seed):
    """The Triton kernel in the interpreter: one chunk, several chunks, the three-launch
    segmented scan and the one-launch look-back (boundaries and poison in random
    places, so cuts fall inside and at the edges of chunks and segments)."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    T, knobs = INTERP_PLANS[plan]
    tuned(cached_launch=False, **knobs)
    gen = torch.Generator().manual_seed(seed)
    P = make_problem(case, gen, 3, T, vmode, 1, POISONS[poison])
    check(P, tm=tm, device="cpu", dtype=torch.float32, gen=gen,
          ctx=f"[interp {plan} seed={seed}]")


GPU_SHAPES = {
    # name: (B, T, time-major, stretch ends n: None = random boundaries)
    "bm_256x1024": (256, 1024, False, None),
    "tm_1024x256": (256, 1024, True, None),
    "bm_4x65536": (4, 1 << 16, False, 300),
    "tm_64x16384": (64, 1 << 14, True, 300),
}


@pytest.mark.gpu
@pytest.mark.parametrize("look_back", [None, False], ids=["plan", "three_launches"])
@pytest.mark.parametrize("shape", list(GPU_SHAPES))
@pytest.mark.parametrize("case,vmode", ALL)
def test_cuda(case, vmode, shape, look_back, tuned, monkeypatch, seed):
    """Realistic shapes on the GPU: many streams (one pass), and a few long streams whose
    poisoned middle stretch spans many segments (the plan's look-back, or the three
    launches); float32, the cached launch on (called twice)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    if look_back is not None:
        tuned(look_back=look_back)
    B, T, tm, n = GPU_SHAPES[shape]
    gen = torch.Generator().manual_seed(seed)
    bounds = None if n is None else (n - 1, T - n - 1)
    P = make_problem(case, gen, B, T, vmode, 1, float("nan"), p_flag=0.01, bounds=bounds)
    for rep in range(2):  # the second call replays the cached launch
        check(P, tm=tm, device="cuda", dtype=torch.float32, gen=gen,
              ctx=f"[cuda {shape} call {rep} seed={seed}]")
