"""group_advantages on CUDA at a few batch sizes (groups of 8): the one-launch kernel's
device time (CUDA-graph replay) and full call, against the full call of PyTorch's
operations (an eps of 1e-31, outside the kernel's range, takes that path), and the
largest difference between the two. The host cost back to back is host_cost.py's row.

    python scripts/group_time.py [64,512,2048,4096]
"""

import functools
import sys

import torch

import rl_triton_core as rc
from rl_triton_core.bench.harness import Timer

T = Timer("cuda", target_ms=20.0)


def main(sizes):
    torch.manual_seed(0)
    print("| B | method | kernel device us | kernel full us | torch full us | max diff |")
    print("|---|---|---|---|---|---|")
    for B in sizes:
        s = torch.randn(B, device="cuda")
        g = (torch.arange(B, device="cuda") // 8)[torch.randperm(B, device="cuda")]
        for m in ("grpo", "rloo"):
            k = functools.partial(rc.group_advantages, s, g, method=m, num_groups=B)
            p = functools.partial(k, eps=1e-31)  # (outside the kernel's eps range)
            diff = (k() - p()).abs().max().item()
            print(f"| {B} | {m} | {T._graph(k, 10.0):.2f} | {T._full(k, 50):.1f} | "
                  f"{T._full(p, 50):.1f} | {diff:.2e} |", flush=True)


if __name__ == "__main__":
    main([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "64,512,2048,4096").split(",")])
