"""Device time of whitened masked GAE over the whitening pass's grid and block.

    python scripts/whiten_sweep.py [--shapes 256x4096,1024x8192] [--tiles per_sm:block:warps,...]
"""
import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _token_kernel as K
from rl_triton_core.bench import harness
from rl_triton_core.bench import peers as P
from rl_triton_core.bench.tokens import inputs

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="256x4096,1024x8192")
ap.add_argument("--tiles", default=("16:1024:4,1:1024:4,2:1024:4,4:1024:4,8:1024:4,"
                                    "2:2048:8,4:2048:8,1:4096:8,2:4096:16,8:512:4,16:512:2"))
ap.add_argument("--rounds", type=int, default=3)
opts = ap.parse_args()
timer = harness.Timer("cuda", 100)
default = K.whiten_tile
print("| shape | per SM | block | warps | device µs | floor µs | ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
for shape in opts.shapes.split(","):
    B, T = (int(s) for s in shape.split("x"))
    r, v, m = inputs(B, T, torch.float32, "cuda")
    f1 = P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32)
    adv = torch.empty(B, T, device="cuda")
    f2 = P.make_floor([adv], [], [], 1, (B, T), torch.float32)
    fl = timer.measure(f1, graph=True)["device_us"] + timer.measure(f2, graph=True)["device_us"]

    def fn(r=r, v=v, m=m):
        return rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                             time_dim=-1)
    K.whiten_tile = default
    want = fn()[0].clone()
    tiles = [tuple(int(x) for x in t.split(":")) for t in opts.tiles.split(",")]
    times = {t: [] for t in tiles}
    for _ in range(opts.rounds):
        for t in tiles:
            K.whiten_tile = lambda n, e, t=t: t
            got = fn()[0]
            if not torch.allclose(got, want, atol=1e-5, rtol=1e-5):
                times[t].append(float("nan"))
                continue
            times[t].append(timer.measure(fn, graph=True)["device_us"])
    K.whiten_tile = default
    for t, ts in times.items():
        d = sorted(ts)[len(ts) // 2]
        print(f"| {shape} | {t[0]} | {t[1]} | {t[2]} | {d:.1f} | {fl:.1f} | {d / fl:.2f} |",
              flush=True)
