"""The public estimators, each with its row of the table right above it.

A row (``_table.Estimator``, registered by :func:`_row`) names the estimator's tensor
arguments and the kernel slots they feed, its coefficients, outputs, checks, backward
and the scan mode (the coefficient builder each backend runs); every layer below works
from it. Each function validates its inputs through the one front door,
:func:`_front`; where the C extension is built, each is its C entry (:func:`_entry`),
which repeats a recorded call in C before any Python runs. The math lives in the
docstrings here, in ``reference.py`` (float64 loops) and in the coefficient builders of
``scan/_kernel.py`` / ``scan/_cpu.py``.

Conventions (docs/semantics.md): flags are step-aligned,
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

import functools
import inspect
import sys

import torch

from rl_triton_core import _config
from rl_triton_core._table import (
    MODE_GAE,
    MODE_GAE_BWD,
    MODE_LINREC,
    MODE_RETRACE,
    MODE_TD_BWD,
    MODE_TDLAMBDA,
    MODE_TRACE,
    MODE_VTRACE,
    MODE_VTRACE_BWD,
    TABLE,
    Estimator,
)
from rl_triton_core.scan import _autograd, _call, _claunch, _cpu_c, _dispatch, _from_actions, _ops

# every row's public function, and the convenience form built on retrace's (``rl_triton_core``
# exports this list)
__all__ = [
    "gae",
    "gae_advantages",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_cumsum",
    "linear_recurrence",
    "retrace_from_actions",
]


# A torch.func transform is running (its interpreter stack is not empty): its tensors
# (functionalized, batched, grad-tracking) have no memory of their own to read
_transformed = torch._C._functorch.peek_interpreter_stack


def _front(spec, args: tuple, time_dim, out, tried=False):
    """The one front door: ``args`` in the table row's order. Under torch.compile the
    row's custom op; with gradients the autograd Function; else the cached launch or
    the checked full path. ``tried``: the C entry (:func:`_entry`) has tried the C
    replay on this call already."""
    if torch.compiler.is_compiling() or _transformed():
        # one custom op per estimator in the traced graph; under torch.func's transforms
        # (functionalize, vmap, grad) the op too, whose tensors torch unwraps first
        return _ops.call(spec, args + _call.out_slots(out, spec.n_out), time_dim, out)
    if not tried and _replay is not None and (
            out is None or _claunch.recorded or _dispatch.out_recorded):
        # a recorded call repeated in C (CPU calls, also with out=, where one was recorded;
        # CUDA calls, also with out=, where the C launch recorded one)
        res = _replay(_dispatch._PLANS, _PREFIX[spec.name],
                      args if out is None else args + _call.out_slots(out, spec.n_out),
                      time_dim, _config._current)
        if res is not None:
            return res
    raw = args + _call.out_slots(out, spec.n_out)
    if out is not None:
        _no_grad_out(spec, out, raw)
    if _autograd.wants_grad(spec, raw):
        return _autograd.apply(spec, raw, time_dim)
    return _call.forward(spec, raw, time_dim, out)


def _no_grad_out(spec, out, raw):
    """out= with autograd is an error, as in torch: where grad mode is on and ``out`` or
    a tensor the estimator differentiates requires grad."""
    if not torch.is_grad_enabled():
        return
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    # the data inputs (not flags, log-ratios or coefficients): also for retrace, which
    # has no backward, out= must not hide an input that requires grad
    data = [raw[spec.args.index(n)] for n, slot in spec.slots if slot in _DATA_SLOTS]
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*data, *outs)):
        raise RuntimeError(
            f"{spec.name}(): functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad: call it without out= "
            "to differentiate through it (or under torch.no_grad())"
        )


_DATA_SLOTS = ("x", "v", "nv", "boot", "init")
_replay = _cpu_c.replay
_PREFIX: dict = {}  # row name -> the C replay's key prefix
_RFA_PREFIX = _dispatch.c_prefix("retrace_from_actions")


def _row(spec: Estimator) -> Estimator:
    """Register one estimator's row (declared above its public function): the table,
    its custom op, its C replay prefix."""
    TABLE[spec.name] = spec
    _ops.define(spec)
    _PREFIX[spec.name] = _dispatch.c_prefix(spec.name)
    return spec


_RETURNS_IN = ("rewards", "values", "terminated", "truncated", "next_values", "bootstrap_value")
_RETURNS_SLOTS = (("rewards", "x"), ("values", "v"), ("terminated", "term"),
                  ("truncated", "trunc"), ("next_values", "nv"), ("bootstrap_value", "boot"))
_VALUE_GRADS = ("rewards", "values", "next_values", "bootstrap_value")


_GAE = _row(Estimator("gae", "returns", MODE_GAE, _RETURNS_IN, _RETURNS_SLOTS,
                      ("gamma", "lmbda"), ("advantages", "value_targets"), _VALUE_GRADS,
                      backward="gae", bwd_mode=MODE_GAE_BWD, required=("rewards", "terminated")))


def gae(rewards, values, terminated, truncated=None, *, next_values=None, bootstrap_value=None,
        gamma=0.99, lmbda=0.95, time_dim, out=None):
    r"""Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    $$
    \begin{gathered}
        \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V'_t - V_t \\
        A_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) A_{t+1}, \quad A_T = 0 \\
        G_t = A_t + V_t
    \end{gathered}
    $$

    Args:
        rewards: ``[..., T, ...]`` rewards $r_t$, time axis at ``time_dim``.
        values: same shape, $V(s_t)$.
        terminated: flags (bool, integer or float; nonzero is set), broadcastable to
            rewards: $s_{t+1}$ is terminal.
        truncated: optional flags: the episode was cut after step t (bootstraps from $V'_t$).
        next_values: optional, same shape: $V(s_{t+1})$ of the true successor.
        bootstrap_value: optional, the shape without the time axis: $V'_{T-1}$ when
            ``next_values`` is omitted (then $V'_t = V_{t+1}$ for $t < T-1$).
        gamma, lmbda: floats in [0, 1] or tensors broadcastable to rewards (per step).
        time_dim: the time axis, a required keyword (no default): ``-1`` for batch-major
            ``[B, T]`` data, ``0`` for time-major ``[T, B]``; omitting it is a TypeError.
        out: optional ``(advantages, value_targets)`` tensors to write into (saves the
            allocation in a hot loop): rewards' shape and device, any floating dtype
            (e.g. float32 outputs for bf16 data: the scan accumulates in float32 and
            casts on store), any strides (a layout the scan cannot address directly goes
            through a temporary and a copy), memory shared with no input and not with
            each other (ValueError). Not with autograd (RuntimeError, as torch).

    Returns:
        tuple[Tensor, Tensor]: ``(advantages, value_targets)``, new tensors with rewards'
        shape, in the data's dtype; with ``out``, the tuple ``(out[0], out[1])`` (the same
        tensor objects).

    Examples:
        >>> import torch
        >>> from rl_triton_core import gae
        >>> r = torch.tensor([1.0, 1.0, 1.0]); v = torch.tensor([0.5, 0.5, 0.5])
        >>> term = torch.tensor([False, False, True])
        >>> adv, target = gae(r, v, term, gamma=0.5, lmbda=1.0, time_dim=-1)
        >>> target  # Monte-Carlo returns 1 + 0.5 * (1 + 0.5 * 1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    return _front(_GAE, (rewards, values, terminated, truncated, next_values, bootstrap_value,
                         gamma, lmbda), time_dim, out)


