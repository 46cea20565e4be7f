"""Are the outputs bitwise identical run to run? Every estimator at the benchmark's shapes,
batch- and time-major, under each plan (the default, the look-back forced on and off,
the cached launch off), forward and the GAE / V-trace backward.

    python scripts/determinism_check.py [--shapes 4096x128,...] [--repeats 5] [--out f.md]

Prints one line per (plan, estimator, shape, layout) that differed between repeats, and a
summary table. Needs CUDA.
"""

from __future__ import annotations

import argparse
import collections

import torch

import rl_triton_core as rc

SHAPES = "4096x128,512x128,32768x32,16384x16,256x1024,16384x512,1024x4096,16x131072,1x1000000"
PLANS = {"default": {}, "look_back": {"look_back": True}, "three_launches": {"look_back": False},
         "uncached": {"cached_launch": False}}


def calls(d, td):
    r, v, lr, te, tr, b, x = d["r"], d["v"], d["lr"], d["te"], d["tr"], d["b"], d["x"]
    return {
        "gae": lambda: rc.gae(r, v, te, tr, bootstrap_value=b, gamma=0.99, lmbda=0.95,
                              time_dim=td),
        "lambda_returns": lambda: rc.lambda_returns(r, v, te, tr, bootstrap_value=b,
                                                    gamma=0.99, lmbda=0.95, time_dim=td),
        "vtrace": lambda: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, gamma=0.99,
                                    time_dim=td),
        "retrace": lambda: rc.retrace(lr, r, v, x, te, tr, gamma=0.99, lmbda=0.95, time_dim=td),
        "eligibility_traces": lambda: rc.eligibility_traces(x, te, gamma=0.99, lmbda=0.9,
                                                            time_dim=td),
        "episodic_cumsum": lambda: rc.episodic_cumsum(x, te, time_dim=td),
        "linear_recurrence": lambda: rc.linear_recurrence(x, torch.sigmoid(v), time_dim=td),
        "gae_backward": lambda: _grads(lambda rr, vv: rc.gae(rr, vv, te, tr, bootstrap_value=b,
                                                               time_dim=td), r, v),
        "vtrace_backward": lambda: _grads(lambda rr, vv: rc.vtrace(lr, rr, vv, te, tr,
                                                                    bootstrap_value=b,
                                                                    time_dim=td), r, v),
    }


def _grads(fn, r, v):
    rr, vv = r.clone().requires_grad_(True), v.clone().requires_grad_(True)
    out = fn(rr, vv)
    loss = sum((o * (i + 1.5)).sum() for i, o in enumerate(out))
    return torch.autograd.grad(loss, (rr, vv))


def inputs(N, T, layout, gen):
    shp = (N, T) if layout == "bm" else (T, N)
    d = {k: torch.randn(shp, generator=gen) for k in ("r", "v", "x")}
    d["lr"] = torch.randn(shp, generator=gen) * 0.3
    d["te"] = torch.rand(shp, generator=gen) < 0.02
    d["tr"] = torch.rand(shp, generator=gen) < 0.01
    d["b"] = torch.randn(N, generator=gen)
    return {k: t.cuda() for k, t in d.items()}, (-1 if layout == "bm" else 0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    bad = collections.Counter()
    total = collections.Counter()
    lines = []
    for s in a.shapes.split(","):
        N, T = (int(float(x)) for x in s.split("x"))
        for layout in ("bm", "tm"):
            d, td = inputs(N, T, layout, gen)
            for plan, knobs in PLANS.items():
                with rc.tuning(**knobs):
                    for name, fn in calls(d, td).items():
                        first = fn()
                        first = first if isinstance(first, tuple) else (first,)
                        same = True
                        for _ in range(a.repeats - 1):
                            again = fn()
                            again = again if isinstance(again, tuple) else (again,)
                            same &= all(torch.equal(f, g) for f, g in zip(first, again))
                        total[plan] += 1
                        if not same:
                            bad[plan] += 1
                            line = f"DIFFERS: {plan} {name} {s} {layout}"
                            lines.append(line)
                            print(line, flush=True)
    summary = ["| plan | cases | not bitwise identical |", "|---|---|---|"]
    summary += [f"| {k} | {total[k]} | {bad[k]} |" for k in PLANS]
    text = "\n".join(lines + [""] + summary)
    print("\n".join(summary))
    if a.out:
        open(a.out, "w").write(text + "\n")


if __name__ == "__main__":
    main()
