"""CPU-path ratios against the peers a CPU user has.

    python -m rl_triton_core.bench.cpu_peers [--reps 30] [--rounds 5] [--first-call 5]

* RLlib 2.60's ``compute_value_targets`` (NumPy loop over time) on a 100,000-step
  flat stream of episode chunks, against ``rl_triton_core.gae`` on the same stream;
* TorchRL 0.14's ``generalized_advantage_estimate`` (default) and
  ``vec_generalized_advantage_estimate`` at [4096, 128, 1], against ``gae``.

Each pair runs interleaved in one process (same machine load), median of
``--reps`` calls after warm-up; the outputs are compared before timing. Beside them,
the floor: an elementwise pass over the same bytes (the inputs read once, two fresh
outputs written, no recurrence; on one thread and on the CPU path's threads, the faster
of the two), so ``peer / floor`` is the largest speed-up any implementation could show
on this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import torch

import rl_triton_core as rc
from rl_triton_core import _config


def _median_ms(fns, reps):
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


_FLOOR = None


def _floor_fn(ins, like, threads=None):
    """The same-bytes floor of a call: an elementwise numba pass that reads ``ins`` (5
    arrays, any of them repeated where a case has fewer: a repeated read is a cache hit)
    and writes two fresh outputs shaped ``like``, split over ``threads`` (default: the CPU
    path's); no recurrence: with the faster thread count, the least time any
    implementation that reads and writes these bytes can take here)."""
    global _FLOOR
    import numba

    from rl_triton_core import _cpu

    if _FLOOR is None:
        @numba.njit(nogil=True)
        def k(lo, hi, a, b, c, f1, f2, o0, o1):
            for i in range(lo, hi):
                x = a[i] + b[i] + c[i] + (1.0 if f1[i] != 0 else 0.0) + (
                    1.0 if f2[i] != 0 else 0.0)
                o0[i] = x
                o1[i] = x - a[i]
        _FLOOR = k
    flat = [t.reshape(-1).numpy() for t in ins]
    n = flat[0].size
    threads = threads or _cpu.THREADS
    step = -(-n // threads)

    def call():
        o0, o1 = torch.empty_like(like), torch.empty_like(like)
        a0, a1 = o0.view(-1).numpy(), o1.view(-1).numpy()
        futs = [_cpu._pool().submit(_FLOOR, lo, min(lo + step, n), *flat, a0, a1)
                for lo in range(step, n, step)]
        _FLOOR(0, min(step, n), *flat, a0, a1)
        for f in futs:
            f.result()
        return o0, o1
    return call


def rllib_flat(reps, T=100_000, seed=0):
    from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

    rng = np.random.default_rng(seed)
    values = rng.standard_normal(T).astype(np.float32)
    rewards = rng.standard_normal(T).astype(np.float32)
    # chunks of 100-300 steps; each ends terminated or truncated (RLlib's convention)
    ends = np.cumsum(rng.integers(100, 300, size=T // 100))
    ends = ends[ends < T]
    terminateds = np.zeros(T, np.float32)
    truncateds = np.zeros(T, np.float32)
    kind = rng.random(ends.size) < 0.5
    terminateds[ends[kind]] = 1.0
    truncateds[ends[~kind]] = 1.0
    r, v = torch.from_numpy(rewards), torch.from_numpy(values)
    te, tr = torch.from_numpy(terminateds), torch.from_numpy(truncateds)
    want = compute_value_targets(values, rewards, terminateds, truncateds, 0.99, 0.95)
    got = rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=-1)[1].numpy()
    err = float(np.abs(got - want).max())
    t_rllib, t_ours, *t_floor = _median_ms(
        [lambda: compute_value_targets(values, rewards, terminateds, truncateds, 0.99, 0.95),
         lambda: rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=-1),
         _floor_fn((r, v, te, tr, tr), r, 1), _floor_fn((r, v, te, tr, tr), r)], reps)
    t_floor = min(t_floor)
    return dict(peer="RLlib 2.60 compute_value_targets", shape=f"flat {T:,}",
                peer_ms=t_rllib, ours_ms=t_ours, floor_ms=t_floor, max_err=err)


def torchrl_gae(reps, B=4096, T=128, seed=0):
    from torchrl.objectives.value.functional import (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
    )

    g = torch.Generator().manual_seed(seed)
    shape = (B, T, 1)
    r, v, nv = (torch.randn(shape, generator=g) for _ in range(3))
    done = torch.rand(shape, generator=g) < 0.02
    term = done & (torch.rand(shape, generator=g) < 0.5)
    rows = []
    ours = lambda: rc.gae(r, v, term, done, next_values=nv, gamma=0.99, lmbda=0.95,  # noqa
                          time_dim=-2)
    peers = (("TorchRL 0.14 generalized_advantage_estimate", generalized_advantage_estimate),
             ("TorchRL 0.14 vec_generalized_advantage_estimate",
              vec_generalized_advantage_estimate))
    for name, fn in peers:
        peer = lambda fn=fn: fn(0.99, 0.95, v, nv, r, done, term, time_dim=-2)  # noqa
        err = float((ours()[0] - peer()[0]).abs().max())
        ins = (r, v, nv, term, done)
        t_peer, t_ours, *t_floor = _median_ms(
            [peer, ours, _floor_fn(ins, r, 1), _floor_fn(ins, r)], reps)
        t_floor = min(t_floor)
        rows.append(dict(peer=name, shape=f"[{B}, {T}, 1]", peer_ms=t_peer, ours_ms=t_ours,
                         floor_ms=t_floor, max_err=err))
    return rows


_CHILD = r"""
import sys, time
import torch
import rl_triton_core as rc
kind = sys.argv[1]
g = torch.Generator().manual_seed(0)
if kind == "flat":  # RLlib's first batch: 4,000 steps + one extra step per chunk, float flags
    T = 4040
    r, v = torch.randn(T, generator=g), torch.randn(T, generator=g)
    te = (torch.rand(T, generator=g) < 0.005).float()
    tr = (torch.rand(T, generator=g) < 0.005).float()
    call = lambda: rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=-1)
