"""Interleaved timing for the CPU benchmarks (cpu_peers, cpu_tokens)."""

from __future__ import annotations

import statistics
import time


def median_ms(fns, reps):
    """Median ms of each of ``fns``, called in turn (interleaved) ``reps`` times after two
    warm-up calls each. The order rotates every round, so that each function follows
    each other one equally often: a call right after a peer's runs with the caches,
    allocator and torch's spinning OpenMP workers as the peer left them, and no function
    should always be the one that pays for it."""
    for fn in fns:
        fn()
        fn()
    times = [[] for _ in fns]
    n = len(fns)
    for rep in range(reps):
        for k in range(n):
            i = (rep + k) % n
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]
