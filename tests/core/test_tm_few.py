"""Time-major data of fewer than 32 streams with the lanes left over along time
(``Tuning.tm_few``: the scan kernel's SUB > 1, ``_sub_scan``): outputs and gradients
against autograd through the float64 reference, in each plan that can take them -- one
pass over chunks (PHASE 0), three launches (PHASE 1, 3, 2) and the look-back (PHASE 4,
bounded and, with every stream block full and T whole chunks, without bounds) -- and in
float32 and float16 against the reference's float64 outputs. The interpreter runs it on
CPU tensors; on a GPU the same tests run the compiled kernel."""

import os

import pytest
import test_autograd as ta  # a sibling module (rootdir-relative import, as core_testlib)
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core.scan import _launch

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = ["cpu"] if INTERP else []
if torch.cuda.is_available():
    DEVICES.append(pytest.param("cuda", marks=pytest.mark.gpu))
pytestmark = pytest.mark.skipif(not DEVICES, reason="the Triton kernel: the interpreter or a GPU")

# (name, knobs, phases); 16 steps a lane (tm_steps' least) unless a segment is shorter
PLANS = [
    # 16 steps a lane: 75 steps take one or more chunks (the carry between them)
    ("one pass", dict(tm_few=True, programs_per_sm=0), [0]),
    # 16-step segments of one 16-step chunk: 16 // lanes steps a lane
    ("three launches", dict(tm_few=True, segment_len=16, look_back=False), [1, 3, 2]),
    # 64-step segments (two chunks where 2 lanes make a 32-step chunk)
    ("three launches, 64-step segments", dict(tm_few=True, segment_len=64, look_back=False),
     {(75, 12): [1, 3, 2], (64, 16): [0], (70, 3): [1, 3, 2]}),
    # 32-step segments, one chunk each, in blocks of 2 segments
    ("look-back", dict(tm_few=True, segment_len=32, look_back=True, look_window=2), [4]),
]
# [T, N] time-major: 12 streams of a block of 16 over 75 steps (a partial last chunk), 16
# over 64 (every block full, T whole chunks: the look-back's EVEN tile), and 3 streams
# of a block of 4 (8 lanes along time)
SHAPES = [(75, 12), (64, 16), (70, 3)]


def _lanes(T, N):
    """The lanes along time the plan gives: the lanes left over by the streams, no more
    than 16-step runs in T's power of two."""
    np2 = 1 << (N - 1).bit_length()
    tp = 1 << (T - 1).bit_length()
    return min(32 // np2, tp // 16)


# the estimators whose last step's next value is 0 (no bootstrap value, no next values):
# the kernel's default bootstrap tile
NO_BOOT = {
    "gae_no_boot": (lambda m, d, td: m.gae(
        d["r"], d["v"], d["te"], d["tr"], gamma=0.9, lmbda=0.8, time_dim=td), "r v"),
    "lambda_no_boot": (lambda m, d, td: m.lambda_returns(
        d["r"], d["v"], d["te"], d["tr"], gamma=0.9, lmbda=0.6, time_dim=td), "r v"),
    "discounted_no_boot": (lambda m, d, td: m.discounted_returns(
        d["r"], d["te"], d["tr"], gamma=0.9, time_dim=td), "r"),
    "vtrace_no_boot": (lambda m, d, td: m.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], gamma=0.9, time_dim=td), "r v"),
}
CASES = {**ta.CASES, **NO_BOOT}
# every case in one pass and the look-back; a mode or two of each kind in the others
SOME = ["gae_shifted", "gae_no_boot", "lambda_next_values", "vtrace_shifted",
        "vtrace_no_boot", "linrec_forward", "traces", "cumsum"]
PAIRS = [(case, plan) for plan in PLANS for case in CASES
         if plan[0] in ("one pass", "look-back") or case in SOME]


def _spy(monkeypatch):
    """(kernels, consts): what every ``_launch.launch`` call starts, from now on."""
    kernels, seen = [], []
    real = _launch.launch

    def spy(*a, **k):
        res = real(*a, **k)
        kernels.extend(kernel for kernel, _, _ in res[3])
        seen.extend(c for _, _, c in res[3])
        return res

    monkeypatch.setattr(_launch, "launch", spy)
    return kernels, seen


