"""PPO on CartPole with TorchRL, its GAE from TorchRL or from rl_triton_core.

TorchRL's PPO recipe (collector, GAE module, ``ClipPPOLoss``, replay buffer of
minibatches) in one file. ``--estimator`` picks the advantage module:

* ``torchrl``: ``torchrl.objectives.value.GAE``, the recursion in TorchRL's torch ops;
* ``rl-triton-core``: ``rl_triton_torchrl.GAE``, the same module with the recursion
  run by ``rl_triton_core`` (a Triton kernel on CUDA; on the CPU the C scan kernel
  built at install, or numba without it). The first line says which ran.

Nothing else differs, so both settings learn the same way (up to float
rounding). Every iteration prints the frames seen, the mean return of the last
20 episodes, and the median time per call of advantage estimation: the whole GAE
module call (value network included), and the recursion alone (the same estimator
class without a value network, timed on the values the module call wrote). The
first call of each pays one-time costs (on CUDA, Triton compiling its kernel;
TorchRL's vmap setup) and is reported apart, after the first iteration. Example::

    python examples/torchrl_ppo.py --estimator rl-triton-core
    python examples/torchrl_ppo.py --estimator torchrl
    python examples/torchrl_ppo.py --estimator rl-triton-core --device cuda

With the defaults both settings reach a mean return of 475 in about 170
iterations (170k frames), a few minutes on a laptop CPU (docs/torchrl.md).

CartPole-v1's maximum return is 500 (episodes are truncated after 500 steps);
truncations bootstrap from the true next state, as TorchRL records it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import time
from dataclasses import dataclass

import gymnasium as gym
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl import set_auto_unwrap_transformed_env
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs import Compose, GymEnv, GymWrapper, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss

import rl_triton_core

ESTIMATORS = ("rl-triton-core", "torchrl")


@dataclass
class Args:
    estimator: str = "rl-triton-core"
    env_id: str = "CartPole-v1"
    num_envs: int = 8
    frames_per_batch: int = 1024
    total_frames: int = 300_000
    num_epochs: int = 4
    minibatch_size: int = 128
    lr: float = 2.5e-4
    gamma: float = 0.99
    lmbda: float = 0.95
    clip_epsilon: float = 0.2
    entropy_coeff: float = 0.01
    critic_coeff: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    seed: int = 0
    device: str = "cpu"
    threads: int = 1
    target_return: float = 475.0


HELP = {
    "estimator": "the GAE module: rl-triton-core (rl_triton_torchrl.GAE, the recursion in "
                 "rl_triton_core) or torchrl (torchrl.objectives.value.GAE)",
    "env_id": "the gymnasium environment",
    "num_envs": "environments in one gymnasium SyncVectorEnv (no subprocesses: fast on few "
                "cores)",
    "frames_per_batch": "frames collected per iteration (over all environments)",
    "total_frames": "frames to collect in all (the run stops earlier at --target-return)",
    "num_epochs": "passes over each batch (GAE is recomputed at the start of each)",
    "minibatch_size": "frames per gradient step",
    "lr": "Adam's learning rate, annealed linearly to 0 over --total-frames",
    "gamma": "the discount factor",
    "lmbda": "GAE's lambda",
    "clip_epsilon": "PPO's clipping range of the probability ratio",
    "entropy_coeff": "weight of the entropy bonus",
    "critic_coeff": "weight of the value loss",
    "max_grad_norm": "gradient-norm clipping threshold",
    "hidden": "units in each of the two hidden layers of the actor and the critic",
    "seed": "seed of torch and the environments",
    "device": "cpu or cuda (without a CUDA GPU, cuda falls back to the CPU with a message)",
    "threads": "torch CPU threads (networks this small run fastest on one)",
    "target_return": "stop once the mean return of the last 20 episodes reaches this "
                     "(0: never)",
}


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        kwargs = {"type": type(field.default), "default": field.default,
                  "help": HELP[field.name] + " (default: %(default)s)"}
        if field.name == "estimator":
            kwargs["choices"] = ESTIMATORS
        parser.add_argument(flag, **kwargs)
    return Args(**vars(parser.parse_args()))


def make_env(args: Args):
    if args.num_envs == 1:
        base = GymEnv(args.env_id, device=args.device, categorical_action_encoding=True)
    else:
        # GymEnv(num_envs=N) runs an AsyncVectorEnv in N subprocesses; one process is
        # faster for CartPole. TorchRL needs gymnasium's SAME_STEP auto-reset.
        vec = gym.make_vec(
            args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        )
        base = GymWrapper(vec, device=args.device, categorical_action_encoding=True)
    env = TransformedEnv(base, Compose(StepCounter(), RewardSum()))
    env.set_seed(args.seed)
    return env


def make_modules(env, args: Args):
    n_obs = env.observation_spec["observation"].shape[-1]
    n_act = env.action_spec.space.n
    policy = TensorDictModule(
        MLP(in_features=n_obs, out_features=n_act, num_cells=[args.hidden, args.hidden],
            activation_class=nn.Tanh),
        in_keys=["observation"], out_keys=["logits"],
    )
    actor = ProbabilisticActor(
        policy, in_keys=["logits"], spec=env.action_spec,
        distribution_class=torch.distributions.Categorical, return_log_prob=True,
    )
    critic = ValueOperator(
        MLP(in_features=n_obs, out_features=1, num_cells=[args.hidden, args.hidden],
            activation_class=nn.Tanh),
        in_keys=["observation"],
    )
    return actor.to(args.device), critic.to(args.device)


def make_advantage_module(critic, args: Args):
    if args.estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {args.estimator!r}")
    if args.estimator == "rl-triton-core":
        from rl_triton_torchrl import GAE
    else:
        from torchrl.objectives.value import GAE
    return GAE(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=False)


def gae_runner(device: torch.device, estimator: str) -> str:
    """What runs the GAE recursion: TorchRL's torch ops, or what rl_triton_core runs for
    tensors on ``device`` (``backend_for``: "triton", "interpreter", or "numba" for its CPU
    path, which runs GAE on the C kernel built at install where there is one)."""
    if estimator == "torchrl":
        return "torchrl"
    backend = rl_triton_core.backend_for(device)
    if backend == "numba":
        try:
            from rl_triton_core.scan import _cpu_c

            return "c-kernel-cpu" if _cpu_c.enabled() else "numba-cpu"
        except (ImportError, AttributeError):
            return "cpu-path"
    return {"triton": "triton-cuda", "interpreter": "triton-interpreter"}.get(backend, backend)


class Stopwatch:
    """Seconds per call (synchronised on CUDA): the first call, which pays one-time costs
    (on CUDA, Triton compiling its kernel; TorchRL's vmap setup), apart from the median of
    the calls after it."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.first, self.later = None, []

    def __call__(self, fn, *args):
        self.sync()
        t0 = time.perf_counter()
        out = fn(*args)
        self.sync()
        dt = time.perf_counter() - t0
        if self.first is None:
            self.first = dt
        else:
            self.later.append(dt)
        return out

    @property
    def ms(self) -> float:
        """The median of the calls after the first, in milliseconds (nan before a second)."""
        return 1e3 * statistics.median(self.later) if self.later else float("nan")


# TorchRL's default (nested TransformedEnvs unwrapped), stated, so it does not warn
@set_auto_unwrap_transformed_env(True)
def main(args: Args) -> dict:
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: no CUDA GPU here, running on the CPU instead",
              file=sys.stderr, flush=True)
        args = dataclasses.replace(args, device="cpu")
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # TorchRL's set-up notes, at INFO
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    env = make_env(args)
    actor, critic = make_modules(env, args)
    advantage = make_advantage_module(critic, args)
    # The same estimator without a value network: it reads the values the call above
    # wrote, so timing it isolates the recursion (and TorchRL's glue) from the critic.
    recursion_only = type(advantage)(gamma=args.gamma, lmbda=args.lmbda, value_network=None)
    loss_module = ClipPPOLoss(
        actor_network=actor, critic_network=critic, clip_epsilon=args.clip_epsilon,
        entropy_coeff=args.entropy_coeff, critic_coeff=args.critic_coeff,
        loss_critic_type="l2", normalize_advantage=True,
    )
    optim = torch.optim.Adam(loss_module.parameters(), lr=args.lr)
    collector = Collector(env, actor, frames_per_batch=args.frames_per_batch,
                          total_frames=args.total_frames, device=device,
                          auto_register_policy_transforms=False)  # an MLP policy needs none
    buffer = ReplayBuffer(storage=LazyTensorStorage(args.frames_per_batch, device=device),
                          sampler=SamplerWithoutReplacement(),
                          batch_size=args.minibatch_size)
    module_clock, recursion_clock = Stopwatch(device), Stopwatch(device)

    ran_on = gae_runner(device, args.estimator)
    print(f"PPO on {args.env_id}, {args.num_envs} envs, device {device}")
    print(f"estimator={args.estimator} gae_ran_on={ran_on} "
          f"({type(advantage).__module__.split('.')[0]}.{type(advantage).__name__})")
    print("GAE times, ms per call: the median after the first call, of the GAE module (the\n"
          "critic included) and of the recursion alone; first calls shown after iteration 1")
    print(f"{'iter':>5} {'frames':>8} {'return':>7} {'gae_module_ms':>14} "
          f"{'recursion_ms':>13} {'elapsed_s':>10}")
    frames, recent = 0, []
    start = time.perf_counter()
    iteration = 0
    for iteration, data in enumerate(collector, start=1):
        frames += data.numel()
        done = data["next", "done"]
        recent = (recent + data["next", "episode_reward"][done].tolist())[-20:]
        for group in optim.param_groups:
            group["lr"] = args.lr * max(0.0, 1.0 - (frames - data.numel()) / args.total_frames)
        for _ in range(args.num_epochs):
            with torch.no_grad():
                module_clock(advantage, data)
                recursion_clock(recursion_only, data.clone())  # timing only
            buffer.extend(data.reshape(-1))
            for batch in buffer:
                out = loss_module(batch)
                loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(loss_module.parameters(), args.max_grad_norm)
                optim.step()
        collector.update_policy_weights_()
        mean_return = sum(recent) / max(len(recent), 1)
        print(f"{iteration:>5} {frames:>8} {mean_return:>7.1f} {module_clock.ms:>14.3f} "
              f"{recursion_clock.ms:>13.3f} {time.perf_counter() - start:>10.1f}", flush=True)
        if iteration == 1:
            print(f"      first calls: GAE module {1e3 * module_clock.first:.3f} ms, recursion "
                  f"{1e3 * recursion_clock.first:.3f} ms (one-time costs included)", flush=True)
        if args.target_return and len(recent) >= 20 and mean_return >= args.target_return:
            break
    collector.shutdown()
    result = {
        "estimator": args.estimator,
        "gae_ran_on": ran_on,
        "iterations": iteration,
        "frames": frames,
        "return": sum(recent) / max(len(recent), 1),
        "wall_s": time.perf_counter() - start,
        "gae_module_ms": module_clock.ms,  # median per call after the first
        "gae_recursion_ms": recursion_clock.ms,
        "gae_module_first_ms": None if module_clock.first is None else 1e3 * module_clock.first,
        "gae_recursion_first_ms": None if recursion_clock.first is None
        else 1e3 * recursion_clock.first,
    }
    items = [f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()]
    print("result: " + " ".join(items[:4]))
    print("        " + " ".join(items[4:7]))
    print("        " + " ".join(items[7:]), flush=True)
    return result


if __name__ == "__main__":
    main(parse_args())
