"""Bitwise repeatability on the GPU: the same inputs give identical bits run to run.

Every estimator (forward outputs) and every backward pass (input gradients), at shapes of
the benchmark (``rl_triton_core.bench.harness.SHAPES``), batch-major ``[N, T]`` and
time-major ``[T, N]`` (the thread-per-stream time-major tiles), with the cached launch on
and off, under each plan, forced with the tuning knobs:

* ``single_pass``: no time segments (``programs_per_sm=0``: the planner never splits);
* ``three_launches``: time split into 128-step segments, carried by three launches;
* ``look_back``: one launch with the look-back over maps, a segment per chunk of steps
  (``segment_len=16`` makes every shape segmented, also T = 128);
* ``look_back_natural``: the look-back forced on, time split where the planner splits it
  (as determinism_check.py's ``look_back`` at 50f9ca7);
* ``default``: whatever the planner picks (the look-back where it measured to pay:
  time-major 4096x128, 512x128 and 16x131072, batch-major 256x1024 on 132 SMs).

A case repeats ``REPEATS`` times (RL_DETERMINISM_REPEATS) and must give the same bits
every time; the failure lists every (estimator, shape) that differed.

Every plan must repeat: the look-back composes the maps entering a segment in an order
fixed by the segment's position (blocks of ``look_window`` segments), not by which
program published first (docs/notes.md item 36 measured the walk-back to the nearest
published carry differ in 4 of 432 cases on the H200).
"""

import os

import pytest
import torch

import rl_triton_core as rc

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # ~1-2 min on the H200

REPEATS = int(os.environ.get("RL_DETERMINISM_REPEATS", "5"))
# a subset of the benchmark's shapes (N streams, T steps): the two measured to differ,
# a small one, many long streams and a few very long ones
SHAPES = ((4096, 128), (512, 128), (256, 1024), (16384, 512), (16, 131072))
PLANS = {
    "single_pass": dict(programs_per_sm=0),
    "three_launches": dict(segment_len=128, look_back=False),
    "look_back": dict(segment_len=16, look_back=True),
    "look_back_natural": dict(look_back=True),
    "default": dict(),
}


def _inputs(N, T, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (N, T) if layout == "batch" else (T, N)
    d = {k: torch.randn(shape, generator=g) for k in ("r", "v", "x", "nv")}
    d["lr"] = 0.3 * torch.randn(shape, generator=g)
    d["te"] = torch.rand(shape, generator=g) < 0.02
    d["tr"] = torch.rand(shape, generator=g) < 0.01
    d["b"] = torch.randn(N, generator=g)
    d["q"] = torch.randn(shape + (3,), generator=g)
    d["p"] = torch.softmax(torch.randn(shape + (3,), generator=g), -1)
    d["a"] = torch.randint(0, 3, shape, generator=g)
    return {k: t.cuda() for k, t in d.items()}, (-1 if layout == "batch" else 0)


def _forward_calls(d, td):
    r, v, x, nv, lr, te, tr, b = (d[k] for k in ("r", "v", "x", "nv", "lr", "te", "tr", "b"))
    beta = torch.sigmoid(v)
    return {
        "gae": lambda: rc.gae(r, v, te, tr, bootstrap_value=b, gamma=0.99, lmbda=0.95,
                              time_dim=td),
        "lambda_returns": lambda: rc.lambda_returns(r, v, te, tr, next_values=nv, gamma=0.99,
                                                    lmbda=0.95, time_dim=td),
        "discounted_returns": lambda: rc.discounted_returns(r, te, tr, bootstrap_value=b,
                                                            gamma=0.99, time_dim=td),
        "vtrace": lambda: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, gamma=0.99,
                                    lmbda=0.95, time_dim=td),
        "retrace": lambda: rc.retrace(lr, r, v, nv, te, tr, gamma=0.99, lmbda=0.95,
                                      time_dim=td),
        "retrace_from_actions": lambda: rc.retrace_from_actions(
            d["q"], d["p"], d["a"], lr.clamp(max=0) - 1.1, r, te, tr, gamma=0.99, lmbda=0.95,
            time_dim=td),
        "eligibility_traces": lambda: rc.eligibility_traces(x, te, gamma=0.99, lmbda=0.9,
                                                            time_dim=td),
        "episodic_cumsum": lambda: rc.episodic_cumsum(x, te, time_dim=td),
        "linear_recurrence": lambda: rc.linear_recurrence(x, beta, time_dim=td),
        "linear_recurrence_fwd": lambda: rc.linear_recurrence(x, beta, reverse=False,
                                                              time_dim=td),
    }


