"""How close the fastest scans anyone ships come to the same-bytes floor, beside ours.

    python scripts/scan_reference.py 1x1000000,16x131072,16x131072t,1024x4096t,4096x128t

For each shape (N streams x T steps; ``t`` at the end: time-major ``[T, N]``, else
batch-major ``[N, T]``), float32, device time by the benchmark's CUDA-graph replay:

- ``copy``: the benchmark's floor kernel reading x and writing one output (the bytes of
  a cumulative sum);
- ``torch.cumsum``: PyTorch's scan along time (CUB's decoupled look-back for one
  stream, torch's own scan kernels otherwise), the bytes of ``copy``;
- ``floor``: the floor kernel with ``episodic_cumsum``'s bytes (x, bool flags, one
  output), and ``ours``: ``episodic_cumsum`` with 2% done flags.

The ratio that matters for a target of "N x the floor": torch.cumsum / copy against
ours / floor.
"""

import sys

import torch
from tm_sweep import gtime  # (a sibling script: the benchmark's CUDA-graph replay timer)

import rl_triton_core as rc
from rl_triton_core.bench.peers import make_floor


def main(shapes):
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for s in shapes.split(","):
        tm = s.endswith("t")
        N, T = map(int, s.rstrip("t").split("x"))
        shape, dim = ((T, N), 0) if tm else ((N, T), -1)
        x = torch.randn(shape, device="cuda")
        d = torch.rand(shape, device="cuda") < 0.02
        copy = gtime(make_floor([x], [], [], 1, shape, torch.float32))
        cum = gtime(lambda x=x, dim=dim: torch.cumsum(x, dim))
        floor = gtime(make_floor([x, d], [], [], 1, shape, torch.float32))
        ours = gtime(lambda x=x, d=d, dim=dim: rc.episodic_cumsum(x, d, time_dim=dim))
        print(f"{s}: copy {copy:.1f} us, torch.cumsum {cum:.1f} ({cum / copy:.2f}x copy); "
              f"floor {floor:.1f}, episodic_cumsum {ours:.1f} ({ours / floor:.2f}x floor)",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else
         "1x1000000,16x131072,16x131072t,1024x4096t,512x4096t,4096x128t,16384x512t")