else:  # TorchRL's [4096, 128, 1] with next values
    r, v, nv = (torch.randn(4096, 128, 1, generator=g) for _ in range(3))
    done = torch.rand(4096, 128, 1, generator=g) < 0.02
    term = done & (torch.rand(4096, 128, 1, generator=g) < 0.5)
    call = lambda: rc.gae(r, v, term, done, next_values=nv, gamma=0.99, lmbda=0.95,
                          time_dim=-2)
t0 = time.perf_counter(); call(); t1 = time.perf_counter(); call(); t2 = time.perf_counter()
call(); t3 = time.perf_counter()
print(1e3 * (t1 - t0), 1e3 * (t2 - t1), 1e3 * (t3 - t2))
"""


def first_call(procs, kinds=("flat", "batch")):
    """Fresh ``python -c`` processes: ms from ``import rl_triton_core`` done to the first
    ``gae`` result, then the second call (which waits for numba's warm-up thread if it
    is still running) and the third; with numba's disk cache warm (one process run
    before) and cold (a fresh NUMBA_CACHE_DIR per process)."""
    import subprocess
    import sys
    import tempfile

    rows = []
    for kind in kinds:
        for cache in ("warm", "cold"):
            runs = []
            for i in range(procs + (cache == "warm")):
                env = dict(os.environ)
                tmp = tempfile.mkdtemp(prefix="rl_triton_core_numba_") if cache == "cold" \
                    else None
                if tmp:
                    env["NUMBA_CACHE_DIR"] = tmp
                out = subprocess.run([sys.executable, "-c", _CHILD, kind], env=env,
                                     capture_output=True, text=True, check=True)
                if cache == "warm" and i == 0:
                    continue  # fills the cache
                runs.append([float(x) for x in out.stdout.split()])
            rows.append((kind, cache, runs))
    return rows


def _span(xs, fmt="{:.1f}"):
    xs = sorted(xs)
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(xs[0])}-{fmt.format(xs[-1])})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the interleaved measurement; report median (range) of the "
                         "rounds' medians")
    ap.add_argument("--first-call", type=int, default=0, metavar="PROCS",
                    help="also time the first call in PROCS fresh processes per case")
    args = ap.parse_args(argv)
    rounds = [[rllib_flat(args.reps), *torchrl_gae(args.reps)] for _ in range(args.rounds)]
    print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, numba threads "
          f"{_config.current_tuning().cpu_threads or 'auto'}, {args.rounds} round(s) of "
          f"{args.reps} interleaved calls")
    print("| peer | shape | peer ms | rl_triton_core ms | speed-up | floor ms | peer / floor "
          "| max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for i, row in enumerate(rounds[0]):
        peer = [r[i]["peer_ms"] for r in rounds]
        ours = [r[i]["ours_ms"] for r in rounds]
        floor = [r[i]["floor_ms"] for r in rounds]
        ratio = [p / o for p, o in zip(peer, ours)]
        best = [p / f for p, f in zip(peer, floor)]
        err = max(r[i]["max_err"] for r in rounds)
        print(f"| {row['peer']} | {row['shape']} | {_span(peer, '{:.2f}')} | "
              f"{_span(ours, '{:.3f}')} | {_span(ratio, '{:.0f}')}x | "
              f"{_span(floor, '{:.3f}')} | {_span(best, '{:.0f}')}x | {err:.1e} |")
    if args.first_call:
        print()
        print("| first call | numba cache | first ms | second ms | third ms |")
        print("|---|---|---|---|---|")
        for kind, cache, runs in first_call(args.first_call):
            cols = [_span([r[c] for r in runs]) for c in range(3)]
            print(f"| {kind} | {cache} | {cols[0]} | {cols[1]} | {cols[2]} |")


if __name__ == "__main__":
    main()
