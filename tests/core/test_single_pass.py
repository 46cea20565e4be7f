"""Segments of several chunks in one launch (``Tuning.single_pass``: the scan kernel's
PHASE 5): each program composes its segment's map, publishes it, takes the carry from
the look-back over the other segments' maps, and scans its segment again into the
outputs. Outputs and gradients against autograd through the float64 reference in
blocks of 2 segments, batch- and time-major, one warp or several along time;
float32 / float16 with random flags against the reference; and a recurrence whose
carry survives every segment (coefficients near 1, an initial value) over 10
segments, so the look-back composes the blocks' maps over several windows. The
interpreter runs it on CPU tensors; on a GPU the same tests run the compiled kernel."""

import os

import pytest
import test_autograd as ta  # a sibling module (rootdir-relative import, as core_testlib)
import torch
from core_testlib import spy_launch_consts

import rl_triton_core as rc
import rl_triton_core.reference as ref

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = ["cpu"] if INTERP else []
if torch.cuda.is_available():
    DEVICES.append(pytest.param("cuda", marks=pytest.mark.gpu))
pytestmark = pytest.mark.skipif(not DEVICES, reason="the Triton kernel: the interpreter or a GPU")

# (name, time_dim, knobs, chunks per segment); 150 steps: 5 segments of 32 (3 blocks of
# 2, the last segment partial) or 3 of 64
PLANS = [
    # batch-major: 2 rows x 16 steps a program, 2 chunks a segment
    ("batch-major", -1, dict(tile=(2, 16, 1), segment_len=32), 2),
    # time-major, a stream per lane: 16 steps a chunk, 2 chunks a segment
    ("time-major", 0, dict(segment_len=32), 2),
    # time-major, 2 warps along time (32 steps a chunk), 2 chunks a segment
    ("time-major, 2 warps", 0, dict(tm_warps=2, segment_len=64), 2),
]
BACKWARD = ["gae_shifted", "gae_next_values", "lambda_shifted", "vtrace_shifted",
            "vtrace_shifted_tensor_coefs", "linrec_reverse", "linrec_forward", "traces",
            "cumsum"]
PAIRS = [(case, plan) for plan in PLANS for case in BACKWARD]


@pytest.fixture
def single(monkeypatch, tuned):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(cached_launch=False)
    tuned(look_back=False)
    tuned(single_pass=True)
    tuned(look_window=2)

    def use(knobs):
        for k, v in knobs.items():
            tuned(**{k: v})
        return spy_launch_consts(monkeypatch)
    return use


def _check_plan(seen, plan):
    """Every scan launch took PHASE 5 with segments of several chunks."""
    _, _, knobs, chunks = plan
    scans = [c for c in seen if "SUB" in c]
    assert scans and all(c["PHASE"] == 5 for c in scans), seen
    assert all(c["SUB"] == knobs.get("tm_warps", 1) for c in scans), seen
    assert all(knobs["segment_len"] == chunks * c["BLOCK_T"] for c in scans), seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("case", "plan"), PAIRS, ids=[f"{c}-{p[0]}" for c, p in PAIRS])
def test_single_pass_forward_and_backward_fp64(case, plan, device, single):
    _, td, knobs, _ = plan
    seen = single(knobs)
    shape = (150, 40) if td == 0 else (5, 150)
    fn, wrt = ta.CASES[case]
    wrt = wrt.split()
    inputs = {k: (v.to(device) if torch.is_tensor(v) else v)
              for k, v in ta._inputs(2468, shape, td, "cpu").items()}
    xs = [inputs[k].requires_grad_(True) for k in wrt]
    out = fn(rc, dict(inputs, **dict(zip(wrt, xs))), td)
    out = out if isinstance(out, tuple) else (out,)
    ref_in = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in inputs.items()}
    ref_xs = [ref_in[k].clone().requires_grad_(True) for k in wrt]
    want = fn(ref, dict(ref_in, **dict(zip(wrt, ref_xs))), td)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(out, want):
        torch.testing.assert_close(o.detach().cpu(), w.detach(), rtol=1e-9, atol=1e-9)
    g = torch.Generator().manual_seed(13)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    got = torch.autograd.grad(sum((o * w.to(device)).sum() for o, w in zip(out, weights)), xs)
    exp = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), ref_xs)
    for name, gg, wg in zip(wrt, got, exp):
        torch.testing.assert_close(gg.cpu(), wg, rtol=1e-9, atol=1e-9, msg=f"d/d{name}")
    _check_plan(seen, plan)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
