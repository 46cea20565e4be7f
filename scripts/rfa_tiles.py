"""Device time of retrace_from_actions' fused pass per tile (BLOCK_N x BLOCK_T x warps)
against the two passes, on the GPU:

    python scripts/rfa_tiles.py [--shapes 512x128,...] [--actions 6] [--rounds 3]

Each tile's targets are compared with the two-pass path's before timing (CUDA-graph
replay, the harness's timer); rounds are interleaved and the median is reported."""

from __future__ import annotations

import argparse
import functools
import statistics

import torch
import triton
from tile_sweep import graph_us  # scripts/ is on the path when run as a script

import rl_triton_core as rc
from rl_triton_core import _config


def tiles_for(T):
    tp = max(16, triton.next_power_of_2(T))
    out = []
    for bn in (1, 2, 4, 8, 16, 32, 64):
        if bn * tp > 4096 or bn * tp < 32:
            continue
        for ept in (1, 2, 4):
            w = bn * tp // (32 * ept)
            if 1 <= w <= 16 and (bn * tp) % (32 * ept) == 0:
                out.append((bn, tp, w))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="512x128,4096x128,32768x32,16384x16,256x1024,16384x512")
    p.add_argument("--actions", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    A = a.actions
    print("| shape | two passes us | fused (plan) us | best tile | best us | all (tile: us) |")
    print("|---|---|---|---|---|---|")
    for shape in a.shapes.split(","):
        N, T = (int(x) for x in shape.split("x"))
        q = torch.randn(N, T, A, device="cuda", generator=g)
        pr = torch.softmax(torch.randn(N, T, A, device="cuda", generator=g), -1)
        act = torch.randint(0, A, (N, T), device="cuda", generator=g)
        lmu = torch.log(torch.rand(N, T, device="cuda", generator=g) * 0.9 + 0.05)
        r = torch.randn(N, T, device="cuda", generator=g)
        te = torch.rand(N, T, device="cuda", generator=g) < 0.01
        tr = torch.rand(N, T, device="cuda", generator=g) < 0.01
        bq = torch.randn(N, A, device="cuda", generator=g)
        bp = torch.softmax(torch.randn(N, A, device="cuda", generator=g), -1)
        fn = functools.partial(rc.retrace_from_actions, q, pr, act, lmu, r, te, tr,
                               bootstrap_q_values=bq, bootstrap_target_probs=bp, time_dim=-1)
        base = _config.current_tuning()
        confs = [("two", base.replace(fused_actions=False)),
                 ("plan", base.replace(fused_actions=True))]
        confs += [(t, base.replace(fused_actions=True, tile=t)) for t in tiles_for(T)]
        _config.set_tuning(confs[0][1])
        want = fn()
        ok, notes = [], {}
        for name, tune in confs:
            _config.set_tuning(tune)
            got = fn()
            err = (got - want).abs().max().item()
            if err <= 1e-4 * (1 + want.abs().max().item()):
                ok.append((name, tune))
            else:
                notes[name] = f"WRONG {err:.2g}"
        times = {n: [] for n, _ in ok}
        for _ in range(a.rounds):
            for name, tune in ok:
                _config.set_tuning(tune)
                times[name].append(graph_us(fn))
        _config.set_tuning(base)
        med = {n: statistics.median(v) for n, v in times.items()}
        tiles = {n: v for n, v in med.items() if isinstance(n, tuple)}
        best = min(tiles, key=tiles.get) if tiles else None
        allt = ", ".join(f"{t[0]}x{t[1]}w{t[2]}: {v:.1f}" for t, v in tiles.items())
        allt += "".join(f", {t}: {v}" for t, v in notes.items())
        nan = float("nan")
        print(f"| {shape} | {med.get('two', nan):.1f} | {med.get('plan', nan):.1f} "
              f"| {best} | {tiles.get(best, nan):.1f} | {allt} |", flush=True)


if __name__ == "__main__":
    main()
