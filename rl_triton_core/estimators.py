"""The public estimators. Each one validates its inputs, picks the coefficient
builder (a MODE of the one scan) and runs it; the math lives in the docstrings
here, in ``reference.py`` (float64 loops) and in the coefficient builders of
``_triton_scan.py`` / ``_cpu_scan.py``.

Conventions (../shared/spec/semantics.md): flags are step-aligned,
``terminated_t`` cuts the bootstrap, ``done_t = terminated_t or truncated_t``
cuts the trace. ``V'_t`` is ``next_values[t]`` if given, else ``values[t+1]``
for ``t < T-1`` and ``bootstrap_value`` (0 if omitted) at ``t = T-1``.
"""

from __future__ import annotations

import torch

from rl_triton_core import _validate as check
from rl_triton_core._dispatch import run
from rl_triton_core._layout import Layout, normalize_time_dim
from rl_triton_core._triton_scan import MODE_GAE, MODE_LINREC, MODE_TDLAMBDA, MODE_TRACE

__all__ = [
    "gae",
    "lambda_returns",
    "discounted_returns",
    "eligibility_traces",
    "episodic_cumsum",
    "linear_recurrence",
]


def _returns_family(mode, rewards, values, terminated, truncated, next_values, bootstrap_value,
                    gamma, lmbda, time_dim, two_out):
    rewards = check.tensor("rewards", rewards)
    shape = tuple(rewards.shape)
    td = normalize_time_dim(time_dim, rewards.dim())
    if values is not None:
        values = check.tensor("values", values)
        check.same_shape("values", values, "rewards", shape)
    terminated = check.tensor("terminated", terminated, flag=True)
    check.broadcastable("terminated", terminated, shape, "rewards' shape")
    truncated = check.optional("truncated", truncated, flag=True)
    if truncated is not None:
        check.broadcastable("truncated", truncated, shape, "rewards' shape")
    next_values = check.optional("next_values", next_values)
    bootstrap_value = check.optional("bootstrap_value", bootstrap_value)
    if next_values is not None:
        if bootstrap_value is not None:
            raise ValueError(
                "pass next_values or bootstrap_value, not both: with next_values the "
                "window end bootstraps from next_values[T-1]"
            )
        check.same_shape("next_values", next_values, "rewards", shape)
    notime = shape[:td] + shape[td + 1 :]
    if bootstrap_value is not None:
        check.broadcastable("bootstrap_value", bootstrap_value, notime,
                            "the data's shape without the time axis")
    g = check.coefficient("gamma", gamma, shape)
    l = check.coefficient("lmbda", lmbda, shape)
    dtype = check.data_dtype([("rewards", rewards), ("values", values),
                              ("next_values", next_values), ("bootstrap_value", bootstrap_value)])
    device = check.same_device([
        ("rewards", rewards), ("values", values), ("terminated", terminated),
        ("truncated", truncated), ("next_values", next_values),
        ("bootstrap_value", bootstrap_value), ("gamma", g[1]), ("lmbda", l[1]),
    ])
    return run(mode, Layout(shape, td), dtype, device, x=rewards, v=values, nv=next_values,
               term=terminated, trunc=truncated, boot=bootstrap_value, g=g, l=l,
               reverse=True, two_out=two_out)


