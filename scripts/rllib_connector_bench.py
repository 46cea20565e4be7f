"""Time per call of RLlib's GAE learner-connector piece, stock and with rl_triton.

    python scripts/rllib_connector_bench.py                       # CUDA if there, else CPU
    python scripts/rllib_connector_bench.py --devices cuda,cpu --out $OUT/rllib_gae.md
    python scripts/rllib_connector_bench.py --quick               # a short CPU check

For each device and batch size (env steps), two PPO learners are built for CartPole with
``config.build_learner`` (a local learner, no Ray actors; ``num_gpus_per_learner=1`` on
CUDA, which starts a small local Ray instance for RLlib's device lookup): RLlib's own,
and one with ``rl_triton_rllib.enable(config)``, with the same weights. A batch of random
CartPole episode chunks (lengths uniform in 1..``--max-len``, each ending terminated,
truncated or cut) goes once through the learner connector's pieces before
``GeneralAdvantageEstimation``; then the GAE piece alone (the value-function forward pass
included, as RLlib's piece does it) is timed on that batch, stock and Triton interleaved:
``torch.cuda.synchronize()`` before and after each call, ``--warmup`` calls thrown away
(the first ones compile), the median (and min) over ``--repeats`` calls. The value forward
pass alone is timed too (the column "of which value forward"), since it is part of both
pieces' time. The two pieces' advantages are compared (max abs difference) as a sanity
check.

Writes a markdown table to ``--out`` (default ``$OUT/rllib_connector_bench.md``, OUT
defaulting to /tmp/out) and prints it.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _importable(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


def _expose_sources() -> None:
    """Import rl_triton_core / rl_triton_rllib from this checkout if not installed (as
    tests/integrations/rllib/conftest.py does)."""
    if not _importable("rl_triton_core"):
        sys.path.insert(0, str(REPO))
    if not _importable("rl_triton_rllib"):
        links = tempfile.mkdtemp(prefix="rl_triton_rllib_src_")
        os.symlink(REPO / "integrations" / "rllib", os.path.join(links, "rl_triton_rllib"))
        sys.path.insert(0, links)


STATUSES = ("terminated", "truncated", "cut")


def random_episodes(rng, env, total_steps: int, max_len: int):
    """Episode chunks of random CartPole-shaped data adding up to ``total_steps`` steps."""
    import numpy as np
    from ray.rllib.core.columns import Columns
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    episodes, steps = [], 0
    while steps < total_steps:
        n = min(int(rng.integers(1, max_len + 1)), total_steps - steps)
        steps += n
        status = STATUSES[rng.integers(3)]
        obs = rng.uniform(-0.2, 0.2, size=(n + 1, 4)).astype(np.float32)
        episodes.append(SingleAgentEpisode(
            observations=list(obs),
            actions=[int(a) for a in rng.integers(0, 2, n)],
            rewards=list(np.ones(n, np.float32)),
            extra_model_outputs={
                Columns.ACTION_LOGP: list(np.full(n, -0.69, np.float32)),
                Columns.ACTION_DIST_INPUTS: [np.zeros(2, np.float32)] * n,
            },
            terminated=status == "terminated",
            truncated=status == "truncated",
            len_lookback_buffer=0,
            observation_space=env.observation_space,
            action_space=env.action_space,
        ).to_numpy())
    return episodes


def build_learners(device: str):
    import gymnasium as gym
    import rl_triton_rllib
    from ray.rllib.algorithms.ppo import PPOConfig

    config = (PPOConfig().environment("CartPole-v1")
              .training(gamma=0.99, lambda_=0.95)
              .learners(num_learners=0, num_gpus_per_learner=1 if device == "cuda" else 0))
    env = gym.make("CartPole-v1")
    stock = config.build_learner(env=env)
    triton = rl_triton_rllib.enable(config.copy(copy_frozen=False)).build_learner(env=env)
    triton.module.set_state(stock.module.get_state())
    return env, stock, triton


def gae_index(learner) -> int:
    from ray.rllib.connectors.learner import GeneralAdvantageEstimation

    (i,) = [i for i, p in enumerate(learner._learner_connector.connectors)
            if isinstance(p, GeneralAdvantageEstimation)]
    return i


def prefix_batch(learner, episodes):
    """The batch as the GAE piece receives it: the pieces before it, run once."""
    episodes = copy.deepcopy(episodes)
    batch, shared = {}, {}
    for piece in learner._learner_connector.connectors[:gae_index(learner)]:
        batch = piece(rl_module=learner.module, batch=batch, episodes=episodes,
                      explore=False, shared_data=shared, metrics=None)
    return batch, episodes


def time_call(piece, learner, batch, episodes, sync):
    fresh = {mid: dict(module_batch) for mid, module_batch in batch.items()}
    sync()
    t0 = time.perf_counter()
    out = piece(rl_module=learner.module, batch=fresh, episodes=episodes, explore=False,
                shared_data={}, metrics=None)
    sync()
    return time.perf_counter() - t0, out


def time_values(learner, batch, sync):
    """The value-function forward pass alone (part of both pieces' time)."""
    import torch

    sync()
    t0 = time.perf_counter()
    with torch.no_grad():
        learner.module["default_policy"].compute_values(batch["default_policy"])
    sync()
    return time.perf_counter() - t0


def bench_device(device: str, steps_list, args, rows) -> None:
    import numpy as np
    import rl_triton_rllib
    import torch
    from ray.rllib.evaluation.postprocessing import Postprocessing

    if device == "cuda":
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR")
        sync = torch.cuda.synchronize
    else:
        sync = lambda: None  # noqa: E731
    t_build = time.perf_counter()
    env, stock, triton = build_learners(device)
    print(f"[{device}] learners built in {time.perf_counter() - t_build:.1f} s "
          f"(learner device {triton._device})", flush=True)
    stock_piece = stock._learner_connector.connectors[gae_index(stock)]
    triton_piece = triton._learner_connector.connectors[gae_index(triton)]
    assert isinstance(triton_piece, rl_triton_rllib.TritonGeneralAdvantageEstimation)
    assert type(stock_piece) is not type(triton_piece)
    rng = np.random.default_rng(0)
    for steps in steps_list:
        episodes = random_episodes(rng, env, steps, args.max_len)
        batch, eps = prefix_batch(stock, episodes)
        column = batch["default_policy"]["obs"]
        times = {"stock": [], "triton": [], "values": []}
        outs = {}
        for i in range(args.warmup + args.repeats):
            for name, piece, learner in (("stock", stock_piece, stock),
                                         ("triton", triton_piece, triton)):
                seconds, out = time_call(piece, learner, batch, eps, sync)
                if i >= args.warmup:
                    times[name].append(seconds)
                outs[name] = out["default_policy"]
            seconds = time_values(triton, batch, sync)
            if i >= args.warmup:
                times["values"].append(seconds)
        diff = (outs["stock"][Postprocessing.ADVANTAGES].float()
                - outs["triton"][Postprocessing.ADVANTAGES].float()).abs().max().item()
        adv_device = str(outs["triton"][Postprocessing.ADVANTAGES].device)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        low = {k: 1e3 * min(v) for k, v in times.items()}
        row = dict(device=device, steps=steps, rows=int(column.shape[0]),
                   chunks=len(episodes), stock_ms=med["stock"], triton_ms=med["triton"],
                   stock_min=low["stock"], triton_min=low["triton"],
                   values_ms=med["values"], speedup=med["stock"] / med["triton"], diff=diff,
                   adv_device=adv_device)
        rows.append(row)
        print(f"[{device}] {steps:>7} env steps ({row['rows']} rows, {row['chunks']} chunks): "
              f"stock {med['stock']:.2f} ms, rl_triton {med['triton']:.2f} ms "
              f"(x{row['speedup']:.1f}; value forward {med['values']:.2f} ms), "
              f"max |dA| {diff:.1e}, advantages on {adv_device}",
              flush=True)


def table(rows, args) -> str:
    import ray
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    lines = [
        "# RLlib GAE learner-connector piece: time per call",
        "",
        f"ray {ray.__version__}, torch {torch.__version__}, python "
        f"{platform.python_version()}, GPU: {gpu}, CPU threads: {torch.get_num_threads()}. "
        f"PPO on CartPole (default model), local learner. Random episode chunks of "
        f"1..{args.max_len} steps; the GAE piece alone (value forward pass included), "
        f"synchronized; median (min) of {args.repeats} calls after {args.warmup} warm-ups.",
        "",
        "| device | env steps | rows (incl. +1 per chunk) | chunks | stock GAE ms | "
        "rl_triton GAE ms | speed-up | of which value forward ms | "
        "max abs diff of advantages | rl_triton advantages on |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['device']} | {r['steps']:,} | {r['rows']:,} | {r['chunks']:,} | "
            f"{r['stock_ms']:.2f} ({r['stock_min']:.2f}) | "
            f"{r['triton_ms']:.2f} ({r['triton_min']:.2f}) | {r['speedup']:.1f}x | "
            f"{r['values_ms']:.2f} | "
            f"{r['diff']:.1e} | {r['adv_device']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="4000,100000",
                        help="comma-separated batch sizes in env steps")
    parser.add_argument("--devices", default="auto",
                        help="comma-separated: cuda, cpu; auto = cuda if there, else cpu")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=200, help="longest episode chunk")
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true",
                        help="4,000 and 20,000 steps, 3 repeats (a check, not a measurement)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats, args.warmup = "4000,20000", 3, 1
    _expose_sources()
    import torch

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    if devices == ["auto"]:
        devices = ["cuda" if torch.cuda.is_available() else "cpu"]
    if "cuda" in devices and not torch.cuda.is_available():
        print("no CUDA device: timing on CPU only", flush=True)
        devices = [d for d in devices if d != "cuda"] or ["cpu"]
    steps_list = [int(s) for s in args.steps.split(",")]
    out = Path(args.out or os.path.join(os.environ.get("OUT") or "/tmp/out",
                                        "rllib_connector_bench.md"))
    rows: list = []
    t0 = time.perf_counter()
    try:
        for device in devices:
            bench_device(device, steps_list, args, rows)
    finally:
        if rows:
            text = table(rows, args)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(text)
            print(f"wrote {out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
