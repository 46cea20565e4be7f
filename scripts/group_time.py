"""group_advantages on CUDA: device time of the one-launch kernel (CUDA-graph replay),
and the full call and back-to-back host cost of the kernel and of PyTorch's operations
(an eps of 1e-31, outside the kernel's range, takes the PyTorch path), at a few batch
sizes in groups of 8.

    python scripts/group_time.py [64,512,2048,4096]
"""

import functools
import sys
import time

import torch

import rl_triton_core as rc
from rl_triton_core.bench.harness import Timer

T = Timer("cuda", target_ms=20.0)


def b2b_host(fn, k=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    t = (time.perf_counter() - t0) * 1e6 / k
    torch.cuda.synchronize()
    return t


def main(sizes):
    torch.manual_seed(0)
    print("| B | method | kernel device us | kernel full us | kernel b2b host us | "
          "torch full us | torch b2b host us | max diff |")
    print("|---|---|---|---|---|---|---|---|")
    for B in sizes:
        s = torch.randn(B, device="cuda")
        g = (torch.arange(B, device="cuda") // 8)[torch.randperm(B, device="cuda")]
        for m in ("grpo", "rloo"):
            k = functools.partial(rc.group_advantages, s, g, method=m, num_groups=B)
            p = functools.partial(k, eps=1e-31)  # (outside the kernel's eps range)
            diff = (k() - p()).abs().max().item()
            dev = T._graph(k, 10.0)
            kf, tf = T._full(k, 50), T._full(p, 50)
            print(f"| {B} | {m} | {dev:.2f} | {kf:.1f} | {b2b_host(k):.1f} | {tf:.1f} | "
                  f"{b2b_host(p):.1f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,512,2048,4096").split(",")])