def _grads(fn, wrt):
    xs = [t.detach().clone().requires_grad_(True) for t in wrt]
    out = fn(*xs)
    out = out if isinstance(out, tuple) else (out,)
    loss = sum((o * (k + 1.5)).sum() for k, o in enumerate(out))
    return torch.autograd.grad(loss, xs)


def _backward_calls(d, td):
    r, v, x, nv, lr, te, tr, b = (d[k] for k in ("r", "v", "x", "nv", "lr", "te", "tr", "b"))
    beta = torch.sigmoid(v)
    return {
        "gae_backward": lambda: _grads(lambda rr, vv, bb: rc.gae(
            rr, vv, te, tr, bootstrap_value=bb, gamma=0.99, lmbda=0.95, time_dim=td), (r, v, b)),
        "lambda_returns_backward": lambda: _grads(lambda rr, vv, nn: rc.lambda_returns(
            rr, vv, te, tr, next_values=nn, gamma=0.99, lmbda=0.95, time_dim=td), (r, v, nv)),
        "discounted_returns_backward": lambda: _grads(lambda rr, bb: rc.discounted_returns(
            rr, te, tr, bootstrap_value=bb, gamma=0.99, time_dim=td), (r, b)),
        "vtrace_backward": lambda: _grads(lambda rr, vv, bb: rc.vtrace(
            lr, rr, vv, te, tr, bootstrap_value=bb, gamma=0.99, lmbda=0.95, time_dim=td),
            (r, v, b)),
        "eligibility_traces_backward": lambda: _grads(lambda xx: rc.eligibility_traces(
            xx, te, gamma=0.99, lmbda=0.9, time_dim=td), (x,)),
        "episodic_cumsum_backward": lambda: _grads(lambda xx: rc.episodic_cumsum(
            xx, te, time_dim=td), (x,)),
        "linear_recurrence_backward": lambda: _grads(lambda xx, bb: rc.linear_recurrence(
            xx, bb, time_dim=td), (x, beta)),
    }


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "uncached"])
@pytest.mark.parametrize("layout", ["batch", "time"])
@pytest.mark.parametrize("plan", list(PLANS))
def test_bitwise_repeatable(plan, layout, cached, tuned):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tuned(cached_launch=cached, **PLANS[plan])
    differ = []
    for N, T in SHAPES:
        d, td = _inputs(N, T, layout)
        calls = {**_forward_calls(d, td), **_backward_calls(d, td)}
        for name, fn in calls.items():
            first = [t.clone() for t in _tuple(fn())]
            for k in range(1, REPEATS):
                again = _tuple(fn())
                bad = [i for i, (f, g) in enumerate(zip(first, again, strict=True))
                       if not torch.equal(f, g)]
                if bad:
                    n_bits = sum(int((first[i] != again[i]).sum()) for i in bad)
                    differ.append(f"{name} {N}x{T}: repeat {k} differs in output(s) {bad}, "
                                  f"{n_bits} elements")
                    break
        del d, calls
        torch.cuda.empty_cache()
    assert not differ, (f"not bitwise repeatable under plan={plan} layout={layout} "
                        f"cached={cached}:\n" + "\n".join(differ))
