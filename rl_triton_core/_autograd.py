"""Gradients of the backward estimators w.r.t. rewards and values (flags, gamma and
lambda are constants), through the adjoint of the linear recurrence.

For h_t = alpha_t + beta_t h_{t+1} (h_T = 0) with upstream gradient g_t = dL/dh_t,
the adjoint u_t = dL/dh_t (total) runs the same recurrence the other way with the
betas shifted by one step:

    u_t = g_t + beta_{t-1} u_{t-1},   u_{-1} = 0        (one forward scan: the kernel)

and dL/dalpha_t = u_t. Each estimator's alpha is linear in r_t, V_t and V'_t, so
their gradients are u_t times constants; with shifted values V'_{t-1} = V_t adds to
dL/dV_t, and V'_{T-1} = bootstrap_value.
"""

from __future__ import annotations

import torch


def _prev(x: torch.Tensor, td: int) -> torch.Tensor:
    """x_{t-1} along time (0 at t = 0)."""
    T = x.shape[td]
    return torch.cat([torch.zeros_like(x.narrow(td, 0, 1)), x.narrow(td, 0, T - 1)], td)


def _flags(terminated, truncated, dtype):
    term = terminated.to(dtype)
    done = term if truncated is None else torch.maximum(term, truncated.to(dtype))
    return term, done


class _Returns(torch.autograd.Function):
    """GAE (gae=True) or TD(lambda) returns with a backward pass."""

    @staticmethod
    def forward(ctx, fn, gae, td, rewards, values, next_values, bootstrap_value, terminated,
                truncated, gamma, lmbda):
        with torch.no_grad():
            out = fn(rewards, values, next_values, bootstrap_value)
        ctx.gae, ctx.td = gae, td
        ctx.has = (values is not None, next_values is not None, bootstrap_value is not None)
        ctx.coef = (gamma, lmbda)
        ctx.save_for_backward(terminated, truncated)
        ctx.shape = rewards.shape
        ctx.dtype = out[0].dtype if gae else out.dtype
        ctx.boot_shape = None if bootstrap_value is None else bootstrap_value.shape
        return out

    @staticmethod
    def backward(ctx, *grads):
        from rl_triton_core.estimators import linear_recurrence

        terminated, truncated = ctx.saved_tensors
        td, dtype = ctx.td, ctx.dtype
        gamma, lmbda = ctx.coef
        term, done = _flags(terminated, truncated, dtype)
        zeros = torch.zeros(ctx.shape, dtype=dtype, device=term.device)
        if ctx.gae:
            g_adv, g_target = (g if g is not None else zeros for g in grads)
            g_h = g_adv + g_target
            beta = gamma * lmbda * (1.0 - done)
            a_v_next = gamma * (1.0 - term)
        else:
            g_target = None
            g_h = grads[0] if grads[0] is not None else zeros
            last = torch.zeros_like(zeros)
            last.narrow(td, ctx.shape[td] - 1, 1).fill_(1.0)
            c = (1.0 - done) * (1.0 - last)
            beta = gamma * (1.0 - term) * lmbda * c
            a_v_next = gamma * (1.0 - term) * (1.0 - lmbda * c)
        u = linear_recurrence(g_h.contiguous(), _prev(torch.broadcast_to(beta, ctx.shape), td),
                              reverse=False, time_dim=td)
        g_rewards = u
        g_vnext = torch.broadcast_to(a_v_next * u, ctx.shape)
        has_v, has_nv, has_boot = ctx.has
        g_values = g_next = g_boot = None
        if has_v:
            g_values = -u + g_target if ctx.gae else torch.zeros_like(u)
        if has_nv:
            g_next = g_vnext
        else:
            if has_v:  # V'_{t-1} = V_t for t >= 1
                g_values = g_values + _prev(g_vnext, td)
            if has_boot:  # V'_{T-1} = bootstrap_value (summed over axes it was broadcast on)
                g_boot = g_vnext.select(td, ctx.shape[td] - 1)
                g_boot = g_boot.sum_to_size(ctx.boot_shape)
        return (None, None, None, g_rewards, g_values, g_next, g_boot, None, None, None, None)


def returns(fn, gae, td, rewards, values, next_values, bootstrap_value, terminated, truncated,
            gamma, lmbda):
    """Run ``fn(rewards, values, next_values, bootstrap_value)`` with a backward pass."""
    return _Returns.apply(fn, gae, td, rewards, values, next_values, bootstrap_value,
                          terminated, truncated, gamma, lmbda)


def wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
