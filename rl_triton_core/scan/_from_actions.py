"""``retrace_from_actions`` before its scan: the per-step pieces (log rho_t, Q_t, E_t)
from the per-action tensors, beside their Triton kernels (``_actions``, loaded on first
use: the CPU path runs without Triton).

On the Triton backend one pass over the ``[..., T, A]`` tensors makes the three float32
pieces (``_actions.pieces``), or the whole target in one launch where the plan allows
(``_actions.fused``); a repeated call replays the recorded pass. Elsewhere (the CPU,
float64 data, inputs that require grad, tracing) torch ops make them
(:func:`_action_pieces`). ``estimators.retrace_from_actions`` then runs ``retrace`` on
the pieces.
"""

from __future__ import annotations

import torch

from rl_triton_core import _config
from rl_triton_core import _validate as check
from rl_triton_core._layout import Layout, normalize_time_dim
from rl_triton_core._table import TABLE
from rl_triton_core.scan import _autograd, _call, _dispatch


def pieces_of(raw: tuple, time_dim):
    """The targets (a tensor: the fused pass ran), or ``((log_rhos, q_taken,
    expected_next_q), wide)``: the pieces for ``retrace`` and the dtype they were
    computed in. ``raw``: the call's arguments, as ``retrace_from_actions`` takes
    them (``_actions.RAW_FUSED``), then ``out``. Checks the arguments
    (TypeError or ValueError naming the argument)."""
    (q_values, target_probs, actions, behaviour_log_probs, next_q_values, next_target_probs,
     bootstrap_q_values, bootstrap_target_probs, rewards, terminated, truncated, gamma,
     lmbda, c_bar, out) = raw
    key = None
    if _replayable(raw):
        key, hit = _dispatch.cached(("retrace_from_actions", type(time_dim), time_dim), raw)
        if hit is not None:  # a repeated call: its checks passed when it was recorded
            if actions.device.type == "cpu":  # (the tests' CPU plans) checked by value
                _check_actions(actions, q_values.shape[-1])
            return hit if type(hit) is torch.Tensor else (hit, torch.float32)
    q_values = check.floating("q_values", check.tensor("q_values", q_values))
    target_probs = check.floating("target_probs", check.tensor("target_probs", target_probs))
    actions = check.tensor("actions", actions)
    behaviour_log_probs = check.floating(
        "behaviour_log_probs", check.tensor("behaviour_log_probs", behaviour_log_probs))
    rewards = check.floating("rewards", check.tensor("rewards", rewards))
    if actions.is_floating_point() or actions.dtype == torch.bool:
        raise TypeError(f"actions must be an integer tensor, got dtype {actions.dtype}")
    step_shape = tuple(rewards.shape)
    if q_values.dim() != rewards.dim() + 1 or tuple(q_values.shape[:-1]) != step_shape:
        raise ValueError(f"q_values must have shape rewards' shape + (A,), i.e. "
                         f"{step_shape} + (A,), got {tuple(q_values.shape)}")
    A = q_values.shape[-1]
    for name, t in (("target_probs", target_probs), ("next_q_values", next_q_values),
                    ("next_target_probs", next_target_probs)):
        if t is not None:
            check.tensor(name, t)
            check.same_shape(name, t, "q_values", q_values.shape)
    for name, t in (("actions", actions), ("behaviour_log_probs", behaviour_log_probs)):
        check.same_shape(name, t, "rewards", step_shape)
    if (next_q_values is None) != (next_target_probs is None):
        raise ValueError("pass next_q_values and next_target_probs together, or neither")
    td = normalize_time_dim(time_dim, rewards.dim())
    if actions.device.type == "cpu" and not torch.compiler.is_compiling():
        _check_actions(actions, A)
    boot = []
    if next_q_values is None:
        notime = step_shape[:td] + step_shape[td + 1:] + (A,)
        for name, t in (("bootstrap_q_values", bootstrap_q_values),
                        ("bootstrap_target_probs", bootstrap_target_probs)):
            if t is None:
                t = q_values.new_zeros(notime)
            check.tensor(name, t)
            check.broadcastable(name, t, notime, "rewards' shape without time, plus (A,)")
            boot.append(t.expand(notime))
    # the per-action products and the log ratio in at least float32 (a bfloat16 product or
    # log rounds at 2^-8, and the recurrence can amplify it); the scan reads them as such
    wide = _autograd._cdtype(torch.promote_types(q_values.dtype, target_probs.dtype))
    if (wide == torch.float32 and behaviour_log_probs.dtype != torch.float64
            and not torch.compiler.is_compiling()
            and _dispatch.backend_for(q_values.device) == "triton"
            and not _needs_grad((q_values, target_probs, behaviour_log_probs, next_q_values,
                                 next_target_probs, *boot))):
        # one Triton pass over the [..., A] tensors (_actions); float32 pieces. Inputs that
        # require grad take the torch ops, so out= raises as retrace's does
        from rl_triton_core.scan import _actions

        layout = Layout(step_shape, td)
        if out is None and rewards.dtype == torch.float32:
            # retrace's checks of the flags and coefficients (the per-action inputs stand
            # in for its log_rhos, q_values and expected_next_q, checked above), then the
            # pieces and the scan in one pass where the plan allows
            call = _call.prepare(TABLE["retrace"], (behaviour_log_probs, rewards, rewards,
                                                    rewards, terminated, truncated, gamma,
                                                    lmbda, c_bar), time_dim)
            check.same_device([("rewards", rewards), ("q_values", q_values),
                               ("target_probs", target_probs), ("actions", actions)])
            targets = _actions.fused(layout, call.ins, call.coefs, raw, key)
            if targets is not None:
                return targets
        pieces = _actions.pieces(layout, raw[:9], key)
    else:
        pieces = None
    if pieces is None:
        pieces = _action_pieces(q_values, target_probs, actions, behaviour_log_probs,
                                next_q_values, next_target_probs, boot, td, wide)
    return pieces, wide


