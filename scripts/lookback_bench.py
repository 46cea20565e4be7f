"""Segmented plans: three launches (maps, middle pass, outputs) against one launch
with a look-back over the segments' maps (``Tuning.look_back``), device time by CUDA-graph
replay, and the look-back's outputs against the three-launch ones.

    python scripts/lookback_bench.py [--out lookback.md]
"""

from __future__ import annotations

import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _config
from rl_triton_core.bench.harness import Timer

_TIMER = Timer("cuda", target_ms=5.0)
SHAPES = "4096x128:tm,512x128:tm,256x1024:bm,256x1024:tm,1024x4096:tm,16x131072:bm,16x131072:tm," \
         "1x1000000:bm,256x16384:tm,64x65536:bm"


def graph_us(fn):
    return _TIMER._graph(fn, _TIMER._b2b(fn, 10))


def calls(N, T, layout, gen):
    shape = (N, T) if layout == "bm" else (T, N)
    td = -1 if layout == "bm" else 0

    def f():
        return torch.randn(*shape, generator=gen).cuda()

    r, v = f(), f()
    te = (torch.rand(*shape, generator=gen) < 0.01).cuda()
    tr = (torch.rand(*shape, generator=gen) < 0.01).cuda()
    b = torch.randn(N, generator=gen).cuda()
    lr = 0.3 * r
    return {
        "gae": lambda: rc.gae(r, v, te, tr, bootstrap_value=b, time_dim=td),
        "vtrace": lambda: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, time_dim=td),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--out", default="")
    a = p.parse_args()
    base_tune = _config.current_tuning().replace(cached_launch=False)  # reach the planner
    gen = torch.Generator().manual_seed(0)
    lines = ["| estimator | shape | layout | 3 launches us | look-back us | ratio | max diff |",
             "|---|---|---|---|---|---|---|"]
    for item in a.shapes.split(","):
        s, layout = item.split(":")
        N, T = (int(float(x)) for x in s.split("x"))
        for name, fn in calls(N, T, layout, gen).items():
            _config.set_tuning(base_tune.replace(look_back=False))
            base = fn()
            t3 = graph_us(fn)
            _config.set_tuning(base_tune.replace(look_back=True))
            got = fn()
            torch.cuda.synchronize()
            diff = max((g - b_).abs().max().item() for g, b_ in
                       zip(got if isinstance(got, tuple) else (got,),
                           base if isinstance(base, tuple) else (base,)))
            t1 = graph_us(fn)
            _config.set_tuning(base_tune.replace(look_back=False))
            lines.append(f"| {name} | {s} | {layout} | {t3:.1f} | {t1:.1f} | {t1 / t3:.2f} | "
                         f"{diff:.1e} |")
            print(lines[-1], flush=True)
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
