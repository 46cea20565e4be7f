"""The one-launch segmented plans on the GPU, where the look-back really waits on other
programs: PHASE 4 (a chunk per program) and PHASE 5 (``Tuning.chained``: a segment of
several chunks per program), against the float64 reference on fresh random inputs; the
launch is checked to have taken the plan."""

import pytest
import torch
from core_testlib import spy_launch_consts

import rl_triton_core as rc
import rl_triton_core.reference as ref

pytestmark = pytest.mark.gpu

# (N, T, time_dim, the chained plan's segment length): time-major thread-per-stream tiles
# (several stream blocks; 16-step chunks) and two batch-major streams (512-step chunks),
# 8 segments of several chunks each
LAYOUTS = [(96, 2048, 0, 256), (2, 16384, -1, 2048)]
PLANS = {"look_back": dict(look_back=True, segment_len=16),
         "chained": dict(look_back=False, chained=True)}


def _calls(N, T, td, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (T, N) if td == 0 else (N, T)
    r, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    lr = 0.5 * torch.randn(shape, generator=g)
    te, tr = torch.rand(shape, generator=g) < 0.02, torch.rand(shape, generator=g) < 0.01
    b = torch.randn(N, generator=g)

    def on(dev):
        c = {k: t.to(dev, dtype if t.is_floating_point() else t.dtype)
             for k, t in dict(r=r, v=v, lr=lr, te=te, tr=tr, b=b).items()}
        return c

    return {
        "gae": lambda m, c: m.gae(c["r"], c["v"], c["te"], c["tr"], bootstrap_value=c["b"],
                                  gamma=0.99, lmbda=0.95, time_dim=td),
        "vtrace": lambda m, c: m.vtrace(c["lr"], c["r"], c["v"], c["te"], c["tr"],
                                        bootstrap_value=c["b"], gamma=0.99, time_dim=td),
        "episodic_cumsum": lambda m, c: m.episodic_cumsum(c["r"], c["te"], time_dim=td),
    }, on


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_launch_plans_against_reference(layout, plan, monkeypatch, tuned):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    seen = spy_launch_consts(monkeypatch)
    N, T, td, seg = layout
    knobs = dict(PLANS[plan], cached_launch=False)
    knobs.setdefault("segment_len", seg)
    for k, v in knobs.items():
        tuned(**{k: v})
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    calls, on = _calls(N, T, td, torch.float32, seed)
    dev, cpu64 = on("cuda"), on("cpu")
    cpu64 = {k: t.double() if t.is_floating_point() else t for k, t in cpu64.items()}
    for name, fn in calls.items():
        got = fn(rc, dev)
        want = fn(ref, cpu64)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for o, w in zip(got, want):
            scale = float(w.abs().max())
            torch.testing.assert_close(o.double().cpu(), w, rtol=1e-4, atol=1e-4 * scale,
                                       msg=lambda m, name=name: f"{name} seed {seed}: {m}")
    phase = 4 if plan == "look_back" else 5
    assert seen and all(c["PHASE"] == phase for c in seen), seen
