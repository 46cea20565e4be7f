# PPO for discrete actions (CartPole-v1), CleanRL's single-file style, with the GAE loop
# replaced by one call to rl_triton_core (Triton kernel on CUDA tensors, CPU path on CPU).
# Adapted from CleanRL's ppo.py (https://github.com/vwxyzjn/cleanrl, MIT license);
# see docs/cleanrl.md for the one-line switch and the flag mapping.
#
#   python examples/cleanrl_ppo.py                             # rl_triton_core GAE
#   python examples/cleanrl_ppo.py --gae-backend cleanrl-loop  # CleanRL's own Python loop
#   python examples/cleanrl_ppo.py --no-bootstrap-truncated    # CleanRL's original semantics
#
# Truncation. gymnasium returns `terminated` (a terminal state: no value beyond it) and
# `truncated` (a time limit cut the episode: the state after it still has a value). CleanRL
# folds both into one `done` and treats every episode end as terminal, so CartPole's
# 500-step time limit looks like a failure to the critic. With --bootstrap-truncated (the
# default) the advantage of a truncated step bootstraps from V(final observation), that of
# a terminated step does not. The vector env resets in the same step (SAME_STEP autoreset),
# so after an episode end `next_obs` is already the reset observation and the true final
# observation is in `infos["final_obs"]`.
#
# Flags. CleanRL's `dones[t]` is shifted: it says that obs[t] starts a new episode. The
# kernel wants step-aligned flags, the flag of step t describing the transition out of it:
#     done_t = dones[t + 1] for t < T-1,   done_{T-1} = next_done,
#     terminated_t = terminations[t] (stored unshifted below),
#     truncated_t = done_t and not terminated_t,
#     V'_t = V(true successor of obs[t]) = values[t + 1] (next_value at t = T-1),
#            or V(final_obs) if truncated_t.
# rl_triton_cleanrl.compute_gae does exactly this re-alignment and calls the kernel.
#
# Output. Three lines per iteration (progress; losses; the GAE time), then a summary. The
# GAE time is per call, synchronised on CUDA. The first call is shown apart, as it pays
# one-time costs (on CUDA, Triton compiles the kernel or loads it from its cache; on either
# device, the first call takes the fully checked path and records the cached launch that
# later calls replay), then the median of the calls after it; gae_time_share is the share
# of the wall time so far that all GAE calls took.
# gae_ran_on says what computed GAE (see gae_runner below).
import os
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from rl_triton_cleanrl import compute_gae
from torch.distributions.categorical import Categorical

import rl_triton_core


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """deterministic cuDNN kernels (`torch.backends.cudnn.deterministic`); off with
    --no-torch-deterministic"""
    cuda: bool = True
    """use the GPU when there is one (--no-cuda: the CPU); without one the run uses the CPU"""
    num_threads: int = 1
    """torch CPU threads (small MLPs run fastest on one; 0 keeps torch's default)"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_envs: int = 16
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""

    # rl_triton_core arguments
    gae_backend: Literal["rl-triton-core", "cleanrl-loop"] = "rl-triton-core"
    """`rl-triton-core`: one rl_triton_core call (a Triton kernel on CUDA; on the CPU the C
    scan kernel built at install, or numba without it; the run prints which as gae_ran_on);
    `cleanrl-loop`: CleanRL's original Python loop over the time steps"""
    bootstrap_truncated: bool = True
    """bootstrap the advantage of time-limit truncations from V(final observation);
    `--no-bootstrap-truncated` reproduces CleanRL, which treats every episode end as terminal"""
    target_return: float | None = None
    """stop once the mean return of the last 20 episodes reaches this, and exit with status 1
    if it never does (the demo uses 475)"""

    # computed from the arguments above at start-up (hidden from --help)
    batch_size: tyro.conf.Suppress[int] = 0
    """num_envs * num_steps"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """batch_size // num_minibatches"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """total_timesteps // batch_size"""


def gae_runner(device: torch.device, gae_backend: str) -> str:
    """What computes GAE: CleanRL's loop, or what rl_triton_core runs for tensors on
    ``device`` (``backend_for``: "triton", "interpreter", or "numba" for its CPU path, which
    runs GAE on the C kernel built at install where there is one)."""
    if gae_backend == "cleanrl-loop":
        return "cleanrl-loop"
    backend = rl_triton_core.backend_for(device)
    if backend == "numba":
        try:
            from rl_triton_core.scan import _cpu_c

            return "c-kernel-cpu" if _cpu_c.enabled() else "numba-cpu"
        except (ImportError, AttributeError):
            return "cpu-path"
    return {"triton": "triton-cuda", "interpreter": "triton-interpreter"}.get(backend, backend)


def gae_times(seconds: list) -> str:
    """The per-call GAE times: the first call apart, then the median of the calls after it."""
    text = f"gae_first_ms={1e3 * seconds[0]:.3f}"
    if len(seconds) > 1:
        text += f" gae_median_ms={1e3 * statistics.median(seconds[1:]):.3f}"
        text += f" (calls 2-{len(seconds)})" if len(seconds) > 2 else " (call 2)"
    return text


