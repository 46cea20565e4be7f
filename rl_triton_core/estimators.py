"""The public estimators. Each one validates its inputs, picks the coefficient
builder (a MODE of the one scan) and runs it; the math lives in the docstrings
here, in ``reference.py`` (float64 loops) and in the coefficient builders of
``_triton_scan.py`` / ``_cpu_scan.py``.

Conventions (../shared/spec/semantics.md): flags are step-aligned,
``terminated_t`` cuts the bootstrap, ``done_t = terminated_t or truncated_t``
cuts the trace. ``V'_t`` is ``next_values[t]`` if given, else ``values[t+1]``
for ``t < T-1`` and ``bootstrap_value`` (0 if omitted) at ``t = T-1``.

``out=`` (every estimator): write the result into the caller's tensors instead of
allocating, as torch's ``out=`` does -- a tensor, or a tuple of two for the
two-output estimators; the data's shape and device, any floating dtype (the scan
accumulates in float32 or better and casts on store), no memory shared with an
input or between the two outputs (checked on the pointers, without a host
synchronisation). Any strides work; where the scan cannot address them as
[lead, trailing, T] strides, it writes a temporary that is then copied in. Not
with autograd (as torch: RuntimeError), and under torch.compile the op's result is
copied into ``out``.
"""

from __future__ import annotations

import torch

from rl_triton_core import _autograd, _fastpath, _ops
from rl_triton_core import _validate as check
from rl_triton_core._dispatch import run
from rl_triton_core._layout import Layout, normalize_time_dim
from rl_triton_core._triton_scan import (
    MODE_GAE,
    MODE_LINREC,
    MODE_RETRACE,
    MODE_TDLAMBDA,
    MODE_TRACE,
    MODE_VTRACE,
)

__all__ = [
    "gae",
    "lambda_returns",
    "discounted_returns",
    "eligibility_traces",
    "episodic_cumsum",
    "linear_recurrence",
    "vtrace",
    "retrace",
    "retrace_from_actions",
]


def _no_grad_out(fn, out, *tensors):
    """out= with autograd is an error, as in torch: where grad mode is on and ``out`` or
    a tensor the estimator differentiates (``tensors``) requires grad."""
    if not torch.is_grad_enabled():
        return
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*tensors, *outs)):
        raise RuntimeError(
            f"{fn}(): functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad: call it without out= "
            "to differentiate through it (or under torch.no_grad())"
        )


def _returns_family(mode, rewards, values, terminated, truncated, next_values, bootstrap_value,
                    gamma, lmbda, time_dim, two_out, log_rhos=None, thresholds=None,
                    values_name="values", next_name="next_values", out=None):
    thresholds = thresholds or {}
    slots = (rewards, values, next_values, terminated, truncated, bootstrap_value, None,
             log_rhos, gamma, lmbda, thresholds.get("rho_bar"), thresholds.get("c_bar"),
             thresholds.get("pg_rho_bar"), *_fastpath.out_slots(out, two_out))
    key = _fastpath.key_of((mode, time_dim), slots)
    hit = _fastpath.lookup(key, slots)
    if hit is not None:
        return hit
    rewards = check.tensor("rewards", rewards)
    shape = tuple(rewards.shape)
    td = normalize_time_dim(time_dim, rewards.dim())
    if values is not None:
        values = check.tensor(values_name, values)
        check.same_shape(values_name, values, "rewards", shape)
    if log_rhos is not None:
        log_rhos = check.tensor("log_rhos", log_rhos)
        check.same_shape("log_rhos", log_rhos, "rewards", shape)
    terminated = check.tensor("terminated", terminated, flag=True)
    check.broadcastable("terminated", terminated, shape, "rewards' shape")
    truncated = check.optional("truncated", truncated, flag=True)
    if truncated is not None:
        check.broadcastable("truncated", truncated, shape, "rewards' shape")
    next_values = check.optional(next_name, next_values)
    bootstrap_value = check.optional("bootstrap_value", bootstrap_value)
    if next_values is not None:
        if bootstrap_value is not None:
            raise ValueError(
                "pass next_values or bootstrap_value, not both: with next_values the "
                "window end bootstraps from next_values[T-1]"
            )
        check.same_shape(next_name, next_values, "rewards", shape)
    notime = shape[:td] + shape[td + 1 :]
    if bootstrap_value is not None:
        check.broadcastable("bootstrap_value", bootstrap_value, notime,
                            "the data's shape without the time axis")
    g = check.coefficient("gamma", gamma, shape)
    l = check.coefficient("lmbda", lmbda, shape)
    thr = {k: check.coefficient(k, val, shape, hi=None) for k, val in thresholds.items()}
    dtype = check.data_dtype([("rewards", rewards), (values_name, values),
                              (next_name, next_values), ("bootstrap_value", bootstrap_value),
                              ("log_rhos", log_rhos)])
    named = [
        ("rewards", rewards), (values_name, values), ("terminated", terminated),
        ("truncated", truncated), (next_name, next_values),
        ("bootstrap_value", bootstrap_value), ("log_rhos", log_rhos), ("gamma", g[1]),
        ("lmbda", l[1]), *[(k, c[1]) for k, c in thr.items()],
    ]
    device = check.same_device(named)
    if out is not None:
        out = check.outputs(out, two_out, shape, device, named)
    one = (1.0, None)
    return run(mode, Layout(shape, td), dtype, device, x=rewards, v=values, nv=next_values,
               term=terminated, trunc=truncated, boot=bootstrap_value, g=g, l=l, rho=log_rhos,
               rb=thr.get("rho_bar", one), cb=thr.get("c_bar", one),
               pb=thr.get("pg_rho_bar", one), reverse=True, two_out=two_out, fast=(key, slots),
               out=out)


