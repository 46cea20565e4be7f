"""PPO on CartPole with RLlib 2.60, GAE on the rl_triton_core kernels (or not).

    python examples/rllib_ppo.py                     # --rl-triton is the default
    python examples/rllib_ppo.py --no-rl-triton      # RLlib's NumPy GAE, for comparison
    python examples/rllib_ppo.py --iterations 20 --train-batch-size 100000
    python examples/rllib_ppo.py --num-gpus-per-learner 1  # the learner (and GAE) on CUDA

Prints, per training iteration, the mean episode return and the wall time of the
learner connector's GAE piece (stock or Triton; value-function forward pass included)
in that iteration, measured by a stopwatch wrapped around the piece in every learner.
(RLlib's own connector timers are moving averages that the first call, with its JIT
compilation, dominates for many iterations.)

The one line that matters is ``rl_triton_rllib.enable(config)``. Needs the project
with its ``[rllib]`` extra installed (``pip install -e .[rllib]``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass


@dataclass
class Args:
    rl_triton: bool = True  # GAE on the rl_triton_core kernels
    iterations: int = 12  # training iterations
    train_batch_size: int = 4000  # env steps per learner update
    minibatch_size: int = 128
    num_epochs: int = 6
    num_env_runners: int = 0  # 0: sample in the driver process
    num_learners: int = 0  # 0: learn in the driver process; >= 1: remote learner actors
    num_gpus_per_learner: int = 0  # 1: each learner (the local one too) on a CUDA GPU
    num_cpus: int = 2  # for ray.init
    seed: int = 0


def parse_args() -> Args:
    defaults = Args()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rl-triton", action=argparse.BooleanOptionalAction,
                        default=defaults.rl_triton)
    for name, value in vars(defaults).items():
        if name != "rl_triton":
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                    default=value)
            else:
                parser.add_argument(flag, type=type(value), default=value)
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


def main(args: Args) -> None:
    import ray
    import rl_triton_rllib
    from ray.rllib.algorithms.ppo import PPOConfig

    import rl_triton_core

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
    ran_on = rl_triton_core.backend_for(learner_device) if args.rl_triton else "rllib"
    print(f"rl_triton={args.rl_triton}  gae_ran_on={ran_on}  "
          f"learner={config.learner_class.__name__}  "
          f"train_batch_size={args.train_batch_size}  "
          f"num_gpus_per_learner={args.num_gpus_per_learner}")
    print(f"{'iter':>4} {'return':>8} {'gae_ms':>9} {'iter_s':>7}")
    for i in range(1, args.iterations + 1):
        t0 = time.perf_counter()
        result = algo.train()
        elapsed = time.perf_counter() - t0
        ret = result["env_runners"].get("episode_return_mean", float("nan"))
        # per learner: the GAE piece's calls in this iteration (one per update)
        per_learner = [r.get() for r in algo.learner_group.foreach_learner(pop_gae_seconds)]
        gae_ms = 1e3 * max(sum(s) for s in per_learner)
        print(f"{i:>4} {ret:>8.1f} {gae_ms:>9.2f} {elapsed:>7.1f}", flush=True)
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main(parse_args())