def _check_actions(actions, A):
    """CPU actions must lie in [0, A) (read by value: on CUDA that would synchronise)."""
    if actions.numel() and bool(((actions < 0) | (actions >= A)).any()):
        raise ValueError(f"actions must lie in [0, {A}) (the action axis of q_values)")


def _needs_grad(tensors) -> bool:
    """Grad mode is on and one of these (tensors or None) requires grad."""
    return torch.is_grad_enabled() and any(
        type(t) is torch.Tensor and t.requires_grad for t in tensors)


def _replayable(raw) -> bool:
    """Whether a retrace_from_actions call may replay a recorded pass over the actions:
    on the Triton backend (CUDA; CPU tensors under the interpreter only with the tests'
    ``cpu_plans``), not while tracing, and not where an input needs autograd."""
    q = raw[0]
    return (type(q) is torch.Tensor and (q.is_cuda or _config._current.cpu_plans)
            and not torch.compiler.is_compiling()
            and _dispatch.backend_for(q.device) == "triton" and not _needs_grad(raw[:8]))


def _action_pieces(q_values, target_probs, actions, behaviour_log_probs, next_q_values,
                   next_target_probs, boot, td, wide):
    """retrace_from_actions' (log_rhos, q_taken, expected_next_q) by torch ops (the CPU
    path, float64, tracing)."""
    idx = actions.long().unsqueeze(-1)
    q_taken = q_values.gather(-1, idx).squeeze(-1)
    log_rhos = target_probs.gather(-1, idx).squeeze(-1).to(wide).log() - behaviour_log_probs
    if next_q_values is not None:
        return log_rhos, q_taken, (next_target_probs.to(wide) * next_q_values.to(wide)).sum(-1)
    # E over each step's own state, then shifted by one step: the [.., A] tensors are
    # read once (shifting them first copied both of them)
    T = q_taken.shape[td]
    e_own = (target_probs.to(wide) * q_values.to(wide)).sum(-1)
    e_boot = (boot[1].to(wide) * boot[0].to(wide)).sum(-1).unsqueeze(td)
    return log_rhos, q_taken, torch.cat([e_own.narrow(td, 1, T - 1), e_boot], td) if T else e_own
