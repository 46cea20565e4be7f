"""PPO on CartPole with RLlib 2.60, GAE on the rl_triton_core kernels (or not).

    python examples/rllib_ppo.py                     # --rl-triton is the default
    python examples/rllib_ppo.py --no-rl-triton      # RLlib's NumPy GAE, for comparison
    python examples/rllib_ppo.py --iterations 20 --train-batch-size 100000
    python examples/rllib_ppo.py --num-gpus-per-learner 1  # the learner (and GAE) on CUDA

Prints what computes GAE (``gae_ran_on``: RLlib's NumPy code, or what rl_triton_core
runs on the learner's device), then, per training iteration, the mean episode return
and the time per call of the learner connector's GAE piece (stock or rl_triton_core;
the value-function forward pass included), measured by a stopwatch wrapped around the
piece in every learner; the slowest learner's is shown. The first call is shown apart
(it pays one-time costs: on CUDA, Triton compiling its kernel), and the summary gives
the median of the calls after it. (RLlib's own connector timers are moving averages,
which a slow first call dominates for many iterations.)

The one line that matters is ``rl_triton_rllib.enable(config)``. Needs the project
with its ``[rllib]`` extra installed (``pip install -e .[rllib]``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass


@dataclass
class Args:
    rl_triton: bool = True
    iterations: int = 12
    train_batch_size: int = 4000
    minibatch_size: int = 128
    num_epochs: int = 6
    num_env_runners: int = 0
    num_learners: int = 0
    num_gpus_per_learner: int = 0
    num_cpus: int = 2
    seed: int = 0


HELP = {
    "rl_triton": "GAE in rl_triton_core (rl_triton_rllib.enable); --no-rl-triton: RLlib's "
                 "own NumPy GAE",
    "iterations": "training iterations (algo.train() calls)",
    "train_batch_size": "env steps per learner update",
    "minibatch_size": "env steps per gradient step",
    "num_epochs": "passes over each train batch",
    "num_env_runners": "remote env runners (0: sample in the driver process)",
    "num_learners": "remote learner actors (0: learn in the driver process)",
    "num_gpus_per_learner": "1: each learner (the local one too) on a CUDA GPU",
    "num_cpus": "CPUs for ray.init",
    "seed": "RLlib's seed (.debugging(seed=...))",
}


def parse_args() -> Args:
    defaults = Args()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, value in vars(defaults).items():
        flag = "--" + name.replace("_", "-")
        text = HELP[name] + " (default: %(default)s)"
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value,
                                help=text)
        else:
            parser.add_argument(flag, type=type(value), default=value, help=text)
    return Args(**vars(parser.parse_args()))


def add_gae_stopwatch(learner) -> None:
    """Wrap this learner's GAE piece (stock or Triton) in a stopwatch (runs in every
    learner, local or remote, through ``foreach_learner``)."""
    import time

    import torch
    from ray.rllib.connectors.connector_v2 import ConnectorV2
    from ray.rllib.connectors.learner import GeneralAdvantageEstimation

    class GAEStopwatch(ConnectorV2):
        def __init__(self, piece):
            super().__init__(piece.input_observation_space, piece.input_action_space)
            self.piece, self.seconds = piece, []

        def __call__(self, **kwargs):
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.synchronize()  # time this piece's kernels only, and all of them
            t0 = time.perf_counter()
            batch = self.piece(**kwargs)
            if cuda:
                torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - t0)
            return batch

    pieces = learner._learner_connector.connectors
    for i, piece in enumerate(pieces):
        if isinstance(piece, GeneralAdvantageEstimation):
            pieces[i] = learner._gae_stopwatch = GAEStopwatch(piece)


def pop_gae_seconds(learner) -> list:
    seconds = list(learner._gae_stopwatch.seconds)
    learner._gae_stopwatch.seconds.clear()
    return seconds


def gae_runner(device: str, rl_triton: bool) -> str:
    """What computes GAE: RLlib's NumPy code, or what rl_triton_core runs for tensors on
    ``device`` (``backend_for``: "triton", "interpreter", or "numba" for its CPU path, which
    runs GAE on the C kernel built at install where there is one)."""
    import rl_triton_core

    if not rl_triton:
        return "rllib-numpy"
    backend = rl_triton_core.backend_for(device)
    if backend == "numba":
        try:
            from rl_triton_core.scan import _cpu_c

            return "c-kernel-cpu" if _cpu_c.enabled() else "numba-cpu"
        except (ImportError, AttributeError):
            return "cpu-path"
    return {"triton": "triton-cuda", "interpreter": "triton-interpreter"}.get(backend, backend)


def main(args: Args) -> None:
    import ray
    import rl_triton_rllib
    from ray.rllib.algorithms.ppo import PPOConfig

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.num_env_runners)
        .learners(num_learners=args.num_learners,
                  num_gpus_per_learner=args.num_gpus_per_learner)
        .training(
            train_batch_size_per_learner=args.train_batch_size,
            minibatch_size=args.minibatch_size,
            num_epochs=args.num_epochs,
            lr=3e-4,
            gamma=0.99,
            lambda_=0.95,
        )
        .debugging(seed=args.seed)
    )
    if args.rl_triton:
        config = rl_triton_rllib.enable(config)

    algo = config.build_algo()
    algo.learner_group.foreach_learner(add_gae_stopwatch)
    learner_device = "cuda" if args.num_gpus_per_learner else "cpu"
    ran_on = gae_runner(learner_device, args.rl_triton)
    print(f"rl_triton={args.rl_triton} gae_ran_on={ran_on} "
          f"learner={config.learner_class.__name__}")
    print(f"train_batch_size={args.train_batch_size} "
          f"num_gpus_per_learner={args.num_gpus_per_learner}")
    print("gae_ms_per_call: the GAE piece's mean time per call in the iteration (the slowest")
    print("learner's); iteration 1's first call pays one-time costs; medians at the end")
    print(f"{'iter':>4} {'return':>8} {'calls':>6} {'gae_ms_per_call':>16} {'iter_s':>7}")
    seconds = []  # every GAE call of the slowest learner, in order
    for i in range(1, args.iterations + 1):
        t0 = time.perf_counter()
        result = algo.train()
        elapsed = time.perf_counter() - t0
        ret = result["env_runners"].get("episode_return_mean", float("nan"))
        # per learner: the GAE piece's calls in this iteration (one per update)
        per_learner = [r.get() for r in algo.learner_group.foreach_learner(pop_gae_seconds)]
        calls = max(per_learner, key=sum)
        seconds += calls
        per_call = 1e3 * sum(calls) / len(calls) if calls else float("nan")
        print(f"{i:>4} {ret:>8.1f} {len(calls):>6} {per_call:>16.3f} {elapsed:>7.1f}",
              flush=True)
    if seconds:
        later = (f", then a median of {1e3 * statistics.median(seconds[1:]):.3f} ms over calls "
                 f"2-{len(seconds)}" if len(seconds) > 1 else "")
        print(f"gae ({ran_on}): first call {1e3 * seconds[0]:.3f} ms{later}")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main(parse_args())
