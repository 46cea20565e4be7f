"""Drop-ins for OpenRLHF 0.11's advantage functions.

In OpenRLHF 0.11 ``get_advantages_and_returns`` and ``get_cumulative_returns`` are
methods of ``openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker``
(``self`` unused); these are the same functions without ``self`` (same argument names,
order and results), which ``rl_triton_openrlhf.install()`` puts on the class as static
methods. How OpenRLHF's conventions map onto the core:

* ``get_advantages_and_returns``: ``masked_gae(skip=False)`` -- rewards and values
  multiplied by the action mask, then plain GAE over every position (the last token's
  next value 0), ``returns = A + mask V``; no whitening here (OpenRLHF normalises the
  advantages of all experiences afterwards, in ``compute_advantages_and_returns``).
* ``get_cumulative_returns``: ``masked_returns(skip=False)`` -- ``R_t = mask_t r_t +
  gamma R_{t+1}``.

``action_mask=None`` means every token is valid, as in OpenRLHF. Arithmetic is float32
(float64 for float64 data) and rounds once; OpenRLHF's loop runs in the inputs' dtype.
"""

from __future__ import annotations

import torch

from rl_triton_core.tokens import masked_gae, masked_returns

__all__ = ["get_advantages_and_returns", "get_cumulative_returns"]


def _mask(action_mask, like):
    if action_mask is None:
        return torch.ones(like.shape, dtype=torch.bool, device=like.device)
    return action_mask


@torch.no_grad()
def get_advantages_and_returns(
    values: torch.Tensor,
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lambd: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's GAE: ``V <- mask V``, ``r <- mask r``, ``delta_t = r_t + gamma V_{t+1} -
    V_t`` (``V_T = 0``), ``A_t = delta_t + gamma lambd A_{t+1}``, ``returns = A + V``.

    Args:
        values, rewards: ``[batch_size, response_size]``.
        action_mask: same shape (bool / int / float), or None (all valid).
        gamma, lambd: numbers.

    Returns:
        ``(advantages, returns)``, ``[batch_size, response_size]``.

    Example:
        >>> import torch
        >>> from rl_triton_openrlhf import get_advantages_and_returns
        >>> v = torch.tensor([[0.1, 0.2, 0.3]])
        >>> r = torch.tensor([[0.0, 0.0, 1.0]])
        >>> adv, ret = get_advantages_and_returns(v, r, torch.tensor([[1, 0, 1]]), 1.0, 1.0)
        >>> adv
        tensor([[0.9000, 1.0000, 0.7000]])
    """
    mask = _mask(action_mask, values)
    return masked_gae(rewards, values, mask, gamma=gamma, lmbda=lambd, skip=False, time_dim=-1)


@torch.no_grad()
def get_cumulative_returns(
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """OpenRLHF's REINFORCE returns: ``R_t = mask_t r_t + gamma R_{t+1}``, ``R_T = 0``.

    Args:
        rewards: ``[batch_size, response_size]``.
        action_mask: same shape, or None (all valid).
        gamma: a number.

    Returns:
        ``[batch_size, response_size]`` in the rewards' dtype.

    Example:
        >>> import torch
        >>> from rl_triton_openrlhf import get_cumulative_returns
        >>> get_cumulative_returns(torch.tensor([[1.0, 5.0, 2.0]]), torch.tensor([[1, 0, 1]]), 0.5)
        tensor([[1.5000, 1.0000, 2.0000]])
    """
    mask = _mask(action_mask, rewards)
    return masked_returns(rewards, mask, gamma=gamma, skip=False, time_dim=-1)
