"""Time-major programs with several warps along time (``Tuning.tm_warps``: the scan
kernel's SUB > 1, ``_sub_scan``): outputs and gradients against autograd through the
float64 reference, in each plan that can take them -- one pass over chunks (PHASE 0),
three launches (PHASE 1, 3, 2) and the look-back (PHASE 4, bounded and, with every
stream block full and T whole chunks, without bounds) -- and in float32 and float16
against the reference's float64 outputs. The interpreter runs it on CPU tensors; on a
GPU the same tests run the compiled kernel."""

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

# (name, knobs, phases): tm_steps 8 keeps the interpreter's tiles small
PLANS = [
    ("one pass", dict(tm_warps=4, tm_steps=8, programs_per_sm=0), [0]),
    # (CUDA: at most 64 registers a thread, spilling)
    ("one pass, 64 registers", dict(tm_warps=4, programs_per_sm=0, max_registers=64), [0]),
    ("three launches", dict(tm_warps=2, tm_steps=8, segment_len=16, look_back=False), [1, 3, 2]),
    ("look-back", dict(tm_warps=4, tm_steps=8, segment_len=32, look_back=True,
                       look_window=2), [4]),
]
# [T, N] time-major: 40 streams (a partial second block) over 75 steps (a partial last
# chunk), and 64 x 64 (every block full, T whole chunks: the look-back's EVEN tile)
SHAPES = [(75, 40), (64, 64)]


@pytest.fixture
def backend(monkeypatch, tuned):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(cached_launch=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
@pytest.mark.parametrize("case", ["gae_shifted", "lambda_shifted", "vtrace_shifted",
                                  "linrec_reverse", "linrec_forward", "traces", "cumsum"])
def test_tm_warps_forward_and_backward_fp64(case, plan, shape, device, backend, tuned,
                                            monkeypatch):
    _, knobs, phases = plan
    for k, v in knobs.items():
        tuned(**{k: v})
    kernels, seen = [], []
    real = _launch.launch

    def spy(*a, **k):
        res = real(*a, **k)
        kernels.extend(kernel for kernel, _, _ in res[3])
        seen.extend(c for _, _, c in res[3])
        return res

    monkeypatch.setattr(_launch, "launch", spy)
    fn, wrt = ta.CASES[case]
    wrt = wrt.split()
    inputs = {k: (v.to(device) if torch.is_tensor(v) else v)
              for k, v in ta._inputs(4321, shape, 0, "cpu").items()}
    xs = [inputs[k].requires_grad_(True) for k in wrt]
    out = fn(rc, dict(inputs, **dict(zip(wrt, xs))), 0)
    out = out if isinstance(out, tuple) else (out,)
    ref_in = {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in inputs.items()}
    ref_xs = [ref_in[k].clone().requires_grad_(True) for k in wrt]
    want = fn(ref, dict(ref_in, **dict(zip(wrt, ref_xs))), 0)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(out, want):
        torch.testing.assert_close(o.detach().cpu(), w.detach(), rtol=1e-9, atol=1e-9)
    g = torch.Generator().manual_seed(11)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    got = torch.autograd.grad(sum((o * w.to(device)).sum() for o, w in zip(out, weights)), xs)
    exp = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), ref_xs)
    for name, gg, wg in zip(wrt, got, exp):
        torch.testing.assert_close(gg.cpu(), wg, rtol=1e-9, atol=1e-9, msg=f"d/d{name}")
    # every scan launch split its chunks among the warps, in the plan asked for
    scans = [c for c in seen if "SUB" in c]
    assert scans and all(c["SUB"] == knobs["tm_warps"] for c in scans), seen
    assert sorted({c["PHASE"] for c in scans}) == sorted(phases), seen
    if phases == [4]:
        even = [c["EVEN"] for c in scans]
        assert all(even) if shape == (64, 64) else not any(even), seen
    if device != "cpu" and "max_registers" in knobs:  # ptxas kept to the limit
        assert all(k.n_regs <= knobs["max_registers"] for k in kernels), [
            k.n_regs for k in kernels]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: p[0])
def test_tm_warps_low_precision(plan, dtype, device, backend, tuned):
    """Random flags (both kinds) and non-uniform strides (a time-major view of a wider
    tensor), NaN-poisoned outputs, against the float64 reference."""
    for k, v in plan[1].items():
        tuned(**{k: v})
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    T, N = 70, 45
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


def test_tm_warps_and_max_registers_are_checked():
    for bad in (0, 3, 64, True, 2.0):
        with pytest.raises(ValueError, match="tm_warps"):
            rc.Tuning(tm_warps=bad)
    assert rc.Tuning(tm_warps=None).tm_warps is None and rc.Tuning(tm_warps=8).tm_warps == 8
    for bad in (0, 15, 256, True, 96.0):
        with pytest.raises(ValueError, match="max_registers"):
            rc.Tuning(max_registers=bad)
    assert rc.Tuning(max_registers=96).max_registers == 96
