"""Time TorchRL's GAE / TD(lambda) with and without the adapter (not a test: run it).

    python tests/integrations/torchrl/bench_torchrl_adapter.py [--device cuda] [--quick]

For each shape ``[N envs, T steps]`` (TorchRL layout ``[N, T, 1]``, time_dim=-2), float32,
1 % terminated and 1 % truncated steps, prints one markdown row per implementation:

* ``functional``: ``generalized_advantage_estimate`` (TorchRL's loop) and
  ``vec_generalized_advantage_estimate`` from TorchRL and from ``rl_triton_torchrl``, and
  ``rl_triton_core.gae`` called directly (what the adapter adds is the difference);
* ``module``: ``GAE(value_network=None)`` and ``TDLambdaEstimator(value_network=None)``
  on a TensorDict holding the values, TorchRL's class and the adapter's: the estimator
  as a loss calls it, value network left out (it costs the same either way).

Time: median wall time of one synchronised call (ms); on CUDA also the peak extra
memory of a call (MB). Every implementation's output is checked against TorchRL's
loop first.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch


def timed(fn, device, reps):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    peak = float("nan")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        sync()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return 1e3 * statistics.median(times), peak


def _call_module(est, td):
    return est(td.copy())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--shapes", default="")
    args = parser.parse_args()
    device = torch.device(args.device)

    import rl_triton_torchrl as ours
    import torchrl.objectives.value as trl_value
    import torchrl.objectives.value.functional as trl
    from tensordict import TensorDict

    import rl_triton_core

    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    elif args.quick:
        shapes = [(4096, 128)]
    else:
        shapes = [(4096, 128), (16384, 512), (256, 1024)]
    gamma, lmbda = 0.99, 0.95
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}")
    print("| shape N x T | what | implementation | ms / call | peak extra MB |")
    print("|---|---|---|---|---|")
    for n, t in shapes:
        gen = torch.Generator().manual_seed(0)
        shape = (n, t, 1)
        v, nv, r = (torch.randn(shape, generator=gen).to(device) for _ in range(3))
        term = (torch.rand(shape, generator=gen) < 0.01).to(device)
        done = term | (torch.rand(shape, generator=gen) < 0.01).to(device)
        expected, _ = trl.generalized_advantage_estimate(gamma, lmbda, v, nv, r, done, term)
        reps = 5 if n * t >= 1 << 22 else 20
        args = (gamma, lmbda, v, nv, r, done, term)
        rows = [
            ("functional", "torchrl generalized_advantage_estimate (loop)",
             functools.partial(trl.generalized_advantage_estimate, *args)),
            ("functional", "torchrl vec_generalized_advantage_estimate",
             functools.partial(trl.vec_generalized_advantage_estimate, *args)),
            ("functional", "rl_triton_torchrl vec_generalized_advantage_estimate",
             functools.partial(ours.vec_generalized_advantage_estimate, *args)),
            ("functional", "rl_triton_core.gae (no adapter)",
             functools.partial(rl_triton_core.gae, r, v, term, done, next_values=nv,
                               gamma=gamma, lmbda=lmbda, time_dim=-2)),
        ]
        td = TensorDict({"state_value": v, "next": {"state_value": nv, "reward": r, "done": done,
                                                    "terminated": term}},
                        batch_size=(n, t), device=device)
        modules = (("torchrl GAE", trl_value.GAE), ("rl_triton_torchrl GAE", ours.GAE),
                   ("torchrl TDLambdaEstimator", trl_value.TDLambdaEstimator),
                   ("rl_triton_torchrl TDLambdaEstimator", ours.TDLambdaEstimator))
        for name, cls in modules:
            est = cls(gamma=gamma, lmbda=lmbda, value_network=None, device=device)
            rows.append(("module", name, functools.partial(_call_module, est, td)))
        for what, name, fn in rows:
            if "vec_generalized" in name and name.startswith("torchrl") and n * t > 1 << 23:
                print(f"| {n} x {t} | {what} | {name} | skipped (pads every trajectory) | |")
                continue
            out = fn()
            adv = out[0] if isinstance(out, tuple) else (
                out["advantage"] if not isinstance(out, torch.Tensor) else out)
            if "GAE" in name or "generalized" in name or "gae" in name:
                err = (adv.float() - expected).abs().max().item()
                assert err < 1e-3 * max(1.0, expected.abs().max().item()), (name, err)
            ms, peak = timed(fn, device, reps)
            print(f"| {n} x {t} | {what} | {name} | {ms:.3f} | {peak:.1f} |", flush=True)


if __name__ == "__main__":
    main()