_GAE_ADV = _row(Estimator("gae_advantages", "returns", MODE_GAE, _RETURNS_IN, _RETURNS_SLOTS,
                          ("gamma", "lmbda"), ("advantages",), _VALUE_GRADS, backward="gae",
                          bwd_mode=MODE_GAE_BWD, required=("rewards", "terminated")))


def gae_advantages(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim, out=None):
    r"""GAE's advantages only: [`gae`][]'s first output, without the value targets.

    $$
        A_t = \delta_t + \gamma \lambda (1 - \mathrm{done}_t) A_{t+1}, \quad
        \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) V'_t - V_t
    $$

    The same scan as [`gae`][], bit for bit its advantages, but the kernel writes one
    output instead of two: where the targets are not needed (or are formed later as
    ``advantages + values``), the call moves one array less. It is the form of
    ``compute_gae`` in other libraries, which return the advantages alone.

    Args:
        rewards, values, terminated, truncated: as [`gae`][].
        next_values, bootstrap_value, gamma, lmbda, time_dim: as [`gae`][].
        out: optional tensor to write the advantages into (returned as is): as
            [`gae`][]'s ``out``, one tensor.

    Returns:
        Tensor: the advantages, with rewards' shape, in the data's dtype.

    Examples:
        >>> import torch
        >>> from rl_triton_core import gae_advantages
        >>> r = torch.tensor([1.0, 1.0, 1.0]); v = torch.tensor([0.5, 0.5, 0.5])
        >>> term = torch.tensor([False, False, True])
        >>> gae_advantages(r, v, term, gamma=0.5, lmbda=1.0, time_dim=-1)
        tensor([1.2500, 1.0000, 0.5000])
    """
    return _front(_GAE_ADV, (rewards, values, terminated, truncated, next_values,
                             bootstrap_value, gamma, lmbda), time_dim, out)


