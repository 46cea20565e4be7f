"""Interleaved timing for the CPU benchmarks (cpu_peers, cpu_tokens)."""

from __future__ import annotations

import random
import statistics
import time


def median_ms(fns, reps, seed=0):
    """Median ms of each of ``fns``, called interleaved ``reps`` times after two warm-up
    calls each. Each round calls them in a fresh random order (seeded, so a run is
    repeatable): a call right after another one runs with the caches, the allocator and
    torch's spinning OpenMP workers as that one left them, so every function should
    follow every other one about equally often. (A fixed order, even rotated between
    rounds, keeps the same neighbours: the function listed after the peer would always
    run right after it.)"""
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(seed)
    for _ in range(reps):
        rng.shuffle(order)
        for i in order:
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]