def gae(rewards, values, terminated, truncated=None, *, next_values=None, bootstrap_value=None,
        gamma=0.99, lmbda=0.95, time_dim=-1):
    r"""Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    .. math::

        \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V'_t - V_t \\
        A_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) A_{t+1}, \quad A_T = 0 \\
        G_t = A_t + V_t

    Args:
        rewards: ``[..., T, ...]`` rewards r_t, time axis at ``time_dim``.
        values: same shape, V(s_t).
        terminated: flags (bool/uint8/float), broadcastable to rewards: s_{t+1} is terminal.
        truncated: optional flags: the episode was cut after step t (bootstraps from V'_t).
        next_values: optional, same shape: V(s_{t+1}) of the true successor.
        bootstrap_value: optional, the shape without the time axis: V'_{T-1} when
            ``next_values`` is omitted (then V'_t = V_{t+1} for t < T-1).
        gamma, lmbda: floats in [0, 1] or tensors broadcastable to rewards (per step).
        time_dim: the time axis.

    Returns:
        ``(advantages, value_targets)``, new tensors with rewards' shape, in the data's dtype.

    Example::

        >>> import torch
        >>> from rl_triton_core import gae
        >>> r = torch.tensor([1.0, 1.0, 1.0]); v = torch.tensor([0.5, 0.5, 0.5])
        >>> term = torch.tensor([False, False, True])
        >>> adv, target = gae(r, v, term, gamma=0.5, lmbda=1.0)
        >>> target  # Monte-Carlo returns 1 + 0.5 * (1 + 0.5 * 1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    return _returns_family(MODE_GAE, rewards, values, terminated, truncated, next_values,
                           bootstrap_value, gamma, lmbda, time_dim, True)


def lambda_returns(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim=-1):
    r"""TD(lambda) returns (Sutton & Barto 2018, ch. 12; Peng & Williams 1996).

    .. math::

        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [(1 - \lambda c_t) V'_t + \lambda c_t G_{t+1}], \quad
        c_t = 1 - \mathrm{done}_t, \; c_{T-1} = 0

    The window end bootstraps fully from V'_{T-1}. Where V'_t = V_{t+1} at every
    step that is not done, ``G - values`` equals :func:`gae`'s advantages.
    Arguments and shapes as :func:`gae`; returns G with rewards' shape.

    Example::

        >>> import torch
        >>> from rl_triton_core import lambda_returns
        >>> r = torch.ones(3); v = torch.zeros(3); term = torch.zeros(3, dtype=torch.bool)
        >>> lambda_returns(r, v, term, bootstrap_value=torch.tensor(2.0), gamma=0.5, lmbda=1.0)
        tensor([2.0000, 2.0000, 2.0000])
    """
    return _returns_family(MODE_TDLAMBDA, rewards, values, terminated, truncated, next_values,
                           bootstrap_value, gamma, lmbda, time_dim, False)


def discounted_returns(rewards, terminated, truncated=None, *, next_values=None,
                       bootstrap_value=None, gamma=0.99, time_dim=-1):
    r"""Discounted (Monte-Carlo) returns: :func:`lambda_returns` with lambda = 1.

    .. math::

        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [\mathrm{truncated}_t V'_t + (1 - \mathrm{done}_t) G_{t+1}]

    and at t = T-1 the carry is V'_{T-1}. Without ``next_values`` there are no
    values to bootstrap from inside the window: V'_t = 0 for t < T-1 (a
    truncation there contributes nothing) and V'_{T-1} = ``bootstrap_value``.

    Example::

        >>> import torch
        >>> from rl_triton_core import discounted_returns
        >>> r = torch.ones(4); term = torch.tensor([0, 1, 0, 0], dtype=torch.bool)
        >>> discounted_returns(r, term, gamma=0.5)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    return _returns_family(MODE_TDLAMBDA, rewards, None, terminated, truncated, next_values,
                           bootstrap_value, gamma, 1.0, time_dim, False)


def _forward_family(x, done, gamma, lmbda, init, time_dim, decay_names):
    x = check.tensor("x", x)
    done = check.tensor("done", done, flag=True)
    td = normalize_time_dim(time_dim, x.dim())
    shape = tuple(x.shape)
    # done has x's shape without the trailing feature axes (it may also broadcast)
    feat = x.dim() - done.dim()
    if feat < 0 or done.dim() <= td:
        raise ValueError(
            f"done of shape {tuple(done.shape)} must be x's shape {shape} without trailing "
            f"feature axes, time axis included (time_dim={time_dim})"
        )
    done_b = done.reshape(tuple(done.shape) + (1,) * feat)
    check.broadcastable("done", done_b, shape, "x's shape (without its feature axes)")
    if init is not None:
        init = check.tensor("init", init)
        check.broadcastable("init", init, shape[:td] + shape[td + 1 :],
                            "x's shape without the time axis")
    if decay_names:
        g = check.coefficient("gamma", gamma, done.shape)
        l = check.coefficient("lmbda", lmbda, done.shape)
        g = (g[0], None if g[1] is None else g[1].reshape(tuple(g[1].shape) + (1,) * feat))
        l = (l[0], None if l[1] is None else l[1].reshape(tuple(l[1].shape) + (1,) * feat))
    else:
        g = l = (1.0, None)
    dtype = check.data_dtype([("x", x), ("init", init)])
    device = check.same_device([("x", x), ("done", done), ("init", init), ("gamma", g[1]),
                                ("lmbda", l[1])])
    return run(MODE_TRACE, Layout(shape, td), dtype, device, x=x, term=done_b, g=g, l=l,
               init=init, reverse=False)


def eligibility_traces(x, done, *, gamma=0.99, lmbda=0.95, init=None, time_dim=-1):
    r"""Accumulating eligibility traces (Sutton & Barto 2018, sec. 12.2), forward in time.

    .. math::

        z_t = x_t + \gamma_{t-1} \lambda_{t-1} (1 - \mathrm{done}_{t-1}) z_{t-1},
        \quad z_{-1} = \mathrm{init}, \; \mathrm{done}_{-1} = 0

    The decay of z_{t-1} is that of the transition out of step t-1 (a per-step
    gamma/lmbda tensor is read at t-1; at t = 0 it is read at 0).

    Args:
        x: ``[..., T, *F]``: per-step increments (e.g. gradients), trailing feature axes F.
        done: x's shape without the trailing feature axes: the episode ended after step t.
        gamma, lmbda: floats in [0, 1] or tensors broadcastable to ``done``.
        init: optional z_{-1}, x's shape without the time axis.
        time_dim: the time axis, indexing ``x``.

    Example::

        >>> import torch
        >>> from rl_triton_core import eligibility_traces
        >>> x = torch.ones(4); done = torch.tensor([False, True, False, False])
        >>> eligibility_traces(x, done, gamma=1.0, lmbda=0.5)
        tensor([1.0000, 1.5000, 1.0000, 1.5000])
    """
    return _forward_family(x, done, gamma, lmbda, init, time_dim, True)


def episodic_cumsum(x, done, *, init=None, time_dim=-1):
    r"""Running sum within episodes (episode return or length so far), forward in time.

    .. math::

        C_t = x_t + (1 - \mathrm{done}_{t-1}) C_{t-1}, \quad C_{-1} = \mathrm{init}

    Shapes as :func:`eligibility_traces`.

    Example::

        >>> import torch
        >>> from rl_triton_core import episodic_cumsum
        >>> episodic_cumsum(torch.ones(5), torch.tensor([0, 0, 1, 0, 0]))
        tensor([1., 2., 3., 1., 2.])
    """
    return _forward_family(x, done, 1.0, 1.0, init, time_dim, False)


def linear_recurrence(alpha, beta, *, reverse=True, init=None, time_dim=-1):
    r"""The primitive: a first-order linear recurrence along ``time_dim``.

    .. math::

        \text{reverse:}\; h_t = \alpha_t + \beta_t h_{t+1}, \; h_T = \mathrm{init}
        \qquad
        \text{forward:}\; h_t = \alpha_t + \beta_t h_{t-1}, \; h_{-1} = \mathrm{init}

    ``init`` defaults to 0 and has alpha's shape without the time axis; ``beta``
    broadcasts to alpha. (alpha, beta) pairs compose associatively, which is
    what lets one kernel run every estimator in parallel over time.

    Example::

        >>> import torch
        >>> from rl_triton_core import linear_recurrence
        >>> linear_recurrence(torch.ones(3), torch.full((3,), 0.5))
        tensor([1.7500, 1.5000, 1.0000])
    """
    alpha = check.tensor("alpha", alpha)
    beta = check.tensor("beta", beta)
    reverse = check.flag("reverse", reverse)
    td = normalize_time_dim(time_dim, alpha.dim())
    shape = tuple(alpha.shape)
    check.broadcastable("beta", beta, shape, "alpha's shape")
    if init is not None:
        init = check.tensor("init", init)
        check.broadcastable("init", init, shape[:td] + shape[td + 1 :],
                            "alpha's shape without the time axis")
    dtype = check.data_dtype([("alpha", alpha), ("beta", beta), ("init", init)])
    device = check.same_device([("alpha", alpha), ("beta", beta), ("init", init)])
    return run(MODE_LINREC, Layout(shape, td), dtype, device, x=alpha, v=beta, init=init,
               reverse=reverse)


# keep torch imported for doctest namespaces
_ = torch
