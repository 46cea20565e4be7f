"""Error of the kernels against float64 as T grows, per input dtype (issue 5's table).

    python scripts/precision_table.py [--out precision.md]

Inputs are drawn in float64, rounded to the tested dtype, and both the kernel (on
the GPU when there is one) and the float64 computation (the CPU path in float64,
itself checked against the reference by the tests) see the same rounded inputs, so
the table shows the kernel's own error: float32 accumulation plus the rounding of
the output to the input dtype. Errors are relative to the largest |output|.
"""

from __future__ import annotations

import argparse
import os

import torch

import rl_triton_core as rc

EST = {
    "gae": lambda d, td: rc.gae(d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"],
                                gamma=0.99, lmbda=0.95, time_dim=td)[0],
    "discounted_returns": lambda d, td: rc.discounted_returns(
        d["r"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.999, time_dim=td),
    "vtrace": lambda d, td: rc.vtrace(d["lr"], d["r"], d["v"], d["te"], d["tr"],
                                      bootstrap_value=d["b"], gamma=0.99, time_dim=td)[0],
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--max-t", type=int, default=1_000_000)
    a = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    N = 4
    lines = [f"device: {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}", "",
             "| estimator | T | episodes | float32 max | bfloat16 max | float16 max "
             "| float32 mean | bfloat16 mean | float16 mean |",
             "|---|---|---|---|---|---|---|---|---|"]
    T = 100
    while T <= a.max_t:
        for episodes in ("none", "~500 steps"):
            base = dict(r=torch.randn(N, T, generator=g, dtype=torch.float64),
                        v=torch.randn(N, T, generator=g, dtype=torch.float64),
                        lr=torch.randn(N, T, generator=g, dtype=torch.float64) * 0.3,
                        b=torch.randn(N, generator=g, dtype=torch.float64))
            p_end = 0.0 if episodes == "none" else 1 / 500
            base["te"] = torch.rand(N, T, generator=g) < p_end
            base["tr"] = torch.rand(N, T, generator=g) < p_end / 4
            for name, fn in EST.items():
                row_max, row_mean = [], []
                for dt in (torch.float32, torch.bfloat16, torch.float16):
                    rounded = {k: (x.to(dt) if x.is_floating_point() else x)
                               for k, x in base.items()}
                    want = fn({k: (x.double() if x.is_floating_point() else x)
                               for k, x in rounded.items()}, -1)
                    os.environ["RL_TRITON_CORE_BACKEND"] = "auto"
                    got = fn({k: x.to(dev) for k, x in rounded.items()}, -1).double().cpu()
                    scale = want.abs().max().item()
                    err = (got - want).abs()
                    row_max.append(err.max().item() / scale)
                    row_mean.append(err.mean().item() / scale)
                lines.append(f"| {name} | {T:,} | {episodes} | "
                             + " | ".join(f"{e:.1e}" for e in row_max + row_mean) + " |")
                print(lines[-1], flush=True)
        T *= 10
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
