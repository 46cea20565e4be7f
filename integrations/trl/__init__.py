"""rl_triton_trl: TRL's PPO advantages (GAE, whitening, zero fill) on ``rl_triton_core``.

TRL's PPO trainer (``trl.experimental.ppo.PPOTrainer`` in TRL 1.0 to 1.12, the releases
that the ``[trl]`` extra allows, none of them with ``trl.PPOTrainer``; TRL 1.13 removed
it) computes its advantages inline in ``PPOTrainer.train()``, not in a function that
could be swapped::

    lastgaelam = 0
    for t in reversed(range(gen_length)):
        nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
        delta = rewards[:, t] + args.gamma * nextvalues - values[:, t]
        lastgaelam = delta + args.gamma * args.lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], axis=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, ~padding_mask)
    advantages = torch.masked_fill(advantages, padding_mask, 0)

So this adapter is one function that returns exactly what that block produces,
:func:`ppo_advantages`, for a trainer of your own (a fork or subclass of TRL's
``train()``, or any loop with TRL's variables): replace the block by ::

    advantages, returns = rl_triton_trl.ppo_advantages(rewards, values, padding_mask,
                                                       args.gamma, args.lam)

and :func:`masked_whiten` with the signature of TRL's (``count_eps=0``: TRL divides by
``mask.sum()``). TRL is never imported.
"""

from __future__ import annotations

import torch

from rl_triton_core.tokens import masked_gae
from rl_triton_core.tokens import masked_whiten as _masked_whiten

__all__ = ["ppo_advantages", "masked_whiten"]


def _valid(padding_mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(padding_mask, torch.Tensor):
        raise TypeError(f"padding_mask must be a torch.Tensor, got {type(padding_mask).__name__}")
    return ~padding_mask if padding_mask.dtype == torch.bool else padding_mask == 0


def masked_whiten(values: torch.Tensor, mask: torch.Tensor,
                  shift_mean: bool = True) -> torch.Tensor:
    """TRL's ``masked_whiten``: ``(values - mean) * rsqrt(var + 1e-8)`` with the mean and the
    unbiased variance of the entries where ``mask`` is set (all rows), the mean added back
    if not ``shift_mean``. An empty mask gives NaN where TRL raises."""
    return _masked_whiten(values, mask, shift_mean=shift_mean, unbiased=True, eps=1e-8,
                          count_eps=0.0)


def ppo_advantages(rewards: torch.Tensor, values: torch.Tensor, padding_mask: torch.Tensor,
                   gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL PPO's advantages and returns: plain GAE over every position (TRL has already
    zeroed ``values`` past the response), ``returns = A + V``, then ``A`` whitened over
    the tokens where ``padding_mask`` is False and set to 0 where it is True.

    Args:
        rewards, values: ``[batch, response_len]`` (TRL's ``rewards`` and ``values``).
        padding_mask: ``[batch, response_len]``, True (nonzero) on padding (TRL's
            ``padding_mask = response_idxs > sequence_lengths``).
        gamma, lam: TRL's ``args.gamma`` and ``args.lam``.

    Returns:
        ``(advantages, returns)``, ``[batch, response_len]``.

    Example:
        >>> import torch
        >>> from rl_triton_trl import ppo_advantages
        >>> rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
        >>> values = torch.tensor([[0.5, 0.2, 0.0], [0.1, 0.3, 0.4]])
        >>> padding_mask = torch.tensor([[False, False, True], [False, False, False]])
        >>> adv, ret = ppo_advantages(rewards, values, padding_mask, gamma=1.0, lam=0.95)
        >>> ret
        tensor([[0.9600, 1.0000, 0.0000],
                [1.8390, 1.9200, 2.0000]])
    """
    valid = _valid(padding_mask)
    every = torch.ones(valid.shape, dtype=torch.bool, device=valid.device)
    with torch.no_grad():
        advantages, returns = masked_gae(rewards, values, every, gamma=gamma, lmbda=lam,
                                         skip=False, time_dim=-1)
        advantages = _masked_whiten(advantages, valid, shift_mean=True, unbiased=True,
                                    eps=1e-8, count_eps=0.0, fill=0.0)
    return advantages, returns
