"""Drop-ins for verl 0.9.1's advantage estimators (``verl.trainer.ppo.core_algos``).

Same names, signatures and return values as verl's; the recursion runs in
``rl_triton_core`` (one Triton kernel on CUDA tensors, a compiled loop on CPU tensors),
the group statistics in :func:`rl_triton_core.group_advantages`, with no Python loop over
tokens or groups. How verl's conventions map onto the core:

* ``compute_gae_advantage_return``: ``masked_gae(skip=True, whiten=True,
  count_eps=1e-8)`` -- masked (observation / padding) tokens carry the advantage and
  the next value across them; advantages whitened over the valid tokens of the whole
  batch like ``verl_F.masked_whiten``; ``returns = A + V`` before whitening.
* ``compute_reinforce_plus_plus_outcome_advantage``: ``masked_returns(skip=True)`` then
  ``masked_whiten(count_eps=1e-8, fill=0.0)``.
* ``compute_grpo_outcome_advantage`` (and ``..._vectorized``): ``group_advantages``
  ``"grpo"``, or ``"grpo_mean"`` (Dr. GRPO) with ``norm_adv_by_std_in_grpo=False``;
  ``compute_rloo_outcome_advantage`` (and ``..._vectorized``): ``"rloo"``. The response
  score is ``token_level_rewards.sum(-1)``; the advantage is broadcast over the tokens
  times ``response_mask``; ``(advantages, advantages)`` is returned, as verl does.

``index`` (verl's ``uid`` array, a numpy array of strings) is mapped to integer ids on
the host with ``np.unique(return_inverse=True)`` -- it is host data already -- and the
ids are copied to the scores' device (asynchronously, from pinned memory, on CUDA).

Differences from verl, all documented in ``docs/llm.md``:

* verl raises when the mask has no valid token (or one, under the unbiased variance);
  raising would read the device, so these give NaN / inf instead.
* verl's arithmetic runs in the inputs' dtype step by step (bfloat16 rounds at every
  token); the core accumulates in float32 (float64 for float64 data) and rounds once.
  verl's Bessel factor ``n / (n - 1)`` of an integer mask is a float32 number, the
  core's is exact; verl's group of one under GRPO divides by ``tensor(1.0) + epsilon``
  in float32; the vectorised GRPO computes group statistics in float32. Each of these
  puts float64 results 1e-8 to 1e-7 (relative) apart.
* ``compute_reinforce_plus_plus_outcome_advantage`` without ``config`` raises a
  ValueError (verl: an AssertionError).
"""

from __future__ import annotations

import numpy as np
import torch

from rl_triton_core.groups import group_advantages, group_sizes
from rl_triton_core.tokens import masked_gae, masked_returns, masked_whiten

__all__ = [
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
]

VERL_WHITEN_COUNT_EPS = 1e-8  # verl_F.masked_mean divides by mask.sum() + 1e-8


def _number(value):
    """verl annotates gamma / lam as tensors; a 0-dim tensor is read once on the host."""
    return float(value) if isinstance(value, torch.Tensor) else value


def _verl_dtype(*tensors) -> torch.dtype:
    """The dtype verl's loops end in: float inputs promoted (int / bool masks do not count)."""
    dtypes = [t.dtype for t in tensors if t.is_floating_point()]
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)


