"""Device time of the parts of masked GAE with whitening: where the time goes.

Times, by CUDA-graph replay, the scan alone (no statistics), the scan with the
whitening statistics (its whitening pass replaced by nothing), the whitening pass alone
(the scan replaced by nothing, on the statistics of a real call), the whole call, and
the floor's two passes.

    python scripts/token_parts.py [--shapes 256x4096,1024x8192]
"""
import argparse

import torch

import rl_triton_core as rc
from rl_triton_core import _token_kernel as K
from rl_triton_core.bench import harness
from rl_triton_core.bench import peers as P
from rl_triton_core.bench.tokens import inputs


class _Nothing:
    def __getitem__(self, grid):
        return lambda *a, **kw: None


ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="256x4096,1024x8192")
opts = ap.parse_args()
timer = harness.Timer("cuda", 100)
print("| shape | floor pass 1 | floor pass 2 | scan | scan + statistics | whitening pass | "
      "whole call |")
print("|---|---:|---:|---:|---:|---:|---:|")
for shape in opts.shapes.split(","):
    B, T = (int(s) for s in shape.split("x"))
    r, v, m = inputs(B, T, torch.float32, "cuda")
    adv = torch.empty(B, T, device="cuda")
    f1 = P.make_floor([r, v, m], [], [], 2, (B, T), torch.float32)
    f2 = P.make_floor([adv], [], [], 1, (B, T), torch.float32)

    def call(whiten, r=r, v=v, m=m):
        return rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=whiten, count_eps=1e-8,
                             time_dim=-1)

    t = {"f1": timer.measure(f1, graph=True)["device_us"],
         "f2": timer.measure(f2, graph=True)["device_us"],
         "scan": timer.measure(lambda: call(False), graph=True)["device_us"],
         "whole": timer.measure(lambda: call(True), graph=True)["device_us"]}
    real_w, real_s = K.whiten_kernel, K.token_scan_kernel
    try:
        K.whiten_kernel = _Nothing()
        t["stats"] = timer.measure(lambda: call(True), graph=True)["device_us"]
        K.whiten_kernel = real_w
        K.token_scan_kernel = _Nothing()  # the statistics buffer holds garbage: timing only
        t["whiten"] = timer.measure(lambda: call(True), graph=True)["device_us"]
    finally:
        K.whiten_kernel, K.token_scan_kernel = real_w, real_s
    print(f"| {shape} | {t['f1']:.1f} | {t['f2']:.1f} | {t['scan']:.1f} | {t['stats']:.1f} | "
          f"{t['whiten']:.1f} | {t['whole']:.1f} |", flush=True)
