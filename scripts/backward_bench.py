"""Backward time against forward time (issue 5's target: backward within 1.5x).

    python scripts/backward_bench.py [--out backward.md]

For each differentiable estimator and shape: the forward call without autograd,
the forward call that records the graph, and ``torch.autograd.grad`` of a weighted
sum of the outputs w.r.t. the float inputs, each as back-to-back time (CUDA events
around 20 calls, median of 5 rounds; it includes the host's launch cost where that
is longer than the GPU work), and the kernels' own time per call (the sum of the
kernel durations torch.profiler records: the device work without the host). The
gradients' correctness is the tests' job (tests/core/test_autograd.py: gradcheck and
the float64 reference).
"""

from __future__ import annotations

import argparse

import torch

import rl_triton_core as rc
from rl_triton_core.bench.harness import Timer

_TIMER = Timer("cuda", target_ms=5.0)


def _events(fn, k=20, rounds=5):
    """Back-to-back time per call (the harness's timer), median of ``rounds``."""
    for _ in range(3):
        fn()
    times = sorted(_TIMER._b2b(fn, k) for _ in range(rounds))
    return times[len(times) // 2]


def cases(N, T, dev, gen):
    def f(*s):
        return torch.randn(*s, generator=gen).to(dev)

    r, v, b = f(N, T), f(N, T), f(N)
    te = (torch.rand(N, T, generator=gen) < 0.01).to(dev)
    tr = (torch.rand(N, T, generator=gen) < 0.01).to(dev)
    lr = f(N, T) * 0.3
    out = {
        "gae": (lambda r, v, b: rc.gae(r, v, te, tr, bootstrap_value=b, time_dim=-1), (r, v, b)),
        "lambda_returns": (lambda r, v, b: rc.lambda_returns(r, v, te, tr, bootstrap_value=b,
                                                             time_dim=-1), (r, v, b)),
        "discounted_returns": (lambda r, b: rc.discounted_returns(r, te, tr, bootstrap_value=b,
                                                                  time_dim=-1), (r, b)),
        "vtrace": (lambda r, v, b: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, time_dim=-1),
                   (r, v, b)),
        "linear_recurrence": (lambda x, be: rc.linear_recurrence(x, be, time_dim=-1),
                              (r, torch.sigmoid(v))),
        "episodic_cumsum": (lambda x: rc.episodic_cumsum(x, te, time_dim=-1), (r,)),
    }
    return out


def _kernel_us(fn, calls=10):
    """GPU time per call: the sum of the kernels' durations (torch.profiler), so the
    host's launch cost is left out -- the comparison of the kernels' own work."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / calls


def _profile(name, shape, fn, calls=20):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    print(f"# profile: {name} {shape} backward, {calls} calls")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--shapes", default="4096x128,16384x512,65536x1024")
    p.add_argument("--profile", default="", help="an estimator whose backward to profile "
                   "(torch.profiler: the ops and kernels of one call, host and device time)")
    a = p.parse_args()
    dev = "cuda"
    gen = torch.Generator().manual_seed(0)
    lines = ["| estimator | shape | forward us | forward + graph us | backward us "
             "| backward / forward | forward kernels us | backward kernels us "
             "| backward / forward (kernels) |", "|---|---|---|---|---|---|---|---|---|"]
    for shape in a.shapes.split(","):
        N, T = (int(x) for x in shape.split("x"))
        for name, (fn, xs) in cases(N, T, dev, gen).items():
            leaves = [x.detach().clone().requires_grad_(True) for x in xs]
            try:
                out = fn(*leaves)
            except Exception as e:  # noqa: BLE001 - an estimator without a backward yet
                lines.append(f"| {name} | {shape} | - | - | - | n/a: {type(e).__name__} "
                             "| - | - | - |")
                continue
            outs = out if isinstance(out, tuple) else (out,)
            if not any(o.requires_grad for o in outs):
                lines.append(f"| {name} | {shape} | - | - | - | n/a: no backward | - | - | - |")
                continue
            ws = [torch.randn_like(o) for o in outs]

            def fwd_nograd(fn=fn, xs=xs):
                with torch.no_grad():
                    return fn(*xs)

            def fwd_graph(fn=fn, leaves=leaves):
                return fn(*leaves)

            def bwd(outs=outs, ws=ws, leaves=leaves):
                return torch.autograd.grad(outs, leaves, ws, retain_graph=True,
                                           allow_unused=True)

            if a.profile == name:
                _profile(name, shape, bwd)
            t_f = _events(fwd_nograd)
            t_fg = _events(fwd_graph)
            t_b = _events(bwd)
            k_f, k_b = _kernel_us(fwd_nograd), _kernel_us(bwd)
            lines.append(f"| {name} | {shape} | {t_f:.1f} | {t_fg:.1f} | {t_b:.1f} | "
                         f"{t_b / t_f:.2f}x | {k_f:.1f} | {k_b:.1f} | {k_b / k_f:.2f}x |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        open(a.out, "w").write(text)


if __name__ == "__main__":
    main()
