"""Where the C kernel is not built (here: switched off, RL_TRITON_CORE_CPU_KERNEL=numba),
the CPU path's first call of a GAE variant runs in numpy (rl_triton_core.scan._cpu_first)
while numba loads in a background thread: its result must equal the numba path's bit for
bit, and the float64 reference within the usual tolerance."""

import os
import subprocess
import sys

import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import reference
from rl_triton_core.scan import _cpu_first

pytestmark = pytest.mark.skipif(
    os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
    reason="the numba CPU path only",
)


@pytest.fixture
def first_path(monkeypatch):
    """Every call takes the numpy path (as a process's first call does); no warm-up."""
    monkeypatch.setattr(_cpu_first, "ready", lambda key: False)
    monkeypatch.setattr(_cpu_first, "warm", lambda key, args: None)
    monkeypatch.setenv("RL_TRITON_CORE_CPU_FIRST", "1")
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")


def _numba(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setenv("RL_TRITON_CORE_CPU_FIRST", "0")
        m.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
        return fn()


def _case(name, g):
    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    def flags(*shape, p):
        return torch.rand(*shape, generator=g) < p

    if name == "short-batch":
        r, v = rnd(64, 100), rnd(64, 100)
        te, tr = flags(64, 100, p=0.03), flags(64, 100, p=0.03)
        return (r, v, te, tr), dict(time_dim=-1)
    if name == "long-batch-cuts":
        r, v = rnd(16, 1500), rnd(16, 1500)
        te, tr = flags(16, 1500, p=0.01), flags(16, 1500, p=0.01)
        return (r, v, te, tr), dict(time_dim=-1, bootstrap_value=rnd(16))
    if name == "flat-float-flags":  # RLlib's layout: one stream, float flags 2.0 / -1 / NaN
        T = 5000
        te = torch.zeros(T)
        tr = torch.zeros(T)
        ends = torch.randint(0, T, (40,), generator=g)
        te[ends[:20]] = torch.tensor([2.0, -1.0, float("nan"), 1.0] * 5)
        tr[ends[20:]] = 1.0
        return (rnd(T), rnd(T), te, tr), dict(time_dim=-1)
    if name == "time-major-next-values":
        r, v, nv = rnd(90, 8, 3), rnd(90, 8, 3), rnd(90, 8, 3)
        done = flags(90, 8, 1, p=0.05)
        return (r, v, done & flags(90, 8, 1, p=0.5), done), dict(time_dim=0, next_values=nv)
    if name == "tensor-coefficients":
        r, v = rnd(8, 700), rnd(8, 700)
        te = flags(8, 700, p=0.01)
        return (r, v, te, None), dict(time_dim=1, gamma=torch.rand(8, 700, generator=g),
                                      lmbda=torch.rand(700, generator=g))
    if name == "float64":
        r, v = rnd(4, 300, dtype=torch.float64), rnd(4, 300, dtype=torch.float64)
        return (r, v, flags(4, 300, p=0.02), None), dict(time_dim=-1, gamma=0.9, lmbda=0.7)
    if name == "bfloat16":
        r, v = rnd(4, 50, dtype=torch.bfloat16), rnd(4, 50, dtype=torch.bfloat16)
        return (r, v, flags(4, 50, p=0.05), None), dict(time_dim=-1)
    if name == "batch-major-next-values":  # TorchRL's [B, T, 1] layout, time_dim=-2
        r, v, nv = rnd(300, 128, 1), rnd(300, 128, 1), rnd(300, 128, 1)
        done = flags(300, 128, 1, p=0.02)
        return (r, v, done & flags(300, 128, 1, p=0.5), done), dict(time_dim=-2,
                                                                   next_values=nv)
    if name == "short-tensor-coefficients":  # beta as a table in scan order; some zero
        gam = torch.rand(32, 90, generator=g)
        gam[gam < 0.05] = 0.0
        return (rnd(32, 90), rnd(32, 90), flags(32, 90, p=0.05), flags(32, 90, p=0.05)), dict(
            time_dim=-1, gamma=gam, lmbda=torch.rand(90, generator=g))
    if name == "zero-lambda":  # every beta is 0: h = alpha exactly, no carry
        return (rnd(16, 60), rnd(16, 60), flags(16, 60, p=0.1), None), dict(
            time_dim=-1, lmbda=0.0)
    if name == "nonfinite-cut":  # NaN and inf before done steps stop there; -0.0 values
        r, v = rnd(8, 200), rnd(8, 200)
        te = flags(8, 200, p=0.05)
        te[:, 100] = True
        r[:, 101:103] = float("nan")
        v[:, 104] = float("inf")
        r[:, 50], v[:, 50] = -0.0, 0.0
        return (r, v, te, None), dict(time_dim=-1)
    if name == "one-long-piece":  # no done in 6000 steps: numba in the foreground
        return (rnd(6000), rnd(6000), torch.zeros(6000, dtype=torch.bool), None), dict(
            time_dim=-1)
    raise KeyError(name)


CASES = ["short-batch", "long-batch-cuts", "flat-float-flags", "time-major-next-values",
         "tensor-coefficients", "float64", "bfloat16", "batch-major-next-values",
         "short-tensor-coefficients", "zero-lambda", "nonfinite-cut", "one-long-piece"]


@pytest.mark.parametrize("name", CASES)
def test_first_call_equals_numba_bitwise(name, first_path, monkeypatch):
    g = torch.Generator().manual_seed(CASES.index(name))
    args, kw = _case(name, g)
    adv, tgt = rc.gae(*args, **kw)
    want_adv, want_tgt = _numba(monkeypatch, lambda: rc.gae(*args, **kw))
    assert torch.equal(_bits(adv), _bits(want_adv)) and torch.equal(_bits(tgt), _bits(want_tgt))
    shape = args[0].shape

    def wide(x, full=True):  # the reference takes float64 tensors of the data's shape
        if not torch.is_tensor(x):
            return x
        x = torch.broadcast_to(x, shape) if full else x
        return x.double() if x.is_floating_point() else x

    ref_adv, ref_tgt = reference.gae(
        *(wide(a) for a in args),
        **{k: wide(x, k != "bootstrap_value") for k, x in kw.items()})
    tol = 1e-2 if adv.dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(adv.double(), ref_adv, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(tgt.double(), ref_tgt, rtol=tol, atol=tol, equal_nan=True)


def _bits(t):
    """The tensor's bits (the sign of zero included), every NaN as one: a NaN's sign and
    payload are the compiler's choice (LLVM may swap a commutative add's operands, and
    x86 returns the first operand's NaN), so they are not compared."""
    t = torch.where(t.isnan(), torch.full_like(t, float("nan")), t)
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def test_first_call_out_and_inputs_untouched(first_path):
    g = torch.Generator().manual_seed(9)
    r, v = torch.randn(6, 40, generator=g), torch.randn(6, 40, generator=g)
    te = torch.rand(6, 40, generator=g) < 0.1
    copies = [t.clone() for t in (r, v, te)]
    out = (torch.full((6, 40), float("nan")), torch.full((6, 40), float("nan")))
    res = rc.gae(r, v, te, time_dim=-1, out=out)
    assert res[0] is out[0] and res[1] is out[1]
    assert all(torch.equal(a, b) for a, b in zip((r, v, te), copies))
    want = reference.gae(r.double(), v.double(), te, time_dim=-1)
    torch.testing.assert_close(out[0].double(), want[0], rtol=1e-5, atol=1e-5)


def test_fresh_process_first_call_needs_no_numba():
    """The first call returns without numba imported (the warm-up thread is what imports
    it); the second call, after the warm-up, runs numba and gives the same bits."""
    code = (
        "import sys, torch, rl_triton_core as rc\n"
        "from rl_triton_core.scan import _cpu_first\n"
        "started = []\n"
        "orig = _cpu_first.warm\n"
        "def warm(key, args):\n"
        "    started.append('numba' in sys.modules)\n"
        "    orig(key, args)\n"
        "_cpu_first.warm = warm\n"
        "g = torch.Generator().manual_seed(0)\n"
        "r, v = torch.randn(4040, generator=g), torch.randn(4040, generator=g)\n"
        "te = (torch.rand(4040, generator=g) < 0.01).float()\n"
        "a = rc.gae(r, v, te, te, time_dim=-1)\n"
        "b = rc.gae(r, v, te, te, time_dim=-1)\n"
        "assert started == [False], started\n"
        "assert 'numba' in sys.modules\n"
        "assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RL_TRITON_CORE_CPU_FIRST"}
    env["RL_TRITON_CORE_CPU_KERNEL"] = "numba"
    env.pop("RL_TRITON_CORE_BACKEND", None)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