@pytest.fixture
def backend(monkeypatch, tuned):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(cached_launch=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(("case", "plan"), PAIRS,
                         ids=[f"{c}-{p[0]}" for c, p in PAIRS])
def test_tm_few_forward_and_backward_fp64(case, plan, shape, device, backend, tuned,
                                            monkeypatch):
    _, knobs, phases = plan
    phases = phases[shape] if isinstance(phases, dict) else phases
    for k, v in knobs.items():
        tuned(**{k: v})
    kernels, seen = _spy(monkeypatch)
    ta._check(case, shape, 0, device, 4321, gradcheck=None, cases=CASES)
    # every scan launch split its chunks among the lanes left over, in the plan asked for
    # (with feature axes the streams are N x features: 32 or more keep a lane a stream)
    scans = [c for c in seen if "SUB" in c]
    assert scans and all(c["SUB"] == max(1, 32 // c["BLOCK_N"]) for c in scans), seen
    if "features" not in case:
        assert all(c["SUB"] == _lanes(*shape) for c in scans), seen
    assert sorted({c["PHASE"] for c in scans}) == sorted(phases), seen
    if phases == [4]:
        even = [c["EVEN"] for c in scans]
        assert all(even) if shape == (64, 16) else not any(even), seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
def test_tm_few_low_precision(plan, dtype, device, backend, tuned, gen, monkeypatch):
    """Random flags (both kinds) and non-uniform strides (a time-major view of a wider
    tensor), NaN-poisoned outputs, against the float64 reference."""
    for k, v in plan[1].items():
        tuned(**{k: v})
    _, seen = _spy(monkeypatch)
    g = gen
    T, N = 70, 13
    r, v = (torch.randn(T, N + 3, generator=g)[:, :N] for _ in range(2))
    te, tr = (torch.rand(T, N, generator=g) < p for p in (0.05, 0.03))
    b = torch.randn(N, generator=g)
    adv = torch.full((T, N), float("nan"), dtype=dtype, device=device)
    ret = torch.full((T, N), float("nan"), dtype=dtype, device=device)
    d = lambda x: x.to(device, dtype)  # noqa: E731
    rc.gae(d(r), d(v), te.to(device), tr.to(device), bootstrap_value=d(b), gamma=0.97,
           lmbda=0.9, time_dim=0, out=(adv, ret))
    wa, wr = ref.gae(r.to(dtype).double(), v.to(dtype).double(), te, tr,
                     bootstrap_value=b.to(dtype).double(), gamma=0.97, lmbda=0.9, time_dim=0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(adv.cpu().double(), wa, rtol=tol, atol=tol)
    torch.testing.assert_close(ret.cpu().double(), wr, rtol=tol, atol=tol)
    assert seen and all(c["SUB"] == _lanes(T, N) for c in seen if "SUB" in c), seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # (numpy's)
def test_tm_few_non_finite(plan, device, backend, tuned, gen):
    """NaN and infinite rewards and values (and a NaN bootstrap value) go where the float64
    reference puts them: a done flag stops them, the steps before it in the episode take
    them, in every plan."""
    for k, v in plan[1].items():
        tuned(**{k: v})
    T, N = 75, 12
    r, v = torch.randn(T, N, generator=gen).double(), torch.randn(T, N, generator=gen).double()
    for x in (r, v):
        spots = torch.rand(T, N, generator=gen) < 0.01
        x[spots] = torch.tensor([float("nan"), float("inf"), -float("inf")]).double()[
            torch.randint(0, 3, (int(spots.sum()),), generator=gen)]
    te, tr = (torch.rand(T, N, generator=gen) < p for p in (0.08, 0.04))
    b = torch.randn(N, generator=gen).double()
    b[3] = float("nan")
    got = rc.gae(r.to(device), v.to(device), te.to(device), tr.to(device),
                 bootstrap_value=b.to(device), gamma=0.95, lmbda=0.9, time_dim=0)
    want = ref.gae(r, v, te, tr, bootstrap_value=b, gamma=0.95, lmbda=0.9, time_dim=0)
    for o, w in zip(got, want):
        torch.testing.assert_close(o.cpu(), w, rtol=1e-9, atol=1e-9, equal_nan=True)


def test_tm_few_default_takes_four_lanes_or_more_and_leaves_32_streams_alone(monkeypatch,
                                                                            tuned):
    """By default (``tm_few=None``) the few-stream tile of a stream a lane is taken where
    it leaves 4 lanes or more along time (up to 8 streams), and not for 9-31 streams
    (2 lanes: the 8-warp tile); forced on, it takes 9-31 streams too; 32 streams or more
    keep the one-lane-a-stream tile (SUB 1) either way."""
    dev = torch.device("cpu")
    assert _launch.plan(12, 75, False, dev)[4] != 1  # (several warps along time)
    bn, bt, _, _, warps, scalar, _ = _launch.plan(8, 75, False, dev)
    assert (bn, bt, warps, scalar) == (8, 64, 1, True)  # 4 lanes of 16 steps a stream
    assert _launch.sub_lanes(bn, warps, scalar) == 4
    bn, bt, _, _, warps, scalar, _ = _launch.plan(3, 1000, False, dev)
    assert (bn, bt, scalar) == (4, 128, True) and _launch.sub_lanes(bn, warps, scalar) == 8
    tuned(tm_few=False)
    assert not _launch.plan(8, 75, False, dev)[5]
    tuned(tm_few=True)
    bn, bt, _, _, warps, scalar, _ = _launch.plan(12, 75, False, dev)
    assert (bn, bt, warps, scalar) == (16, 32, 1, True)  # 2 lanes of 16 steps a stream
    assert _launch.sub_lanes(bn, warps, scalar) == 2
    bn, bt, _, _, warps, scalar, _ = _launch.plan(40, 75, False, dev)
    assert bn == 32 and _launch.sub_lanes(bn, warps, scalar) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_tm_few_one_stream_in_short_segments(device, backend, tuned, gen):
    """One time-major stream (a strided view) of 600 steps leaves 32 lanes along time; in
    segments shorter than that (``segment_len=16``) each lane still takes a step or more
    (a 16-step chunk over 32 lanes did not compile), and the outputs match the reference."""
    tuned(segment_len=16, look_back=False)
    T = 600
    r, v = (torch.randn(T, 2, generator=gen)[:, :1] for _ in range(2))
    te, tr = (torch.rand(T, 1, generator=gen) < p for p in (0.02, 0.01))
    got = rc.gae(r.to(device), v.to(device), te.to(device), tr.to(device), gamma=0.97,
                 lmbda=0.9, time_dim=0)
    want = ref.gae(r.double(), v.double(), te, tr, gamma=0.97, lmbda=0.9, time_dim=0)
    for o, w in zip(got, want):
        torch.testing.assert_close(o.cpu().double(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["gae_shifted", "vtrace_shifted", "lambda_next_values",
                                  "traces", "linrec_forward"])
@pytest.mark.parametrize("plan", [PLANS[0], PLANS[2]], ids=lambda p: p[0])
def test_tm_few_with_next_chunk_first(case, plan, device, backend, tuned, monkeypatch):
    """The few-stream tile with the next chunk's loads first (``pipe=True``; the plan
    does not take it there by default): outputs and gradients against the float64
    reference over several chunks (75 steps in 32-step chunks), in one pass and in
    three launches of 64-step segments, and every loop launch took PIPE."""
    for k, v in plan[1].items():
        tuned(**{k: v})
    tuned(pipe=True)
    _, seen = _spy(monkeypatch)
    ta._check(case, (75, 12), 0, device, 99, gradcheck=None, cases=CASES)
    loops = [c for c in seen if c.get("SUB", 1) > 1 and c["PHASE"] in (0, 1, 2)]
    assert loops and all(c["PIPE"] for c in loops), seen