def test_single_pass_low_precision(plan, dtype, device, single, gen):
    """Random flags of both kinds, a strided view, NaN-poisoned outputs (``out=``),
    GAE and V-trace against the float64 reference."""
    _, td, knobs, _ = plan
    seen = single(knobs)
    g = gen
    T, N = 150, 37
    shape, wide = ((T, N), (T, N + 3)) if td == 0 else ((N, T), (N, T + 3))
    cut = (slice(None), slice(0, N)) if td == 0 else (slice(None), slice(0, T))
    r, v, lr = (torch.randn(wide, generator=g)[cut] for _ in range(3))
    te = torch.rand(shape, generator=g) < 0.05
    tr = torch.rand(shape, generator=g) < 0.05
    boot = torch.randn(N, generator=g)
    dev = lambda x: x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)  # noqa: E731
    adv = torch.full(shape, float("nan"), dtype=dtype, device=device)
    ret = torch.full(shape, float("nan"), dtype=dtype, device=device)
    rc.gae(dev(r), dev(v), dev(te), dev(tr), bootstrap_value=dev(boot), gamma=0.97,
           lmbda=0.9, time_dim=td, out=(adv, ret))
    vs, pg = rc.vtrace(dev(lr), dev(r), dev(v), dev(te), dev(tr), bootstrap_value=dev(boot),
                       gamma=0.97, time_dim=td)
    q = lambda x: x.to(dtype).double() if x.is_floating_point() else x  # noqa: E731
    want = ref.gae(q(r), q(v), te, tr, bootstrap_value=q(boot), gamma=0.97, lmbda=0.9,
                   time_dim=td)
    want_v = ref.vtrace(q(lr), q(r), q(v), te, tr, bootstrap_value=q(boot), gamma=0.97,
                        time_dim=td)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    for o, w in zip((adv, ret, vs, pg), (*want, *want_v)):
        torch.testing.assert_close(o.double().cpu(), w, **tol)
    _check_plan(seen, plan)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
def test_single_pass_non_finite_stays_local(reverse, device, single):
    """A NaN at one step reaches only the steps after it in scan order, as in the
    reference (the segment's map and the look-back compose it like the three launches)."""
    seen = single(dict(tile=(2, 16, 1), segment_len=32))
    T = 150
    x = torch.randn(3, T, dtype=torch.float64)
    beta = torch.full((3, T), 0.5, dtype=torch.float64)
    bad = 64 if reverse else 63  # the last step, in scan order, of a segment
    x[1, bad] = float("nan")
    want = ref.linear_recurrence(x, beta, reverse=reverse, time_dim=-1)
    got = rc.linear_recurrence(x.to(device), beta.to(device), reverse=reverse,
                               time_dim=-1).cpu()
    assert seen and all(c["PHASE"] == 5 for c in seen), seen
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    torch.testing.assert_close(got[ok], want[ok], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
def test_single_pass_carry_through_every_segment(plan, reverse, device, single, gen):
    """beta in [0.97, 1] and an initial value: the carry from the first segment reaches
    the last (in the tests above it fades within a segment or two, so a block of maps
    dropped from the look-back went unnoticed: found in review). 10 segments in blocks
    of 2 (5 blocks: the blocks before a segment take several windows of 2)."""
    _, td, knobs, _ = plan
    seen = single(knobs)
    T = 10 * knobs["segment_len"]
    shape = (T, 40) if td == 0 else (5, T)
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    beta = 0.97 + 0.03 * torch.rand(shape, generator=gen, dtype=torch.float64)
    init = torch.randn(shape[1] if td == 0 else shape[0], generator=gen, dtype=torch.float64)
    want = ref.linear_recurrence(x, beta, init=init, reverse=reverse, time_dim=td)
    got = rc.linear_recurrence(x.to(device), beta.to(device), init=init.to(device),
                               reverse=reverse, time_dim=td)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-9, atol=1e-9)
    _check_plan(seen, plan)
