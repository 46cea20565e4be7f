"""Device time of masked GAE (+ whitening) over the scan's chunk length and warps, and
over the whitening pass's grid and block.

    python scripts/token_sweep.py [--shapes 256x4096,1024x8192,4096x16384]
        [--configs BT:warps[:K],...] [--whiten-tiles per_sm:block:warps,...]

K: rows of 4K consecutive tokens per thread (1 when left out).
"""
import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _token_kernel as K
from rl_triton_core.bench import harness
from rl_triton_core.bench import peers as P
from rl_triton_core.bench.tokens import inputs

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="256x4096,1024x8192,4096x16384")
ap.add_argument("--configs", default=(
    "256:2,512:2,512:4,1024:4,1024:8,2048:4,2048:8"))
ap.add_argument("--whiten", default="0,1")
ap.add_argument("--mask", default="int64")
ap.add_argument("--whiten-tiles", default="",
                help="whitened rows only: the whitening pass's (programs per SM at most, "
                     "BLOCK, warps) as per_sm:block:warps joined by commas (default: "
                     "the library's)")
opts = ap.parse_args()
timer = harness.Timer("cuda", 100)
default, default_tile = K.config, K.WHITEN_TILE
w_tiles = [tuple(int(x) for x in t.split(":")) for t in opts.whiten_tiles.split(",") if t]
print("| shape | whiten | BT | warps | K | whitening tile | device µs | floor µs | ratio |")
print("|---|---|---:|---:|---:|---|---:|---:|---:|")
for shape in opts.shapes.split(","):
    B, T = (int(s) for s in shape.split("x"))
    r, v, m = inputs(B, T, torch.float32, "cuda")
    m = m.to(getattr(torch, opts.mask))
    f1 = P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32)
    adv = torch.empty(B, T, device="cuda")
    f2 = P.make_floor([adv], [], [], 1, (B, T), torch.float32)
    fl1 = timer.measure(f1, graph=True)["device_us"]
    fl2 = fl1 + timer.measure(f2, graph=True)["device_us"]
    for whiten in [w == "1" for w in opts.whiten.split(",")]:
        for cfg in opts.configs.split(","):
            bt, w, k = (*(int(x) for x in cfg.split(":")), 1)[:3]
            K.config = lambda n, t, bt=bt, w=w, k=k: (bt, w, k)
            for tile in (w_tiles or [default_tile]) if whiten else [default_tile]:
                K.WHITEN_TILE = tile
                name = ":".join(map(str, tile)) if whiten else "-"
                try:
                    def fn(r=r, v=v, m=m, whiten=whiten):
                        return rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=whiten,
                                             count_eps=1e-8, time_dim=-1)
                    d = timer.measure(fn, graph=True)["device_us"]
                except Exception as e:  # noqa: BLE001
                    print(f"| {shape} | {whiten} | {bt} | {w} | {k} | {name} | error "
                          f"{type(e).__name__}: {str(e)[:80]} | | |")
                    continue
                fl = fl2 if whiten else fl1
                print(f"| {shape} | {whiten} | {bt} | {w} | {k} | {name} | {d:.1f} | "
                      f"{fl:.1f} | {d / fl:.2f} |", flush=True)
    K.config, K.WHITEN_TILE = default, default_tile