def gae(rewards, values, terminated, truncated=None, *, next_values=None, bootstrap_value=None,
        gamma=0.99, lmbda=0.95, time_dim=-1, out=None):
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
        out: optional ``(advantages, value_targets)`` tensors to write into (saves the
            allocation in a hot loop): rewards' shape and device, any floating dtype
            (e.g. float32 outputs for bf16 data: the scan accumulates in float32 and
            casts on store), any strides (a layout the scan cannot address directly goes
            through a temporary and a copy), memory shared with no input and not with
            each other (ValueError). Not with autograd (RuntimeError, as torch).

    Returns:
        ``(advantages, value_targets)``, new tensors with rewards' shape, in the data's
        dtype; with ``out``, the tuple ``(out[0], out[1])`` (the same tensor objects).

    Example::

        >>> import torch
        >>> from rl_triton_core import gae
        >>> r = torch.tensor([1.0, 1.0, 1.0]); v = torch.tensor([0.5, 0.5, 0.5])
        >>> term = torch.tensor([False, False, True])
        >>> adv, target = gae(r, v, term, gamma=0.5, lmbda=1.0)
        >>> target  # Monte-Carlo returns 1 + 0.5 * (1 + 0.5 * 1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("gae", dict(
            rewards=rewards, values=values, terminated=terminated, truncated=truncated,
            next_values=next_values, bootstrap_value=bootstrap_value, gamma=gamma, lmbda=lmbda,
            time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("gae", out, rewards, values, next_values, bootstrap_value)
    if _autograd.wants_grad(rewards, values, next_values, bootstrap_value):
        def call(r, v, nv, b):
            return gae(r, v, terminated, truncated, next_values=nv, bootstrap_value=b,
                       gamma=gamma, lmbda=lmbda, time_dim=time_dim)

        return _differentiable(call, True, rewards, values, terminated, truncated, next_values,
                               bootstrap_value, gamma, lmbda, time_dim)
    return _returns_family(MODE_GAE, rewards, values, terminated, truncated, next_values,
                           bootstrap_value, gamma, lmbda, time_dim, True, out=out)


