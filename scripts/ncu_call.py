"""One call of an estimator under a tuning variant, for Nsight Compute: three warm-up
calls (compiles, the cached launch), then one call between cudaProfilerStart/Stop, so
``ncu --profile-from-start off`` profiles exactly that call's kernels.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \\
        python scripts/ncu_call.py 1x1000000b gae lbrow4kw64

Shapes and variants as ``scripts/tm_sweep.py`` (``b``: batch-major); ``floor`` as the
variant profiles the benchmark's same-bytes floor kernel instead.
"""

import sys

import torch
from tm_sweep import VARIANTS, _inputs, _tuned, estimator_calls  # a sibling script

from rl_triton_core.bench.peers import make_floor


def main(argv):
    shape_s, est, variant = argv
    N, T = map(int, shape_s.rstrip("b").split("x"))
    batch = shape_s.endswith("b")
    shape, td = ((N, T), -1) if batch else ((T, N), 0)
    calls, floors = estimator_calls(*_inputs(shape, N), td)
    fn, (narrow, per_stream, n_out) = calls[est], floors[est]
    if variant == "floor":
        f = make_floor(narrow, [], per_stream, n_out, shape, torch.float32)
    else:
        f = _tuned(fn, VARIANTS[variant])
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(sys.argv[1:])
