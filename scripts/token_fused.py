"""Whitened masked GAE in one launch (token_fused_kernel) against the scan and the
whitening pass (token_scan_kernel, whiten_kernel): device time by CUDA-graph replay,
the two-pass floor, and the largest difference between the two paths.

    python scripts/token_fused.py [--shapes 256x4096,128x4096,...]
"""
import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _token_kernel as K
from rl_triton_core.bench import harness
from rl_triton_core.bench import peers as P
from rl_triton_core.bench.tokens import inputs

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="256x4096,128x4096,264x4096,265x4096,256x2048,256x1024,"
                "64x1024,512x1024,1024x512")
ap.add_argument("--dtypes", default="float32,bfloat16")
opts = ap.parse_args()
timer = harness.Timer("cuda", 100)
print("| shape | values | path taken | one launch µs | two passes µs | floor µs | "
      "one launch / floor | max |diff| |")
print("|---|---|---|---:|---:|---:|---:|---:|")
for shape in opts.shapes.split(","):
    B, T = (int(s) for s in shape.split("x"))
    for dt in opts.dtypes.split(","):
        r, v, m = inputs(B, T, getattr(torch, dt), "cuda")
        f1 = P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32)
        adv = torch.empty(B, T, device="cuda")
        f2 = P.make_floor([adv], [], [], 1, (B, T), torch.float32)
        fl = (timer.measure(f1, graph=True)["device_us"]
              + timer.measure(f2, graph=True)["device_us"])

        def call(r=r, v=v, m=m):
            return rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                                 time_dim=-1)
        w, _ = K._fused_shape(T)
        taken = "one launch" if K._fused_fits(B, w, r.device) and T <= K.FUSED_MAX_T else \
            "two passes"
        K.FUSED = True
        a1, b1 = call()
        d1 = timer.measure(call, graph=True)["device_us"]
        K.FUSED = False
        a0, b0 = call()
        d0 = timer.measure(call, graph=True)["device_us"]
        K.FUSED = True
        diff = max((a1.float() - a0.float()).abs().max().item(),
                   (b1.float() - b0.float()).abs().max().item())
        print(f"| {shape} | {dt} | {taken} | {d1:.1f} | {d0:.1f} | {fl:.1f} | {d1 / fl:.2f} | "
              f"{diff:.1e} |", flush=True)