def group_ids(index, batch: int, device) -> tuple[torch.Tensor, int]:
    """verl's ``index`` (uid labels, host data) -> ``([B] int64 ids on device, n_groups)``.

    Labels are compared by value, as verl's dict of labels does: ``np.unique`` where they
    sort, first-seen order where they do not (mixed types).
    """
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    arr = np.asarray(index)
    if arr.dtype == object and arr.ndim != 1:
        arr = np.array(list(index), dtype=object)
    arr = arr.reshape(-1)
    if arr.shape[0] != batch:
        raise ValueError(f"index must have one label per response ({batch}), got {arr.shape[0]}")
    try:
        uniq, inv = np.unique(arr, return_inverse=True)
        n = len(uniq)
    except TypeError:  # labels that do not sort (mixed types)
        seen: dict = {}
        inv = np.array([seen.setdefault(x, len(seen)) for x in arr.tolist()], dtype=np.int64)
        n = len(seen)
    ids = torch.from_numpy(np.ascontiguousarray(inv.reshape(-1), dtype=np.int64))
    device = torch.device(device)
    if device.type == "cuda":
        ids = ids.pin_memory().to(device, non_blocking=True)
    else:
        ids = ids.to(device)
    return ids, max(n, 1)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: torch.Tensor,
    lam: torch.Tensor,
):
    """verl's GAE with observation-token skipping, then whitening over the batch.

    ``nv_t = m_t V_t + (1 - m_t) nv_{t+1}``, ``A_t = m_t (r_t + gamma nv_{t+1} - V_t +
    gamma lam A_{t+1}) + (1 - m_t) A_{t+1}``; ``returns = A + V``; advantages whitened
    over the valid tokens of the whole batch (``verl_F.masked_whiten``).

    Args:
        token_level_rewards, values, response_mask: ``[bs, response_length]``.
        gamma, lam: numbers (or 0-dim tensors, read on the host).

    Returns:
        ``(advantages, returns)``, ``[bs, response_length]``.

    Example:
        >>> import torch
        >>> from rl_triton_verl.core_algos import compute_gae_advantage_return
        >>> r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]])
        >>> v = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
        >>> m = torch.tensor([[1, 0, 1], [1, 1, 0]])
        >>> adv, ret = compute_gae_advantage_return(r, v, m, gamma=1.0, lam=1.0)
        >>> ret  # A + V, also on masked tokens (verl's convention)
        tensor([[1.0000, 0.9000, 1.0000],
                [0.5000, 0.5000, 0.6000]])
    """
    dtype = _verl_dtype(token_level_rewards, values, response_mask)  # a float mask counts
    with torch.no_grad():
        return masked_gae(_cast(token_level_rewards, dtype), _cast(values, dtype), response_mask,
                          gamma=_number(gamma), lmbda=_number(lam), skip=True, whiten=True,
                          count_eps=VERL_WHITEN_COUNT_EPS, time_dim=-1)


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's REINFORCE++: discounted returns over the valid tokens (``config.gamma``),
    whitened over the batch, zero on masked tokens.

    Returns:
        ``(advantages, returns)``, ``[bs, response_length]``; returns are 0 on masked tokens.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from rl_triton_verl.core_algos import compute_reinforce_plus_plus_outcome_advantage
        >>> r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
        >>> m = torch.tensor([[1, 0, 1], [1, 1, 0]])
        >>> adv, ret = compute_reinforce_plus_plus_outcome_advantage(
        ...     r, m, config=SimpleNamespace(gamma=0.5))
        >>> ret
        tensor([[0.5000, 0.0000, 1.0000],
                [1.0000, 2.0000, 0.0000]])
    """
    if config is None:
        raise ValueError("config is required: its gamma is the discount (verl asserts it)")
    with torch.no_grad():
        returns = masked_returns(token_level_rewards, response_mask,
                                 gamma=_number(config.gamma), skip=True, time_dim=-1)
        advantages = masked_whiten(returns, response_mask, count_eps=VERL_WHITEN_COUNT_EPS,
                                   fill=0.0)
    return _cast(advantages, _verl_dtype(returns, response_mask)), returns


def _outcome(token_level_rewards, response_mask, index, method, epsilon, dtype=None,
             singletons_zero=False):
    scores = token_level_rewards.sum(dim=-1)
    with torch.no_grad():
        if dtype is not None:
            scores = scores.to(dtype)
        ids, n = group_ids(index, scores.shape[0], scores.device)
        adv = group_advantages(scores, ids, method=method, eps=epsilon, num_groups=n)
        if singletons_zero:
            adv = adv * (group_sizes(ids, num_groups=n) > 1)
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO outcome advantage: ``(s - mean_g) / (std_g + epsilon)`` per prompt group
    (``index``), or Dr. GRPO's ``s - mean_g`` with ``norm_adv_by_std_in_grpo=False``;
    a group of one has mean 0 and std 1. ``s = token_level_rewards.sum(-1)``.

    Returns:
        ``(advantages, advantages)``: ``[bs, response_length]``, the response's advantage
        times ``response_mask``.

    Example:
        >>> import numpy as np, torch
        >>> from rl_triton_verl.core_algos import compute_grpo_outcome_advantage
        >>> r = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
        >>> m = torch.ones(3, 2)
        >>> adv, _ = compute_grpo_outcome_advantage(r, m, np.array(["a", "a", "b"], dtype=object))
        >>> adv
        tensor([[ 0.7071,  0.7071],
                [-0.7071, -0.7071],
                [ 1.0000,  1.0000]])
    """
    method = "grpo" if norm_adv_by_std_in_grpo else "grpo_mean"
    return _outcome(token_level_rewards, response_mask, index, method, epsilon)


def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``grpo_vectorized``: GRPO as :func:`compute_grpo_outcome_advantage`, with
    verl's vectorised form's dtype (at least float32: its group statistics are float32)."""
    scores_dtype = torch.promote_types(token_level_rewards.dtype, torch.float32)
    method = "grpo" if norm_adv_by_std_in_grpo else "grpo_mean"
    return _outcome(token_level_rewards, response_mask, index, method, epsilon,
                    dtype=scores_dtype)


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's RLOO: ``s n/(n-1) - mean_g n/(n-1)`` (the score minus the mean of the
    others in its group); a group of one keeps its score.

    Returns:
        ``(advantages, advantages)``, ``[bs, response_length]``.
    """
    return _outcome(token_level_rewards, response_mask, index, "rloo", epsilon)


def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's ``rloo_vectorized``: RLOO, except that a group of one gets 0 (verl's
    vectorised form differs from its loop there), in verl's dtype for it (float32 for
    float32 rewards, else float64: ``torch.bincount`` with weights)."""
    dtype = torch.float32 if token_level_rewards.dtype == torch.float32 else torch.float64
    return _outcome(token_level_rewards, response_mask, index, "rloo", epsilon, dtype=dtype,
                    singletons_zero=True)


REGISTRY_NAMES = {
    "gae": "compute_gae_advantage_return",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "grpo": "compute_grpo_outcome_advantage",
    "grpo_vectorized": "compute_grpo_vectorized_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
    "rloo_vectorized": "compute_rloo_vectorized_outcome_advantage",
}
"""verl's ``ADV_ESTIMATOR_REGISTRY`` key -> the function (same name here and in verl)."""
