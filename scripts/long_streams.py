"""Few long streams: each kernel launch's own time (torch.profiler), in launch order.

    python scripts/long_streams.py [--shapes 16x131072,1x1000000] [--out long.md]

The segmented plan launches the scan in phases (maps, [carries], outputs); this
prints the duration of each so a change to one phase can be judged on its own.
"""

from __future__ import annotations

import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _launch, _table


def calls(N, T, layout, dev, gen):
    """[N, T] tensors (time_dim=-1) for "bm", [T, N] (time_dim=0) for "tm"."""
    shape = (N, T) if layout == "bm" else (T, N)
    td = -1 if layout == "bm" else 0

    def f():
        return torch.randn(*shape, generator=gen).to(dev)

    def flag():
        return (torch.rand(*shape, generator=gen) < 0.01).to(dev)

    r, v, te, tr = f(), f(), flag(), flag()
    b = torch.randn(N, generator=gen).to(dev)
    lr = r * 0.3
    return {
        "gae": lambda: rc.gae(r, v, te, tr, bootstrap_value=b, time_dim=td),
        "vtrace": lambda: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, time_dim=td),
        "episodic_cumsum": lambda: rc.episodic_cumsum(r, te, time_dim=td),
    }


def kernel_times(fn, calls=10):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
           and "scan_kernel" in e.name]
    per = len(evs) // calls
    out = []
    for i in range(per):
        ds = sorted(e.device_time for e in evs[i::per])  # us
        out.append(ds[len(ds) // 2])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="16x131072,1x1000000,64x65536,256x16384")
    p.add_argument("--out", default="")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    lines = ["| estimator | shape | layout | plan (bn, bt, seg, S, warps, scalar, stages) "
             "| per launch us | sum us |", "|---|---|---|---|---|---|"]
    for s in a.shapes.split(","):
        N, T = (int(float(x)) for x in s.split("x"))
        for layout in ("bm", "tm"):
            plan = _launch.plan(N, T, layout == "bm", torch.device("cuda"), _table.MODE_GAE)
            for name, fn in calls(N, T, layout, "cuda", gen).items():
                ks = kernel_times(fn)
                lines.append(f"| {name} | {s} | {layout} | {plan} | "
                             f"{' + '.join(f'{k:.1f}' for k in ks)} | {sum(ks):.1f} |")
                print(lines[-1], flush=True)
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
