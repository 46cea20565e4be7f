"""Drop-in functions with the signatures of RLlib's own (swap one import).

* :func:`compute_value_targets` ==
  ``ray.rllib.utils.postprocessing.value_predictions.compute_value_targets``
* :func:`vtrace_torch` == ``ray.rllib.algorithms.impala.torch.vtrace_torch_v2.vtrace_torch``

Each maps RLlib's arguments onto one call of the core's ``gae`` / ``vtrace``; the math
lives in ``rl_triton_core`` (``docs/semantics.md``). Neither imports Ray.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from rl_triton_rllib import _core


def _as_tensor(name: str, x, device=None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if device is None else x.to(device)
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x)).to(device or "cpu")
    raise TypeError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def compute_value_targets(values, rewards, terminateds, truncateds, gamma: float,
                          lambda_: float):
    """GAE value targets on RLlib's flat stream: RLlib's ``compute_value_targets``.

    Same arguments and result as RLlib's function: 1-D ``values``, ``rewards``,
    ``terminateds``, ``truncateds`` over a flat stream of episode chunks (each chunk
    followed by its extra bootstrap step), value targets ``A_t + V_t`` as float32.
    NumPy inputs give a NumPy result, torch inputs a tensor on their device.

    The mapping is the identity: RLlib's flags are already step-aligned
    (``terminateds[t]`` gates the bootstrap out of step t, ``terminateds[t] or
    truncateds[t]`` stops the trace), V'_t = V_{t+1} (shifted values), and the last
    step's V' is 0 (RLlib's dummy, ``bootstrap_value=None``).
    """
    as_numpy = not isinstance(values, torch.Tensor)
    v = _as_tensor("values", values)
    device = v.device
    r = _as_tensor("rewards", rewards, device)
    if r.dtype != v.dtype:
        r = r.to(v.dtype)
    _, targets = _core.gae(
        r, v,
        _as_tensor("terminateds", terminateds, device),
        _as_tensor("truncateds", truncateds, device),
        gamma=gamma, lmbda=lambda_, time_dim=-1,
    )
    targets = targets.to(torch.float32)
    return targets.cpu().numpy() if as_numpy else targets


def _floating(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Integer or bool data (e.g. an env's integer rewards) in the values' float dtype, as
    RLlib's arithmetic promotes it (the core takes float data only)."""
    return x if x.is_floating_point() else x.to(dtype)


def _threshold(x):
    """RLlib passes ``None`` for "no clipping"."""
    return math.inf if x is None else x


def vtrace_torch(*, target_action_log_probs, behaviour_action_log_probs, discounts, rewards,
                 values, bootstrap_values, clip_rho_threshold=1.0,
                 clip_pg_rho_threshold=1.0, truncateds=None):
    """V-trace on ``[T, B]`` time-major tensors: RLlib's ``vtrace_torch``.

    Same keyword arguments and (detached) ``(vs, pg_advantages)`` as RLlib's function,
    computed by one call of ``rl_triton_core.vtrace``. RLlib's ``discounts`` (gamma
    times ``1 - terminated`` times the loss mask) are passed as the per-step gamma;
    the trace coefficient is ``min(1, rho)`` (``c_bar = 1``, ``lmbda = 1``), as in
    RLlib. With ``truncateds=None`` the result equals RLlib's to float32 rounding.

    ``truncateds`` (``[T, B]`` flags, not in RLlib's signature) switches on correct
    bootstrapping at chunk ends: a flagged step stops the trace and bootstraps from
    V'_t = the next slot's value (the chunk's extra step), instead of RLlib's
    zero-discount extra step cancelling that bootstrap. See ``docs/rllib.md``.
    """
    with torch.no_grad():
        log_rhos = target_action_log_probs.detach() - behaviour_action_log_probs.detach()
        discounts = discounts.detach()
        vs, pg_advantages = _core.vtrace(
            log_rhos, _floating(rewards.detach(), values.dtype), values.detach(),
            discounts == 0,  # no bootstrap where RLlib's discount is 0 (also implied by gamma)
            truncateds,
            bootstrap_value=bootstrap_values.detach(),
            gamma=discounts, lmbda=1.0,
            rho_bar=_threshold(clip_rho_threshold), c_bar=1.0,
            pg_rho_bar=_threshold(clip_pg_rho_threshold),
            time_dim=0,
        )
    return vs.detach().to(values.dtype), pg_advantages.detach().to(values.dtype)