def make_env(env_id):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def main(argv=None):
    args = tyro.cli(Args, args=argv)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    print(f"{run_name}: bootstrap_truncated={args.bootstrap_truncated}")

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    gae_ran_on = gae_runner(device, args.gae_backend)
    print(f"device={device} gae_backend={args.gae_backend} gae_ran_on={gae_ran_on}", flush=True)

    # env setup: reset in the same step, so that infos["final_obs"] holds the true final
    # observation of an episode that just ended while next_obs is already the reset one
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id) for _ in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action spaces"

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ALGO Logic: Storage setup (time-major [num_steps, num_envs], on the training device)
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + action_shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    # step-aligned (unshifted) episode ends of the transition out of step t, and
    # V(final observation) where that transition was a truncation
    terminations = torch.zeros((args.num_steps, args.num_envs)).to(device)
    truncations = torch.zeros((args.num_steps, args.num_envs)).to(device)
    final_values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    gae_seconds = []  # one entry per GAE call (one call per iteration)
    recent_returns = deque(maxlen=20)
    solved = False
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        num_episodes = 0
        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminated, truncated)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            truncated = truncated & ~terminated  # terminated and truncated at once is terminal
            terminations[step] = torch.tensor(terminated).to(device)
            truncations[step] = torch.tensor(truncated).to(device)
            if args.bootstrap_truncated and truncated.any():
                # next_obs is already the reset observation: value the true final one
                envs_truncated = np.flatnonzero(truncated)
                final_obs = torch.Tensor(np.stack(infos["final_obs"][envs_truncated])).to(device)
                with torch.no_grad():
                    final_values[step, envs_truncated] = agent.get_value(final_obs).flatten()
            next_obs = torch.Tensor(next_obs).to(device)
            next_done = torch.Tensor(next_done).to(device)

            if "final_info" in infos:
                episodes_over = np.nonzero(infos["final_info"]["_episode"])[0]
                episodic_returns = infos["final_info"]["episode"]["r"][episodes_over]
                recent_returns.extend(episodic_returns.tolist())
                num_episodes += len(episodic_returns)

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            if device.type == "cuda":
                torch.cuda.synchronize()
            gae_start = time.perf_counter()
            if args.bootstrap_truncated:
                # V(true successor of obs[t]): the next slot's value, except after a truncation,
                # where the next slot holds the reset observation
                next_values = torch.cat((values[1:], next_value))
                next_values = torch.where(truncations.bool(), final_values, next_values)
            if args.gae_backend == "rl-triton-core":
                if args.bootstrap_truncated:
                    advantages, returns = compute_gae(
                        rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda,
                        terminations=terminations, next_values=next_values,
                    )  # fmt: skip
                else:
                    advantages, returns = compute_gae(
                        rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda
                    )
            else:
                # CleanRL's original loop, unchanged. It treats every done as terminal; to make
                # it truncation-correct, add gamma * V(final_obs) to the reward of truncated
                # steps (as Stable-Baselines3 does): their trace is cut either way.
                loop_rewards = rewards
                if args.bootstrap_truncated:
                    bootstrap = torch.where(truncations.bool(), next_values, 0.0)
                    loop_rewards = rewards + args.gamma * bootstrap
                advantages = torch.zeros_like(rewards).to(device)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = loop_rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = (
                        delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                    )
                returns = advantages + values
            if device.type == "cuda":
                torch.cuda.synchronize()
            gae_seconds.append(time.perf_counter() - gae_start)

        # flatten the batch
        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + action_shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions.long()[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_std = mb_advantages.std()
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_std + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                clipped_ratio = torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss2 = -mb_advantages * clipped_ratio
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        elapsed = time.time() - start_time
        mean_return = np.mean(recent_returns) if recent_returns else float("nan")
        print(
            f"iteration={iteration} global_step={global_step} episodic_return={mean_return:.1f} "
            f"(mean of last {len(recent_returns)}, {num_episodes} new) "
            f"SPS={int(global_step / elapsed)}",
            flush=True,
        )
        print(
            f"  value_loss={v_loss.item():.4g} explained_var={explained_var:.2f} "
            f"approx_kl={approx_kl.item():.4f} clipfrac={np.mean(clipfracs):.3f}",
            flush=True,
        )
        print(f"  {gae_times(gae_seconds)} gae_time_share={sum(gae_seconds) / elapsed:.2%}",
              flush=True)
        if args.target_return is not None and len(recent_returns) == recent_returns.maxlen:
            if mean_return >= args.target_return:
                solved = True
                break

    envs.close()
    elapsed = time.time() - start_time
    mean_return = np.mean(recent_returns) if recent_returns else float("nan")
    gae_time = sum(gae_seconds)
    print(
        f"finished: global_step={global_step} wall_time={elapsed:.1f}s "
        f"SPS={int(global_step / elapsed)} final_mean_return={mean_return:.1f}"
        + (f" solved={solved}" if args.target_return is not None else ""),
        flush=True,
    )
    print(f"gae_backend={args.gae_backend} gae_ran_on={gae_ran_on} gae_time={gae_time:.3f}s "
          f"gae_time_share={gae_time / elapsed:.2%}", flush=True)
    if gae_seconds:
        print(gae_times(gae_seconds), flush=True)
    if args.target_return is not None and not solved:
        sys.exit(f"did not reach a mean return of {args.target_return} in {global_step} steps")
    return agent


if __name__ == "__main__":
    main()