_TDL = _row(Estimator("lambda_returns", "returns", MODE_TDLAMBDA, _RETURNS_IN, _RETURNS_SLOTS,
                      ("gamma", "lmbda"), ("returns",), _VALUE_GRADS, backward="td",
                      bwd_mode=MODE_TD_BWD,
                      required=("rewards", "terminated")))


def lambda_returns(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim, out=None):
    r"""TD(lambda) returns (Sutton & Barto 2018, ch. 12; Peng & Williams 1996).

    $$
        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [(1 - \lambda c_t) V'_t + \lambda c_t G_{t+1}], \quad
        c_t = 1 - \mathrm{done}_t, \; c_{T-1} = 0
    $$

    The window end bootstraps fully from $V'_{T-1}$. Where $V'_t = V_{t+1}$ at every
    step that is not done, ``G - values`` equals [`gae`][]'s advantages.
    Arguments and shapes as [`gae`][]; returns G with rewards' shape. The
    formula never reads $V_t$ itself: with ``next_values`` given, ``values`` may be
    None.

    Args:
        rewards, values, terminated, truncated: as [`gae`][].
        next_values, bootstrap_value, gamma, lmbda, time_dim: as [`gae`][].
        out: optional tensor to write G into (returned as is): as [`gae`][]'s
            ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import lambda_returns
        >>> r = torch.ones(3); v = torch.zeros(3); term = torch.zeros(3, dtype=torch.bool)
        >>> lambda_returns(r, v, term, bootstrap_value=torch.tensor(2.0), gamma=0.5, lmbda=1.0,
        ...                time_dim=-1)
        tensor([2., 2., 2.])
    """
    return _front(_TDL, (rewards, values, terminated, truncated, next_values, bootstrap_value,
                         gamma, lmbda), time_dim, out)


_DISC = _row(Estimator("discounted_returns", "returns", MODE_TDLAMBDA,
                       ("rewards", "terminated", "truncated", "next_values", "bootstrap_value"),
                       tuple(p for p in _RETURNS_SLOTS if p[0] != "values"), ("gamma",),
                       ("returns",), ("rewards", "next_values", "bootstrap_value"),
                       backward="td", bwd_mode=MODE_TD_BWD, required=("rewards", "terminated")))


