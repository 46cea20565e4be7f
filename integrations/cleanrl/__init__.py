"""rl_triton_cleanrl: CleanRL's GAE loop as one call to ``rl_triton_core.gae``.

CleanRL keeps its rollout time-major, ``[num_steps, num_envs]``, and stores its
done flags *shifted by one*: ``dones[t]`` says that ``obs[t]`` is the first
observation of a new episode, i.e. that the transition out of step ``t - 1``
ended an episode; the flag of the last transition is kept apart in
``next_done``. The core takes *step-aligned* flags (the flag of step ``t``
describes the transition out of step ``t``), so the whole mapping is::

    done_t      = dones[t + 1]   for t < T - 1
    done_{T-1}  = next_done
    V'_t        = values[t + 1]  for t < T - 1      (value of the next slot)
    V'_{T-1}    = next_value

This module only re-aligns flags and values; the recurrence is the core's
(see ``docs/cleanrl.md`` and the project's ``semantics.md``).
"""

from __future__ import annotations

import torch

from rl_triton_core import gae

__all__ = ["compute_gae"]


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    next_done: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    terminations: torch.Tensor | None = None,
    next_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on CleanRL's buffers: returns ``(advantages, returns)``, both ``[T, N]``.

    A drop-in replacement for the ``for t in reversed(range(args.num_steps))``
    block of CleanRL's PPO scripts, with CleanRL's own names and layout. The
    buffers stay on their device: CUDA tensors run the Triton kernel, CPU
    tensors the core's CPU path.

    Args:
        rewards: ``[T, N]``; ``rewards[t]`` is the reward of the step out of ``obs[t]``.
        values: ``[T, N]``; ``values[t] = V(obs[t])``.
        dones: ``[T, N]``, CleanRL's *shifted* flags: ``dones[t] = 1`` when
            ``obs[t]`` is the reset observation that follows an episode end
            (the transition out of step ``t - 1`` ended the episode).
            ``dones[0]`` refers to the previous rollout and is not read.
        next_value: ``[N]`` or ``[1, N]``; ``V(next_obs)`` of the observation
            after the last step (CleanRL's ``agent.get_value(next_obs).reshape(1, -1)``).
        next_done: ``[N]``; whether the last transition (out of step ``T - 1``)
            ended an episode.
        gamma: discount factor.
        gae_lambda: GAE's lambda.
        terminations: optional ``[T, N]``, *step-aligned* (not shifted):
            ``terminations[t] = 1`` when the transition out of step ``t``
            reached a terminal state (gymnasium's ``terminated`` returned by
            the ``envs.step`` of step ``t``). Every other episode end in
            ``dones``/``next_done`` then counts as a truncation (time limit):
            its advantage bootstraps from ``next_values``. Without this
            argument every episode end counts as terminal, which is
            CleanRL's original behaviour.
        next_values: ``[T, N]``, required with ``terminations`` and only
            with it; ``next_values[t] = V(s_{t+1})`` of the *true* successor
            of step ``t``: ``values[t + 1]`` (``next_value`` at ``t = T - 1``)
            where no episode ended, the value of the final observation
            (gymnasium's ``infos["final_obs"]`` with same-step autoreset)
            at a truncated step. Not read at terminated steps.

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values``, new
        tensors in the data's dtype. Inputs are not modified.

    With ``terminations is None`` this equals CleanRL's loop::

        lastgaelam = 0
        for t in reversed(range(T)):
            if t == T - 1:
                nextnonterminal = 1.0 - next_done
                nextvalues = next_value
            else:
                nextnonterminal = 1.0 - dones[t + 1]
                nextvalues = values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    Example (4 steps, 2 envs; env 0's episode ends after step 1, so
    ``obs[2]`` is a reset observation and ``dones[2, 0] = 1``):

        >>> import torch
        >>> from rl_triton_cleanrl import compute_gae
        >>> rewards, values = torch.ones(4, 2), torch.zeros(4, 2)
        >>> dones = torch.zeros(4, 2)
        >>> dones[2, 0] = 1.0
        >>> next_value, next_done = torch.zeros(1, 2), torch.zeros(2)
        >>> adv, ret = compute_gae(rewards, values, dones, next_value, next_done, 0.5, 1.0)
        >>> adv.T.tolist()
        [[1.5, 1.0, 1.5, 1.0], [1.875, 1.75, 1.5, 1.0]]

    The same rollout where env 0's episode end was a time limit
    (truncation), with ``V(final_obs) = 2``: step 1 now bootstraps from it.

        >>> terminations = torch.zeros(4, 2)
        >>> next_values = torch.cat((values[1:], next_value))
        >>> next_values[1, 0] = 2.0
        >>> adv, ret = compute_gae(rewards, values, dones, next_value, next_done, 0.5, 1.0,
        ...                        terminations=terminations, next_values=next_values)
        >>> adv.T.tolist()
        [[2.0, 2.0, 1.5, 1.0], [1.875, 1.75, 1.5, 1.0]]
    """
    tensors = {
        "rewards": rewards,
        "values": values,
        "dones": dones,
        "next_value": next_value,
        "next_done": next_done,
        "terminations": terminations,
        "next_values": next_values,
    }
    for name, x in tensors.items():
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
        if x.device != rewards.device:
            raise ValueError(
                f"{name}: expected a tensor on {rewards.device} like rewards, got {x.device}"
            )
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards: expected CleanRL's [num_steps, num_envs] buffer, got shape "
            f"{tuple(rewards.shape)}"
        )
    num_steps, num_envs = rewards.shape
    for name, x in (("values", values), ("dones", dones)):
        if x.shape != rewards.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(rewards.shape)} like rewards, got {tuple(x.shape)}"
            )
    for name, x in (("next_value", next_value), ("next_done", next_done)):
        if x.numel() != num_envs and x.numel() == num_steps:
            raise ValueError(
                f"rewards, values and dones have shape {tuple(rewards.shape)}, read as "
                f"[num_steps={num_steps}, num_envs={num_envs}], but {name} has "
                f"{x.numel()} entries, rewards.shape[0]: the buffers look transposed "
                "(CleanRL's are [num_steps, num_envs], time first)"
            )
        if x.numel() != num_envs:
            raise ValueError(
                f"{name}: expected {num_envs} entries ([num_envs] or [1, num_envs]), got shape "
                f"{tuple(x.shape)}"
            )
    if (terminations is None) != (next_values is None):
        given, missing = (
            ("terminations", "next_values")
            if next_values is None
            else ("next_values", "terminations")
        )
        raise ValueError(
            "terminations and next_values: pass both (truncation-correct GAE) or neither "
            f"(CleanRL's original); got {given} without {missing}"
        )

    # Step-aligned done flags: the flag of the transition out of step t.
    done = torch.cat((dones[1:], next_done.reshape(1, num_envs).to(dones.dtype)), dim=0)

    if terminations is None:
        # CleanRL's original: every episode end is terminal, and the next value is the
        # next slot's (shifted form: V'_t = values[t + 1], V'_{T-1} = next_value).
        return gae(
            rewards,
            values,
            done,
            bootstrap_value=next_value.reshape(num_envs),
            gamma=gamma,
            lmbda=gae_lambda,
            time_dim=0,
        )

    for name, x in (("terminations", terminations), ("next_values", next_values)):
        if x.shape != rewards.shape:
            raise ValueError(
                f"{name}: expected shape {tuple(rewards.shape)} like rewards, got {tuple(x.shape)}"
            )
    terminated = terminations != 0
    truncated = (done != 0) & ~terminated
    return gae(
        rewards,
        values,
        terminated,
        truncated,
        next_values=next_values,
        gamma=gamma,
        lmbda=gae_lambda,
        time_dim=0,
    )
