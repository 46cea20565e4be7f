"""The look-back (PHASE 4, a chunk per program) on the GPU, forced on with 16-step
segments, where programs really wait on each other (128-1024 segments a stream block),
and one batch-major stream under the plan's own choices, against float64 on fresh random
inputs; the launches are checked to have taken the plan. The interpreter's tests
(test_look_back.py) cover the gradients and the windows."""

import pytest
import torch
from core_testlib import spy_launch_consts

import rl_triton_core as rc
import rl_triton_core.reference as ref

pytestmark = pytest.mark.gpu

# (N, T, time_dim): time-major thread-per-stream tiles (several stream blocks) and two
# batch-major streams
LAYOUTS = [(96, 2048, 0), (2, 16384, -1)]


def _calls(N, T, td, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (T, N) if td == 0 else (N, T)
    r, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    lr = 0.5 * torch.randn(shape, generator=g)
    te, tr = torch.rand(shape, generator=g) < 0.02, torch.rand(shape, generator=g) < 0.01
    b = torch.randn(N, generator=g)

    def on(dev):
        return {k: t.to(dev, dtype if t.is_floating_point() else t.dtype)
                for k, t in dict(r=r, v=v, lr=lr, te=te, tr=tr, b=b).items()}

    return {
        "gae": lambda m, c: m.gae(c["r"], c["v"], c["te"], c["tr"], bootstrap_value=c["b"],
                                  gamma=0.99, lmbda=0.95, time_dim=td),
        "vtrace": lambda m, c: m.vtrace(c["lr"], c["r"], c["v"], c["te"], c["tr"],
                                        bootstrap_value=c["b"], gamma=0.99, time_dim=td),
        "episodic_cumsum": lambda m, c: m.episodic_cumsum(c["r"], c["te"], time_dim=td),
    }, on


def _close(got, want, name, seed):
    """Each output of a float32 GPU call within 1e-4 (relative, and of the largest value)
    of float64 on the CPU."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(got, want):
        torch.testing.assert_close(o.double().cpu(), w, rtol=1e-4,
                                   atol=1e-4 * float(w.abs().max()),
                                   msg=lambda m: f"{name} seed {seed}: {m}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_look_back_against_reference(layout, monkeypatch, tuned):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    seen = spy_launch_consts(monkeypatch)
    N, T, td = layout
    tuned(look_back=True)
    tuned(segment_len=16)
    tuned(cached_launch=False)
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    calls, on = _calls(N, T, td, torch.float32, seed)
    dev, cpu64 = on("cuda"), on("cpu")
    cpu64 = {k: t.double() if t.is_floating_point() else t for k, t in cpu64.items()}
    for name, fn in calls.items():
        _close(fn(rc, dev), fn(ref, cpu64), name, seed)
    assert seen and all(c["PHASE"] == 4 for c in seen), seen


@pytest.mark.parametrize("T", [70_000, 600_000])
def test_one_stream_plan_against_reference(T, monkeypatch, tuned):
    """One batch-major stream under the plan's own choices: the one-row tile of 1024
    float32 steps, as the look-back (69 chunks) and as three launches (586 chunks: more
    than 512), against float64 on the CPU (the reference module at 70,000 steps; the
    CPU path, itself checked against it, at 600,000, where the reference's loop takes
    a minute)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tuned(cached_launch=False)
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    calls, on = _calls(1, T, -1, torch.float32, seed)
    cpu64 = {k: t.double() if t.is_floating_point() else t for k, t in on("cpu").items()}
    want = {name: fn(ref if T < 100_000 else rc, cpu64) for name, fn in calls.items()}
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    seen = spy_launch_consts(monkeypatch)
    dev = on("cuda")
    for name, fn in calls.items():
        _close(fn(rc, dev), want[name], name, seed)
    phases = [4] if T < 100_000 else [1, 3, 2]
    assert len(seen) == len(phases) * len(calls), seen
    assert [c["PHASE"] for c in seen[:len(phases)]] == phases, seen
    assert all(c["BLOCK_N"] == 1 and c["BLOCK_T"] == 1024 for c in seen if c["PHASE"] != 3)