def discounted_returns(rewards, terminated, truncated=None, *, next_values=None,
                       bootstrap_value=None, gamma=0.99, time_dim, out=None):
    r"""Discounted (Monte-Carlo) returns: [`lambda_returns`][] with lambda = 1.

    $$
        G_t = r_t + \gamma (1 - \mathrm{terminated}_t)
              [\mathrm{truncated}_t V'_t + (1 - \mathrm{done}_t) G_{t+1}]
    $$

    and at $t = T-1$ the carry is $V'_{T-1}$. Without ``next_values`` there are no
    values to bootstrap from inside the window: $V'_t = 0$ for $t < T-1$ (a
    truncation there contributes nothing) and $V'_{T-1}$ = ``bootstrap_value``.

    Args:
        rewards, terminated, truncated, next_values, bootstrap_value, gamma, time_dim:
            as [`gae`][].
        out: optional tensor to write G into (returned as is): as [`gae`][]'s
            ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import discounted_returns
        >>> r = torch.ones(4); term = torch.tensor([0, 1, 0, 0], dtype=torch.bool)
        >>> discounted_returns(r, term, gamma=0.5, time_dim=-1)
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    return _front(_DISC, (rewards, terminated, truncated, next_values, bootstrap_value, gamma),
                  time_dim, out)


_VTRACE = _row(Estimator("vtrace", "returns", MODE_VTRACE, ("log_rhos",) + _RETURNS_IN,
                         (("log_rhos", "rho"),) + _RETURNS_SLOTS,
                         ("gamma", "lmbda", "rho_bar", "c_bar", "pg_rho_bar"),
                         ("vs", "pg_advantages"),
                         _VALUE_GRADS, backward="vtrace", bwd_mode=MODE_VTRACE_BWD,
                         required=("log_rhos", "rewards", "values", "terminated")))


def vtrace(log_rhos, rewards, values, terminated, truncated=None, *, next_values=None,
           bootstrap_value=None, gamma=0.99, lmbda=1.0, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0,
           time_dim, out=None):
    r"""V-trace targets and policy-gradient advantages (Espeholt et al. 2018, IMPALA,
    arXiv:1802.01561), with a lambda factor on the trace.

    $$
    \begin{gathered}
        \rho_t = \min(\bar\rho, e^{\log\rho_t}), \quad
        c_t = \lambda \min(\bar c, e^{\log\rho_t}) \\
        \delta_t = \rho_t (r_t + \gamma (1 - \mathrm{terminated}_t) V'_t - V_t) \\
        D_t = \delta_t + \gamma (1 - \mathrm{done}_t) c_t D_{t+1}, \quad D_T = 0,
        \qquad v_{s,t} = V_t + D_t \\
        A^{pg}_t = \min(\bar\rho_{pg}, e^{\log\rho_t})
                   (r_t + \gamma (1 - \mathrm{terminated}_t) v'_{s,t} - V_t)
    \end{gathered}
    $$

    with $v'_{s,t} = v_{s,t+1}$ if step t is not done and $t < T-1$, else $V'_t$: the
    advantage at a truncated step and at the window end bootstraps from $V'$, never
    from the next episode's targets. Both outputs come from one pass.

    Args:
        log_rhos: $\log \pi(a_t|s_t) - \log \mu(a_t|s_t)$ of the taken actions, rewards' shape.
        rewards, values, terminated, truncated: as [`gae`][].
        next_values, bootstrap_value, gamma, time_dim: as [`gae`][].
        lmbda: the trace's lambda factor (1 = the paper's V-trace).
        rho_bar, c_bar, pg_rho_bar: clip thresholds (floats >= 0 or tensors).
        out: optional ``(vs, pg_advantages)`` tensors to write into: as [`gae`][]'s.

    Returns:
        tuple[Tensor, Tensor]: ``(vs, pg_advantages)`` with rewards' shape (with ``out``:
        ``(out[0], out[1])``).

    Examples:
        >>> import torch
        >>> from rl_triton_core import vtrace
        >>> r = torch.ones(3); v = torch.zeros(3); term = torch.tensor([False, False, True])
        >>> vs, adv = vtrace(torch.zeros(3), r, v, term, gamma=0.5, time_dim=-1)  # on-policy
        >>> vs  # the Monte-Carlo returns
        tensor([1.7500, 1.5000, 1.0000])
    """
    return _front(_VTRACE, (log_rhos, rewards, values, terminated, truncated, next_values,
                            bootstrap_value, gamma, lmbda, rho_bar, c_bar, pg_rho_bar),
                  time_dim, out)


_RETRACE = _row(Estimator("retrace", "returns", MODE_RETRACE,
                          ("log_rhos", "rewards", "q_values", "expected_next_q", "terminated",
                           "truncated"),
                          (("log_rhos", "rho"), ("rewards", "x"), ("q_values", "v"),
                           ("expected_next_q", "nv"), ("terminated", "term"),
                           ("truncated", "trunc")),
                          ("gamma", "lmbda", "c_bar"), ("q_targets",),
                          required=("log_rhos", "rewards", "q_values", "expected_next_q",
                                    "terminated")))


def retrace(log_rhos, rewards, q_values, expected_next_q, terminated, truncated=None, *,
            gamma=0.99, lmbda=1.0, c_bar=1.0, time_dim, out=None):
    r"""Retrace(lambda) Q targets (Munos et al. 2016, arXiv:1606.02647).

    $$
    \begin{gathered}
        c_t = \lambda \min(\bar c, \pi(a_t|s_t) / \mu(a_t|s_t)) \\
        \delta_t = r_t + \gamma (1 - \mathrm{terminated}_t) E_t - Q_t \\
        D_t = \delta_t + \gamma (1 - \mathrm{done}_t) c_{t+1} D_{t+1}, \quad D_T = 0,
        \qquad Q^{ret}_t = Q_t + D_t
    \end{gathered}
    $$

    The trace of step t uses the ratio (and lambda, c_bar) of step t+1, never of
    step t. $E_t = \mathbb{E}_{a \sim \pi(\cdot|s_{t+1})} Q(s_{t+1}, a)$ uses the NEXT
    state's target policy (see [`retrace_from_actions`][] to build it from per-action tensors).

    Args:
        log_rhos: $\log \pi(a_t|s_t) - \log \mu(a_t|s_t)$, rewards' shape.
        rewards: r_t. q_values: Q(s_t, a_t). expected_next_q: E_t (at a truncated
            step: of the true final state).
        terminated, truncated, gamma, time_dim: as [`gae`][].
        lmbda, c_bar: trace factor and ratio clip (floats or tensors, read at t+1).
        out: optional tensor to write Q^ret into (returned as is): as [`gae`][]'s
            ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import retrace
        >>> q = torch.zeros(3); e = torch.zeros(3); term = torch.tensor([False, False, True])
        >>> retrace(torch.zeros(3), torch.ones(3), q, e, term, gamma=0.5, time_dim=-1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    return _front(_RETRACE, (log_rhos, rewards, q_values, expected_next_q, terminated,
                             truncated, gamma, lmbda, c_bar), time_dim, out)


def retrace_from_actions(q_values, target_probs, actions, behaviour_log_probs, rewards,
                         terminated, truncated=None, *, next_q_values=None,
                         next_target_probs=None, bootstrap_q_values=None,
                         bootstrap_target_probs=None, gamma=0.99, lmbda=1.0, c_bar=1.0,
                         time_dim, out=None):
    r"""Retrace(lambda) from per-action tensors: the convenience form of [`retrace`][].

    Builds, before the scan (on CUDA one Triton pass over the per-action tensors, so
    any number of actions A runs at memory speed; torch ops on the CPU path):

    * Q_t = q_values[..., t, a_t] and log rho_t = log target_probs[..., t, a_t] -
      behaviour_log_probs[..., t];
    * E_t = sum_a next_target_probs[..., t, a] next_q_values[..., t, a]. Without
      ``next_*``, row t+1 of ``target_probs``/``q_values`` is the next state
      (shifted, as RLlib's chunks) and the last row uses ``bootstrap_*``
      ``[..., A]`` (0 if omitted). Pass ``next_*`` where row t+1 is not s_{t+1}
      (after a truncation with a reset).

    With float16 / bfloat16 inputs these pieces and the scan are computed in float32
    (a half-precision product or log rounds at 2^-8 or 2^-11, which the recurrence can
    amplify); the targets come back in the data's dtype.

    Args:
        q_values, target_probs: ``[..., T, A]`` Q(s_t, .) and pi(.|s_t); ``time_dim``
            indexes the per-step shape ``[..., T]`` (the action axis is last).
        actions: ``[..., T]`` integer actions in [0, A). behaviour_log_probs: log mu(a_t|s_t).
        rewards, terminated, truncated: ``[..., T]``.
        out: optional ``[..., T]`` tensor to write the targets into: as [`retrace`][]'s.

    A behaviour probability of 0 gives log rho = +inf: the ratio is clipped at
    ``c_bar`` (a finite trace). Out-of-range actions raise on CPU; on CUDA they give
    NaN for that step's Q_t and log rho (no host check: that would synchronise). With
    float64 data, inputs that require grad, or under torch.compile, the pieces are torch
    ops on CUDA too (there torch.gather's device assert trips). Negative probabilities
    are not checked.

    Examples:
        >>> import torch
        >>> from rl_triton_core import retrace_from_actions
        >>> q = torch.zeros(3, 2); p = torch.full((3, 2), 0.5); a = torch.tensor([0, 1, 0])
        >>> logmu = torch.full((3,), 0.5).log(); term = torch.tensor([False, False, True])
        >>> retrace_from_actions(q, p, a, logmu, torch.ones(3), term, gamma=0.5, time_dim=-1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    raw = (q_values, target_probs, actions, behaviour_log_probs, next_q_values,
           next_target_probs, bootstrap_q_values, bootstrap_target_probs, rewards,
           terminated, truncated, gamma, lmbda, c_bar, out)
    if out is None and _claunch.recorded and not torch.compiler.is_compiling():
        # a recorded CUDA call (the fused pass), repeated in C
        res = _replay(_dispatch._PLANS, _RFA_PREFIX, raw[:14], time_dim, _config._current)
        if res is not None:
            return res
    got = _from_actions.pieces_of(raw, time_dim)
    if type(got) is torch.Tensor:  # the fused pass: the targets
        return got
    pieces, wide = got
    log_rhos, q_taken, expected_next_q = pieces
    if rewards.dtype not in (torch.float16, torch.bfloat16):
        return retrace(log_rhos, rewards, q_taken, expected_next_q, terminated, truncated,
                       gamma=gamma, lmbda=lmbda, c_bar=c_bar, time_dim=time_dim, out=out)
    # half-precision data: the scan runs on the float32 pieces, the result in the data's dtype
    res = retrace(log_rhos, rewards.to(wide), q_taken.to(wide), expected_next_q,
                  terminated, truncated, gamma=gamma, lmbda=lmbda, c_bar=c_bar,
                  time_dim=time_dim, out=out)
    return res if out is not None else res.to(rewards.dtype)


_TRACES = _row(Estimator("eligibility_traces", "forward", MODE_TRACE, ("x", "done", "init"),
                         (("x", "x"), ("done", "term"), ("init", "init")), ("gamma", "lmbda"),
                         ("traces",), ("x", "init"), reverse=False, backward="trace",
                         bwd_mode=MODE_TRACE,
                         required=("x", "done")))


def eligibility_traces(x, done, *, gamma=0.99, lmbda=0.95, init=None, time_dim, out=None):
    r"""Accumulating eligibility traces (Sutton & Barto 2018, sec. 12.2), forward in time.

    $$
        z_t = x_t + \gamma_{t-1} \lambda_{t-1} (1 - \mathrm{done}_{t-1}) z_{t-1},
        \quad z_{-1} = \mathrm{init}, \; \mathrm{done}_{-1} = 0
    $$

    The decay of z_{t-1} is that of the transition out of step t-1 (a per-step
    gamma/lmbda tensor is read at t-1; at t = 0 it is read at 0).

    Args:
        x: ``[..., T, *F]``: per-step increments (e.g. gradients), trailing feature axes F.
        done: x's shape without the trailing feature axes (or broadcastable to it, with
            as many axes): the episode ended after step t.
        gamma, lmbda: floats in [0, 1] or tensors broadcastable to that shape (x's
            without the feature axes, whatever done's own shape) or to x's (per feature).
        init: optional z_{-1}, x's shape without the time axis.
        time_dim: the time axis, indexing ``x`` (required, as in [`gae`][]).
        out: optional tensor of x's shape to write z into (returned as is): as
            [`gae`][]'s ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import eligibility_traces
        >>> x = torch.ones(4); done = torch.tensor([False, True, False, False])
        >>> eligibility_traces(x, done, gamma=1.0, lmbda=0.5, time_dim=-1)
        tensor([1.0000, 1.5000, 1.0000, 1.5000])
    """
    return _front(_TRACES, (x, done, init, gamma, lmbda), time_dim, out)


_CUMSUM = _row(Estimator("episodic_cumsum", "forward", MODE_TRACE, ("x", "done", "init"),
                         (("x", "x"), ("done", "term"), ("init", "init")), (), ("sums",),
                         ("x", "init"), reverse=False, backward="trace", bwd_mode=MODE_TRACE,
                         required=("x", "done")))


def episodic_cumsum(x, done, *, init=None, time_dim, out=None):
    r"""Running sum within episodes (episode return or length so far), forward in time.

    $$
        C_t = x_t + (1 - \mathrm{done}_{t-1}) C_{t-1}, \quad C_{-1} = \mathrm{init}
    $$

    Args:
        x, done, init, time_dim: as [`eligibility_traces`][].
        out: optional tensor of x's shape to write C into (returned as is): as
            [`gae`][]'s ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import episodic_cumsum
        >>> episodic_cumsum(torch.ones(5), torch.tensor([0, 0, 1, 0, 0]), time_dim=-1)
        tensor([1., 2., 3., 1., 2.])
    """
    return _front(_CUMSUM, (x, done, init), time_dim, out)


_LINREC = _row(Estimator("linear_recurrence", "linrec", MODE_LINREC, ("alpha", "beta", "init"),
                         (("alpha", "x"), ("beta", "v"), ("init", "init")), (), ("h",),
                         ("alpha", "beta", "init"), reverse=None, backward="linrec",
                         required=("alpha", "beta")))


def linear_recurrence(alpha, beta, *, reverse=True, init=None, time_dim, out=None):
    r"""The primitive: a first-order linear recurrence along ``time_dim``.

    $$
        \text{reverse:}\; h_t = \alpha_t + \beta_t h_{t+1}, \; h_T = \mathrm{init}
        \qquad
        \text{forward:}\; h_t = \alpha_t + \beta_t h_{t-1}, \; h_{-1} = \mathrm{init}
    $$

    ``init`` defaults to 0 and has alpha's shape without the time axis; ``beta``
    broadcasts to alpha. (alpha, beta) pairs compose associatively, which is
    what lets one kernel run every estimator in parallel over time.

    Args:
        alpha: ``[..., T, ...]``, time axis at ``time_dim``.
        beta: broadcastable to alpha.
        reverse: True for the backward-in-time recurrence, False for the forward one.
        init: optional h_T (reverse) or h_{-1} (forward), alpha's shape without time.
        time_dim: the time axis (required, as in [`gae`][]).
        out: optional tensor of alpha's shape to write h into (returned as is): as
            [`gae`][]'s ``out``, one tensor.

    Examples:
        >>> import torch
        >>> from rl_triton_core import linear_recurrence
        >>> linear_recurrence(torch.ones(3), torch.full((3,), 0.5), time_dim=-1)
        tensor([1.7500, 1.5000, 1.0000])
    """
    return _front(_LINREC, (alpha, beta, init, reverse), time_dim, out)


def _entry(fn, spec: Estimator):
    """``fn`` (a public function above, whose body is ``return _front(spec, args,
    time_dim, out)``) as its C entry (``_cscan.entry``): a call without ``out`` goes from
    the caller's arguments straight to the C replay, where a recorded call is repeated,
    and on to :func:`_front` with the arguments in the row's order where it is not;
    every other call is ``fn``'s own. After other work, ``fn``'s Python frame with its
    keywords took 8-11 us of a 70 us CPU call (docs/notes.md). To ``inspect``,
    ``functools`` and pickle it is ``fn``: its ``__wrapped__``, name, docstring and
    signature. Dynamo traces ``fn`` itself (the wrapper's ``__original_fn``, as it does
    torch.jit's script-if-tracing wrappers), so a compiled graph holds the row's custom
    op as before. ``fn`` unchanged where the extension is not built."""
    if _cpu_c.entry is None:
        return fn
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.name not in ("time_dim", "out")]
    names = tuple(sys.intern(p.name) for p in params)
    if sorted(names) != sorted(spec.args):
        raise TypeError(f"{fn.__name__}: its parameters are not its row's")
    # the entry type stands for "no default" (a required argument: fn's call says so)
    defaults = tuple(_cpu_c.Entry if p.default is p.empty else p.default for p in params)
    npos = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)
    order = tuple(spec.args.index(n) for n in names)
    e = _cpu_c.entry(fn, spec, _PREFIX[spec.name], names, defaults, order, npos, _front,
                     globals(), vars(_dispatch), vars(_config))
    functools.update_wrapper(e, fn)
    setattr(e, "__script_if_tracing_wrapper", True)  # noqa: B010 (dynamo: trace fn)
    setattr(e, "__original_fn", fn)  # noqa: B010
    return e


for _name in __all__:  # every row's function (retrace_from_actions has no row)
    if _name in TABLE:
        globals()[_name] = _entry(globals()[_name], TABLE[_name])
del _name