def lambda_returns(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim=-1, out=None):
    r"""TD(lambda) returns (Sutton & Barto 2018, ch. 12; Peng & Williams 1996).

    .. math::

        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [(1 - \lambda c_t) V'_t + \lambda c_t G_{t+1}], \quad
        c_t = 1 - \mathrm{done}_t, \; c_{T-1} = 0

    The window end bootstraps fully from V'_{T-1}. Where V'_t = V_{t+1} at every
    step that is not done, ``G - values`` equals :func:`gae`'s advantages.
    Arguments and shapes as :func:`gae`; returns G with rewards' shape. The
    formula never reads V_t itself: with ``next_values`` given, ``values`` may be
    None.

    Args:
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma,
            lmbda, time_dim: as :func:`gae`.
        out: optional tensor to write G into (returned as is): as :func:`gae`'s
            ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import lambda_returns
        >>> r = torch.ones(3); v = torch.zeros(3); term = torch.zeros(3, dtype=torch.bool)
        >>> lambda_returns(r, v, term, bootstrap_value=torch.tensor(2.0), gamma=0.5, lmbda=1.0)
        tensor([2., 2., 2.])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("lambda_returns", dict(
            rewards=rewards, values=values, terminated=terminated, truncated=truncated,
            next_values=next_values, bootstrap_value=bootstrap_value, gamma=gamma, lmbda=lmbda,
            time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("lambda_returns", out, rewards, values, next_values, bootstrap_value)
    if _autograd.wants_grad(rewards, values, next_values, bootstrap_value):
        def call(r, v, nv, b):
            return lambda_returns(r, v, terminated, truncated, next_values=nv,
                                  bootstrap_value=b, gamma=gamma, lmbda=lmbda,
                                  time_dim=time_dim)

        return _differentiable(call, False, rewards, values, terminated, truncated,
                               next_values, bootstrap_value, gamma, lmbda, time_dim)
    return _returns_family(MODE_TDLAMBDA, rewards, values, terminated, truncated, next_values,
                           bootstrap_value, gamma, lmbda, time_dim, False, out=out)


def discounted_returns(rewards, terminated, truncated=None, *, next_values=None,
                       bootstrap_value=None, gamma=0.99, time_dim=-1, out=None):
    r"""Discounted (Monte-Carlo) returns: :func:`lambda_returns` with lambda = 1.

    .. math::

        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [\mathrm{truncated}_t V'_t + (1 - \mathrm{done}_t) G_{t+1}]

    and at t = T-1 the carry is V'_{T-1}. Without ``next_values`` there are no
    values to bootstrap from inside the window: V'_t = 0 for t < T-1 (a
    truncation there contributes nothing) and V'_{T-1} = ``bootstrap_value``.

    Args:
        rewards, terminated, truncated, next_values, bootstrap_value, gamma, time_dim:
            as :func:`gae`.
        out: optional tensor to write G into (returned as is): as :func:`gae`'s
            ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import discounted_returns
        >>> r = torch.ones(4); term = torch.tensor([0, 1, 0, 0], dtype=torch.bool)
        >>> discounted_returns(r, term, gamma=0.5)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("discounted_returns", dict(
            rewards=rewards, terminated=terminated, truncated=truncated, next_values=next_values,
            bootstrap_value=bootstrap_value, gamma=gamma, time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("discounted_returns", out, rewards, next_values, bootstrap_value)
    if _autograd.wants_grad(rewards, next_values, bootstrap_value):
        def call(r, v, nv, b):
            return discounted_returns(r, terminated, truncated, next_values=nv,
                                      bootstrap_value=b, gamma=gamma, time_dim=time_dim)

        return _differentiable(call, False, rewards, None, terminated, truncated, next_values,
                               bootstrap_value, gamma, 1.0, time_dim)
    return _returns_family(MODE_TDLAMBDA, rewards, None, terminated, truncated, next_values,
                           bootstrap_value, gamma, 1.0, time_dim, False, out=out)


def _differentiable(call, is_gae, rewards, values, terminated, truncated, next_values,
                    bootstrap_value, gamma, lmbda, time_dim):
    """``call(rewards, values, next_values, bootstrap_value)`` (a backward estimator, which
    validates its inputs) with gradients to those four tensors (see _autograd)."""
    rewards = check.tensor("rewards", rewards)
    terminated = check.tensor("terminated", terminated, flag=True)
    truncated = check.optional("truncated", truncated, flag=True)
    td = normalize_time_dim(time_dim, rewards.dim())
    return _autograd.returns(call, is_gae, td, rewards, values, next_values, bootstrap_value,
                             terminated, truncated, gamma, lmbda)


def vtrace(log_rhos, rewards, values, terminated, truncated=None, *, next_values=None,
           bootstrap_value=None, gamma=0.99, lmbda=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0,
           time_dim=-1, out=None):
    r"""V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA,
    arXiv:1802.01561), with a lambda factor on the trace.

    .. math::

        \rho_t = \min(\bar\rho, e^{\log\rho_t}), \quad
        c_t = \lambda \min(\bar c, e^{\log\rho_t}) \\
        \delta_t = \rho_t (r_t + \gamma (1 - \mathrm{terminated}_t) V'_t - V_t) \\
        D_t = \delta_t + \gamma (1 - \mathrm{done}_t) c_t D_{t+1}, \quad D_T = 0,
        \qquad v_{s,t} = V_t + D_t \\
        A^{pg}_t = \min(\bar\rho_{pg}, e^{\log\rho_t})
                   (r_t + \gamma (1 - \mathrm{terminated}_t) v'_{s,t} - V_t)

    with v'_{s,t} = v_{s,t+1} if step t is not done and t < T-1, else V'_t: the
    advantage at a truncated step and at the window end bootstraps from V', never
    from the next episode's targets. Both outputs come from one pass.

    Args:
        log_rhos: log pi(a_t|s_t) - log mu(a_t|s_t) of the taken actions, rewards' shape.
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma,
            time_dim: as :func:`gae`.
        lmbda: the trace's lambda factor (1 = the paper's V-trace).
        rho_bar, c_bar, pg_rho_bar: clip thresholds (floats >= 0 or tensors).
        out: optional ``(vs, pg_advantages)`` tensors to write into: as :func:`gae`'s.

    Returns:
        ``(vs, pg_advantages)`` with rewards' shape (with ``out``: ``(out[0], out[1])``).

    Example::

        >>> import torch
        >>> from rl_triton_core import vtrace
        >>> r = torch.ones(3); v = torch.zeros(3); term = torch.tensor([False, False, True])
        >>> vs, adv = vtrace(torch.zeros(3), r, v, term, gamma=0.5)  # on-policy: MC returns
        >>> vs
        tensor([1.7500, 1.5000, 1.0000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("vtrace", dict(
            log_rhos=log_rhos, rewards=rewards, values=values, terminated=terminated,
            truncated=truncated, next_values=next_values, bootstrap_value=bootstrap_value,
            gamma=gamma, lmbda=lmbda, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar,
            time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("vtrace", out, rewards, values, next_values, bootstrap_value)
    if _autograd.wants_grad(rewards, values, next_values, bootstrap_value):
        def call(r, v, nv, b):
            return vtrace(log_rhos, r, v, terminated, truncated, next_values=nv,
                          bootstrap_value=b, gamma=gamma, lmbda=lmbda, rho_bar=rho_bar,
                          c_bar=c_bar, pg_rho_bar=pg_rho_bar, time_dim=time_dim)

        return _autograd.vtrace(call, time_dim, rewards, values, next_values, bootstrap_value,
                                log_rhos, terminated, truncated, gamma, lmbda, rho_bar, c_bar,
                                pg_rho_bar)
    return _returns_family(MODE_VTRACE, rewards, values, terminated, truncated, next_values,
                           bootstrap_value, gamma, lmbda, time_dim, True, log_rhos=log_rhos,
                           thresholds={"rho_bar": rho_bar, "c_bar": c_bar,
                                       "pg_rho_bar": pg_rho_bar}, out=out)


def retrace(log_rhos, rewards, q_values, expected_next_q, terminated, truncated=None, *,
            gamma=0.99, lmbda=1.0, c_bar=1.0, time_dim=-1, out=None):
    r"""Retrace(lambda) Q targets (Munos et al. 2016, arXiv:1606.02647).

    .. math::

        c_t = \lambda \min(\bar c, \pi(a_t|s_t) / \mu(a_t|s_t)) \\
        \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) E_t - Q_t \\
        D_t = \delta_t + \gamma (1 - \mathrm{done}_t) c_{t+1} D_{t+1}, \quad D_T = 0,
        \qquad Q^{ret}_t = Q_t + D_t

    The trace of step t uses the ratio (and lambda, c_bar) of step t+1, never of
    step t. E_t = E_{a ~ pi(.|s_{t+1})} Q(s_{t+1}, a) uses the NEXT state's target
    policy (see :func:`retrace_from_actions` to build it from per-action tensors).

    Args:
        log_rhos: log pi(a_t|s_t) - log mu(a_t|s_t), rewards' shape.
        rewards: r_t. q_values: Q(s_t, a_t). expected_next_q: E_t (at a truncated
            step: of the true final state).
        terminated, truncated, gamma, time_dim: as :func:`gae`.
        lmbda, c_bar: trace factor and ratio clip (floats or tensors, read at t+1).
        out: optional tensor to write Q^ret into (returned as is): as :func:`gae`'s
            ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import retrace
        >>> q = torch.zeros(3); e = torch.zeros(3); term = torch.tensor([False, False, True])
        >>> retrace(torch.zeros(3), torch.ones(3), q, e, term, gamma=0.5)
        tensor([1.7500, 1.5000, 1.0000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("retrace", dict(
            log_rhos=log_rhos, rewards=rewards, q_values=q_values, expected_next_q=expected_next_q,
            terminated=terminated, truncated=truncated, gamma=gamma, lmbda=lmbda, c_bar=c_bar,
            time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("retrace", out, rewards, q_values, expected_next_q)
    return _returns_family(MODE_RETRACE, rewards, q_values, terminated, truncated,
                           expected_next_q, None, gamma, lmbda, time_dim, False,
                           log_rhos=log_rhos, thresholds={"c_bar": c_bar},
                           values_name="q_values", next_name="expected_next_q", out=out)


def retrace_from_actions(q_values, target_probs, actions, behaviour_log_probs, rewards,
                         terminated, truncated=None, *, next_q_values=None,
                         next_target_probs=None, bootstrap_q_values=None,
                         bootstrap_target_probs=None, gamma=0.99, lmbda=1.0, c_bar=1.0,
                         time_dim=-1, out=None):
    r"""Retrace(lambda) from per-action tensors: the convenience form of :func:`retrace`.

    Builds, with torch ops outside the scan (so any number of actions A runs at
    memory speed):

    * Q_t = q_values[..., t, a_t] and log rho_t = log target_probs[..., t, a_t] -
      behaviour_log_probs[..., t];
    * E_t = sum_a next_target_probs[..., t, a] next_q_values[..., t, a]. Without
      ``next_*``, row t+1 of ``target_probs``/``q_values`` is the next state
      (shifted, as RLlib's chunks) and the last row uses ``bootstrap_*``
      ``[..., A]`` (0 if omitted). Pass ``next_*`` where row t+1 is not s_{t+1}
      (after a truncation with a reset).

    Args:
        q_values, target_probs: ``[..., T, A]`` Q(s_t, .) and pi(.|s_t); ``time_dim``
            indexes the per-step shape ``[..., T]`` (the action axis is last).
        actions: ``[..., T]`` integer actions in [0, A). behaviour_log_probs: log mu(a_t|s_t).
        rewards, terminated, truncated: ``[..., T]``.
        out: optional ``[..., T]`` tensor to write the targets into: as :func:`retrace`'s.

    A behaviour probability of 0 gives log rho = +inf: the ratio is clipped at
    ``c_bar`` (a finite trace). Out-of-range actions raise on CPU; on CUDA they
    trip torch.gather's device assert. Negative probabilities are not checked
    (that would synchronise the host).

    Example::

        >>> import torch
        >>> from rl_triton_core import retrace_from_actions
        >>> q = torch.zeros(3, 2); p = torch.full((3, 2), 0.5); a = torch.tensor([0, 1, 0])
        >>> logmu = torch.full((3,), 0.5).log(); term = torch.tensor([False, False, True])
        >>> retrace_from_actions(q, p, a, logmu, torch.ones(3), term, gamma=0.5)
        tensor([1.7500, 1.5000, 1.0000])
    """
    q_values = check.tensor("q_values", q_values)
    target_probs = check.tensor("target_probs", target_probs)
    actions = check.tensor("actions", actions)
    behaviour_log_probs = check.tensor("behaviour_log_probs", behaviour_log_probs)
    rewards = check.tensor("rewards", rewards)
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
    if actions.device.type == "cpu" and actions.numel() and \
            not torch.compiler.is_compiling() and bool(((actions < 0) | (actions >= A)).any()):
        raise ValueError(f"actions must lie in [0, {A}) (the action axis of q_values)")
    idx = actions.long().unsqueeze(-1)
    q_taken = q_values.gather(-1, idx).squeeze(-1)
    log_rhos = target_probs.gather(-1, idx).squeeze(-1).log() - behaviour_log_probs
    if next_q_values is None:
        notime = step_shape[:td] + step_shape[td + 1:] + (A,)
        boot = []
        for name, t in (("bootstrap_q_values", bootstrap_q_values),
                        ("bootstrap_target_probs", bootstrap_target_probs)):
            if t is None:
                t = q_values.new_zeros(notime)
            check.tensor(name, t)
            check.broadcastable(name, t, notime, "rewards' shape without time, plus (A,)")
            boot.append(t.expand(notime))
        # E over each step's own state, then shifted by one step: the [.., A] tensors are
        # read once (shifting them first copied both of them)
        e_own = (target_probs * q_values).sum(-1)
        e_boot = (boot[1] * boot[0]).sum(-1).unsqueeze(td)
        expected_next_q = torch.cat([e_own.narrow(td, 1, step_shape[td] - 1), e_boot], td)
    else:
        expected_next_q = (next_target_probs * next_q_values).sum(-1)
    return retrace(log_rhos, rewards, q_taken, expected_next_q, terminated, truncated,
                   gamma=gamma, lmbda=lmbda, c_bar=c_bar, time_dim=time_dim, out=out)


def _forward_coefficient(name, value, done_shape, shape, feat):
    """gamma/lmbda of a forward scan: a number, or a tensor broadcastable to ``done``
    (read with trailing feature axes added) or to ``x`` itself."""
    if isinstance(value, torch.Tensor) and feat and \
            check.aligned_strides(value, tuple(done_shape)) is None:
        return check.coefficient(name, value, shape)
    value, tensor = check.coefficient(name, value, done_shape)
    if tensor is not None:
        tensor = tensor.reshape(tuple(tensor.shape) + (1,) * feat)
    return value, tensor


def _forward_family(x, done, gamma, lmbda, init, time_dim, decay_names, out=None):
    slots = (x, None, None, done, None, None, init, None, gamma, lmbda, None, None, None,
             *_fastpath.out_slots(out, False))
    key = _fastpath.key_of((MODE_TRACE, time_dim), slots)
    hit = _fastpath.lookup(key, slots)
    if hit is not None:
        return hit
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
        g = _forward_coefficient("gamma", gamma, done.shape, shape, feat)
        l = _forward_coefficient("lmbda", lmbda, done.shape, shape, feat)
    else:
        g = l = (1.0, None)
    dtype = check.data_dtype([("x", x), ("init", init)])
    named = [("x", x), ("done", done), ("init", init), ("gamma", g[1]), ("lmbda", l[1])]
    device = check.same_device(named)
    if out is not None:
        out = check.outputs(out, False, shape, device, named)
    return run(MODE_TRACE, Layout(shape, td), dtype, device, x=x, term=done_b, g=g, l=l,
               init=init, reverse=False, fast=(key, slots), out=out)


def eligibility_traces(x, done, *, gamma=0.99, lmbda=0.95, init=None, time_dim=-1, out=None):
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
        out: optional tensor of x's shape to write z into (returned as is): as
            :func:`gae`'s ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import eligibility_traces
        >>> x = torch.ones(4); done = torch.tensor([False, True, False, False])
        >>> eligibility_traces(x, done, gamma=1.0, lmbda=0.5)
        tensor([1.0000, 1.5000, 1.0000, 1.5000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("eligibility_traces", dict(
            x=x, done=done, gamma=gamma, lmbda=lmbda, init=init, time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("eligibility_traces", out, x, init)
    if _autograd.wants_grad(x, init):
        def call(x_, i):
            return eligibility_traces(x_, done, gamma=gamma, lmbda=lmbda, init=i,
                                      time_dim=time_dim)

        return _autograd.forward_scan(call, time_dim, x, init, done, gamma, lmbda)
    return _forward_family(x, done, gamma, lmbda, init, time_dim, True, out)


def episodic_cumsum(x, done, *, init=None, time_dim=-1, out=None):
    r"""Running sum within episodes (episode return or length so far), forward in time.

    .. math::

        C_t = x_t + (1 - \mathrm{done}_{t-1}) C_{t-1}, \quad C_{-1} = \mathrm{init}

    Args:
        x, done, init, time_dim: as :func:`eligibility_traces`.
        out: optional tensor of x's shape to write C into (returned as is): as
            :func:`gae`'s ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import episodic_cumsum
        >>> episodic_cumsum(torch.ones(5), torch.tensor([0, 0, 1, 0, 0]))
        tensor([1., 2., 3., 1., 2.])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("episodic_cumsum", dict(x=x, done=done, init=init, time_dim=time_dim),
                         out)
    if out is not None:
        _no_grad_out("episodic_cumsum", out, x, init)
    if _autograd.wants_grad(x, init):
        def call(x_, i):
            return episodic_cumsum(x_, done, init=i, time_dim=time_dim)

        return _autograd.forward_scan(call, time_dim, x, init, done, 1.0, 1.0)
    return _forward_family(x, done, 1.0, 1.0, init, time_dim, False, out)


def linear_recurrence(alpha, beta, *, reverse=True, init=None, time_dim=-1, out=None):
    r"""The primitive: a first-order linear recurrence along ``time_dim``.

    .. math::

        \text{reverse:}\; h_t = \alpha_t + \beta_t h_{t+1}, \; h_T = \mathrm{init}
        \qquad
        \text{forward:}\; h_t = \alpha_t + \beta_t h_{t-1}, \; h_{-1} = \mathrm{init}

    ``init`` defaults to 0 and has alpha's shape without the time axis; ``beta``
    broadcasts to alpha. (alpha, beta) pairs compose associatively, which is
    what lets one kernel run every estimator in parallel over time.

    Args:
        alpha: ``[..., T, ...]``, time axis at ``time_dim``.
        beta: broadcastable to alpha.
        reverse: True for the backward-in-time recurrence, False for the forward one.
        init: optional h_T (reverse) or h_{-1} (forward), alpha's shape without time.
        time_dim: the time axis.
        out: optional tensor of alpha's shape to write h into (returned as is): as
            :func:`gae`'s ``out``, one tensor.

    Example::

        >>> import torch
        >>> from rl_triton_core import linear_recurrence
        >>> linear_recurrence(torch.ones(3), torch.full((3,), 0.5))
        tensor([1.7500, 1.5000, 1.0000])
    """
    if torch.compiler.is_compiling():  # one opaque custom op in the traced graph
        return _ops.call("linear_recurrence", dict(
            alpha=alpha, beta=beta, reverse=reverse, init=init, time_dim=time_dim), out)
    if out is not None:
        _no_grad_out("linear_recurrence", out, alpha, beta, init)
    if _autograd.wants_grad(alpha, beta, init):
        def call(a, b, i):
            return linear_recurrence(a, b, reverse=reverse, init=i, time_dim=time_dim)

        return _autograd.linear_recurrence(call, time_dim, reverse, alpha, beta, init)
    slots = (alpha, beta, None, None, None, None, init, None, None, None, None, None, None,
             *_fastpath.out_slots(out, False))
    key = _fastpath.key_of((MODE_LINREC, time_dim, reverse), slots)
    hit = _fastpath.lookup(key, slots)
    if hit is not None:
        return hit
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
    named = [("alpha", alpha), ("beta", beta), ("init", init)]
    device = check.same_device(named)
    if out is not None:
        out = check.outputs(out, False, shape, device, named)
    return run(MODE_LINREC, Layout(shape, td), dtype, device, x=alpha, v=beta, init=init,
               reverse=reverse, fast=(key, slots), out=out)

