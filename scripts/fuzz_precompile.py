"""Compile the GPU fuzz's kernels ahead of its run, in parallel and off the GPU.

Many processes sharing one GPU slow each other down (a fuzz chunk took ~190 s with 14
xdist workers on one H200 against ~18 s alone: the contexts take turns), while the
fuzz's cost is mostly Triton compiles, which need no GPU. So this script draws every
GPU fuzz case (the same seed, chunks and sizes as test_fuzz.py's test_fuzz_cuda) on CPU
tensors in a pool of processes and sends each launch to ``JITFunction.warmup`` (compile
into the Triton cache, no launch), with the planner told the GPU's SM count. The fuzz
then runs with few workers and finds its kernels compiled.

    RL_TEST_SEED=<n> python scripts/fuzz_precompile.py [--procs P] [--scale S]
        [--only NAME:CHUNK,...]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "core"))


def _work(args):
    jobs, seed, n_cases, n_profiles, sms = args
    os.environ["OMP_NUM_THREADS"] = "1"
    import fuzz_lib
    import torch

    from rl_triton_core.scan import _dispatch, _launch

    torch.set_num_threads(1)
    _dispatch.backend_for = lambda device: "triton"
    _launch._sm_count = lambda device: sms  # (the planner's name for _host.sm_count)
    real = _launch.scan_kernel

    class _Warm:
        arg_names = real.arg_names

        def __getitem__(self, grid):
            return lambda *a, **kw: real.warmup(*a, grid=grid, **kw)

    _launch.scan_kernel = _Warm()
    errors = 0
    for name, chunk, part, parts in jobs:
        for n, (_, _, _, case) in enumerate(fuzz_lib.chunk_cases(
                name, seed, n_cases, n_profiles, "cuda", chunk=chunk, on="cpu")):
            if n % parts != part:
                continue
            try:
                case.call()
            except Exception:  # the call's own checks, or a path that needs CUDA tensors
                errors += 1
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--scale", type=float, default=float(os.environ.get("RL_FUZZ_SCALE", "1")))
    ap.add_argument("--only", default="", help="NAME:CHUNK,...: these chunks only, each "
                    "chunk's cases spread over the processes")
    a = ap.parse_args()
    seed = int(os.environ["RL_TEST_SEED"])
    import test_fuzz
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_cases = max(1, round(test_fuzz.GPU_CASES * a.scale / test_fuzz.GPU_CHUNKS))
    if a.only:
        only = [(w.split(":")[0], int(w.split(":")[1])) for w in a.only.split(",")]
        jobs = [(name, c, k, a.procs) for name, c in only for k in range(a.procs)]
    else:
        jobs = [(name, c, 0, 1) for name in test_fuzz.ESTIMATORS
                for c in range(test_fuzz.GPU_CHUNKS)]
    parts = [jobs[k::a.procs] for k in range(a.procs)]
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    with ctx.Pool(a.procs) as pool:
        errors = pool.map(_work, [(p, seed, n_cases, test_fuzz.GPU_PROFILES, sms)
                                  for p in parts])
    n_chunks = len({j[:2] for j in jobs})
    print(f"precompiled {n_chunks} chunks x {n_cases} cases in {time.perf_counter() - t0:.0f} s"
          f" ({a.procs} processes; {sum(errors)} calls raised)")


if __name__ == "__main__":
    main()
