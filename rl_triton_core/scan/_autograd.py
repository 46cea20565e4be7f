r"""Backward passes: every gradient is the adjoint of a linear recurrence, run with the
library's own scan (a fused adjoint mode of the kernel on the Triton path; the
primitive's launch plus elementwise torch ops otherwise). Nothing goes through the
Python reference loop or the public API.

Layers: the ``autograd.Function`` classes here run the forward through ``_call`` (the
cached launch or the full path) and their backward through the launchers; the public
estimators call :func:`apply`, and the custom ops of ``_ops`` reuse the same backward
functions (``*_backward``) for ``torch.compile``.

The adjoint
-----------
For the reverse recurrence  h_t = alpha_t + beta_t h_{t+1}  (h_T = init) with upstream
gradient g_t = dL/dh_t (direct), the total gradient u_t = dL/dh_t obeys the same
recurrence run the other way with the betas shifted by one step:

    u_t = g_t + beta_{t-1} u_{t-1},   u_{-1} = 0                   (one forward scan)

    dL/dalpha_t = u_t,   dL/dbeta_t = u_t h_{t+1} (h_T = init),   dL/dinit = u_{T-1} beta_{T-1}

For the forward recurrence  h_t = alpha_t + beta_t h_{t-1}  (h_{-1} = init):

    u_t = g_t + beta_{t+1} u_{t+1},   u_T = 0                      (one reverse scan)

    dL/dalpha_t = u_t,   dL/dbeta_t = u_t h_{t-1} (h_{-1} = init),  dL/dinit = u_0 beta_0

A beta or init that was broadcast gets its gradient summed back to its own shape.

Estimators (flags, gamma, lambda, log_rhos and clip thresholds are constants: no gradient
flows to them, also when they are tensors that require grad; V'_t as in semantics.md)
-----------------------------------------------------------------------------------------
* ``linear_recurrence``: w.r.t. alpha, beta and init (formulas above).
* ``gae``: A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}, so u = adjoint with
  beta_t = gamma lambda (1 - done_t) and g_t = g^A_t + g^G_t; dL/dr_t = u_t,
  dL/dV'_t = gamma (1 - term_t) u_t, dL/dV_t = g^G_t - u_t (+ the shifted V' term).
* ``lambda_returns`` / ``discounted_returns``: beta_t = gamma (1 - term_t) lambda c_t
  (c_t = 1 - done_t, c_{T-1} = 0); dL/dr_t = u_t, dL/dV'_t = gamma (1 - term_t)
  (1 - lambda c_t) u_t.
* ``eligibility_traces`` / ``episodic_cumsum`` (forward scans): beta_t = gamma_{t-1}
  lambda_{t-1} (1 - done_{t-1}) (t >= 1), beta_0 = gamma_0 lambda_0 (1 for the cumsum),
  so the adjoint is the reverse scan u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1};
  dL/dx_t = u_t, dL/dinit = u_0 gamma_0 lambda_0.
* ``vtrace``: with rho_t = min(rho_bar, e^{lr_t}), c_t = lambda min(c_bar, e^{lr_t}),
  pgrho_t = min(pg_rho_bar, e^{lr_t}), gnt_t = gamma (1 - term_t),
  cont_t = [not done_t and t < T-1]:

      D_t  = rho_t (r_t + gnt_t V'_t - V_t) + gamma (1 - done_t) c_t D_{t+1},   vs_t = V_t + D_t
      pg_t = pgrho_t (r_t + gnt_t (cont_t vs_{t+1} + (1 - cont_t) V'_t) - V_t)

  pg_t reads vs_{t+1}, so its gradient feeds the adjoint of D: with
  w_t = pgrho_t gnt_t cont_t g^pg_t and gvs_t = g^vs_t + w_{t-1} (the total direct
  gradient of vs_t, w_{-1} = 0),

      u_t = gvs_t + gamma (1 - done_{t-1}) c_{t-1} u_{t-1}               (one forward scan)
      dL/dr_t  = rho_t u_t + pgrho_t g^pg_t
      dL/dV_t  = gvs_t - rho_t u_t - pgrho_t g^pg_t
      dL/dV'_t = gnt_t (rho_t u_t + pgrho_t (1 - cont_t) g^pg_t)

With shifted values (no ``next_values``), V'_t = V_{t+1} for t < T-1 adds dL/dV'_{t-1} to
dL/dV_t, and dL/dbootstrap_value = dL/dV'_{T-1} (summed over the axes it was broadcast on).

Precision: the backward of fp16/bf16 data runs in float32 (the scan accumulates in
float32 anyway) and returns gradients in the input's dtype. Each backward is itself built
from differentiable ops and the scan, so double backward works where the upstream
gradient is the variable (the coefficients are constants).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_triton_core import _validate as check
from rl_triton_core._layout import Layout, aligned_strides, normalize_time_dim
from rl_triton_core._table import (
    MODE_GAE_BWD,
    MODE_TD_BWD,
    MODE_TRACE,
    MODE_VTRACE_BWD,
    TABLE,
    Estimator,
)
from rl_triton_core.scan import _call, _dispatch

_HALF = (torch.float16, torch.bfloat16)


def wants_grad(spec: Estimator, raw: tuple) -> bool:
    """Whether a call needs the autograd path: grad mode on and a differentiable input
    that requires grad."""
    if not torch.is_grad_enabled():
        return False
    for pos in spec.grad_pos:
        t = raw[pos]
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _cdtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the backward computes in: float32 for half types, else the data's."""
    return torch.float32 if dtype in _HALF else dtype


def _coef(c, dtype, device):
    """A gamma / lambda / threshold: a number stays one, a tensor goes to the backward's
    dtype and device (a constant: detached)."""
    if isinstance(c, torch.Tensor):
        return c.detach().to(device=device, dtype=dtype)
    return float(c)


def _constant(coefficient):
    """A validated (number, tensor) coefficient as the backward kernels take it: the
    tensor detached (flags, gamma, lambda and the clip thresholds are constants)."""
    value, tensor = coefficient
    return value, None if tensor is None else tensor.detach()


def _min(a: torch.Tensor, b) -> torch.Tensor:
    return torch.minimum(a, b) if isinstance(b, torch.Tensor) else a.clamp(max=b)


def _prev(x: torch.Tensor, td: int) -> torch.Tensor:
    """x_{t-1} along time (0 at t = 0)."""
    T = x.shape[td]
    return torch.cat([torch.zeros_like(x.narrow(td, 0, 1)), x.narrow(td, 0, T - 1)], td)


def _next(x: torch.Tensor, td: int) -> torch.Tensor:
    """x_{t+1} along time (0 at t = T-1)."""
    T = x.shape[td]
    return torch.cat([x.narrow(td, 1, T - 1), torch.zeros_like(x.narrow(td, 0, 1))], td)


def _last(shape, td, dtype, device) -> torch.Tensor:
    """1 at t = T-1, else 0."""
    last = torch.zeros(shape, dtype=dtype, device=device)
    last.narrow(td, shape[td] - 1, 1).fill_(1.0)
    return last


def _flags(terminated, truncated, dtype, shape=None):
    """(terminated, done) as 0/1 in ``dtype``: nonzero means set (as flag.bool())."""
    term = (terminated != 0).to(dtype)
    done = term if truncated is None else torch.maximum(term, (truncated != 0).to(dtype))
    if shape is not None:
        term, done = torch.broadcast_to(term, shape), torch.broadcast_to(done, shape)
    return term, done


def _cut(flag, x):
    """0 where ``flag`` (a float 0/1 tensor) is set, else ``x``: a select, never
    ``(1 - flag) * x``, so a NaN or inf in ``x`` behind a set flag (another episode's)
    stays there."""
    if not isinstance(x, torch.Tensor):
        x = torch.full((), x, dtype=flag.dtype, device=flag.device)
    return torch.where(flag != 0, 0.0, x)


def _grad(g, shape, dtype, device) -> torch.Tensor:
    """An upstream gradient in the backward's dtype, contiguous (zeros where None)."""
    if g is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return g.to(dtype).contiguous()


def _cast(g, dtype):
    return None if g is None else g.to(dtype)


def _scan(alpha, beta, *, reverse, td):
    """The primitive's scan (cached launch or full path), for the torch-op backwards;
    differentiable itself where grad mode is on (double backward)."""
    raw = (alpha, beta.contiguous(), None, reverse, None, None)
    linrec = TABLE["linear_recurrence"]
    if wants_grad(linrec, raw):
        return apply(linrec, raw, td)
    return _call.forward(linrec, raw, td)


def _fused(device) -> bool:
    """The Triton backend runs the adjoints (and the values' gradient) in one kernel pass."""
    return _dispatch.backend_for(device) == "triton"


def _boot_grad(gamma, terminated, g, shape, td, dtype, device):
    """gamma_{T-1} (1 - terminated_{T-1}) g_{T-1}: the gradient reaching V'_{T-1} =
    bootstrap_value when g is the gradient of the last step's TD error. Only the
    last step is read: O(N), not a pass over [N, T]."""
    last = shape[td] - 1
    gamma = _coef(gamma, dtype, device)
    if isinstance(gamma, torch.Tensor):
        gamma = torch.broadcast_to(gamma, shape).select(td, last)
    term = torch.broadcast_to(terminated, shape).select(td, last)
    g_last = gamma * g.select(td, last)
    if term.dtype != torch.bool:  # nonzero means set
        term = term != 0
    return torch.where(term, 0.0, g_last)


@dataclass(frozen=True)
class Saved:
    """What a backward needs besides the saved tensors: the time axis, the shapes, the
    output dtype, which optional inputs were given, the constant coefficients."""

    td: int
    shape: tuple
    dtype: torch.dtype
    has: tuple  # (values, next_values, bootstrap_value) / (init,) / (init,)
    coefs: tuple  # raw gamma, lmbda (, rho_bar, c_bar, pg_rho_bar)
    side_shape: tuple | None  # bootstrap_value's / init's shape


# ----------------------------------------------------------- gae / TD(lambda) / returns


def returns_backward(gae: bool, s: Saved, terminated, truncated, grads):
    """(dL/drewards, dL/dvalues, dL/dnext_values, dL/dbootstrap_value) of GAE
    (``gae``) or TD(lambda) returns; None for an input that was not given."""
    td, shape = s.td, s.shape
    dtype = _cdtype(s.dtype)
    device = terminated.device
    has_v, has_nv, has_boot = s.has
    if shape[td] == 0:  # empty time axis: zero gradients
        z = torch.zeros(shape, dtype=s.dtype, device=device)
        boot = torch.zeros(s.side_shape, dtype=s.dtype, device=device) if has_boot else None
        return z, z if has_v else None, z if has_nv else None, boot
    if _fused(device):
        return _returns_backward_fused(gae, s, terminated, truncated, grads, dtype)
    gamma, lmbda = (_coef(c, dtype, device) for c in s.coefs)
    term, done = _flags(terminated, truncated, dtype)
    if gae:
        g_adv, g_target = (_grad(g, shape, dtype, device) for g in grads)
        g_h = g_adv + g_target
        beta = _cut(done, gamma * lmbda)
        a_v_next = gamma
    else:
        g_target = None
        g_h = _grad(grads[0], shape, dtype, device)
        lc = _cut(torch.maximum(done, _last(shape, td, dtype, device)), lmbda)  # lambda c_t
        beta = _cut(term, gamma * lc)
        a_v_next = gamma * (1.0 - lc)
    # (a zero beta drops the carry in the scan; the V' term is cut by terminated)
    u = _scan(g_h, _prev(torch.broadcast_to(beta, shape), td), reverse=False, td=td)
    g_vnext = torch.broadcast_to(_cut(term, a_v_next * u), shape)
    g_values = g_next = g_boot = None
    if has_v:
        g_values = -u + g_target if gae else torch.zeros_like(u)
    if has_nv:
        g_next = g_vnext
    else:
        if has_v:  # V'_{t-1} = V_t for t >= 1
            g_values = g_values + _prev(g_vnext, td)
        if has_boot:  # V'_{T-1} = bootstrap_value (summed over axes it was broadcast on)
            g_boot = g_vnext.select(td, shape[td] - 1).sum_to_size(s.side_shape)
    d = s.dtype
    return u.to(d), _cast(g_values, d), _cast(g_next, d), _cast(g_boot, d)


def _returns_backward_fused(gae, s, terminated, truncated, grads, dtype):
    """returns_backward through the kernel's adjoint modes: one pass reads the upstream
    gradients and the flags and writes dL/drewards (= u) and, for shifted values,
    dL/dvalues; the other gradients are O(N) (bootstrap) or one elementwise pass
    (explicit next values)."""
    td, shape = s.td, s.shape
    device = terminated.device
    has_v, has_nv, has_boot = s.has
    # autograd materialises the gradient of an unused output as zeros (never None here)
    g0 = grads[0] if grads[0] is not None else torch.zeros(shape, dtype=dtype, device=device)
    g_target = grads[1] if gae else None
    shifted_values = has_v and not has_nv
    mode = MODE_GAE_BWD if gae else MODE_TD_BWD
    gamma, lmbda = s.coefs
    # the cached launch, as the forward's: a training loop repeats the same shapes
    raw = (g0, g_target, terminated, truncated, gamma, lmbda, None, None)  # _BWD_SLOTS
    key, out = _dispatch.cached((mode, td, shifted_values, dtype), raw)
    if out is None:
        coefs = {"g": _constant(check.coefficient("gamma", gamma, shape)),
                 "lm": _constant(check.coefficient("lmbda", lmbda, shape))}
        out = _dispatch.run(mode, Layout(shape, td), dtype, device,
                            {"x": g0, "v": g_target, "term": terminated, "trunc": truncated},
                            coefs, reverse=False, n_out=2 if shifted_values else 1,
                            fast=(key, raw, _BWD_INDEX))
    u, g_values = out if shifted_values else (out, None)
    g_next = g_boot = None
    if has_nv:  # dL/dV'_t = a_t u_t
        gamma_c, lmbda_c = (_coef(c, dtype, device) for c in s.coefs)
        term, done = _flags(terminated, truncated, dtype)
        a = gamma_c
        if not gae:
            a = a * (1.0 - _cut(torch.maximum(done, _last(shape, td, dtype, device)), lmbda_c))
        g_next = torch.broadcast_to(_cut(term, a * u), shape)
    elif has_boot:  # V'_{T-1} = bootstrap_value: a_{T-1} = gamma_{T-1} (1 - term_{T-1}) in both
        g_boot = _boot_grad(gamma, terminated, u, shape, td, dtype, device)
        g_boot = g_boot.sum_to_size(s.side_shape)
    if has_v and g_values is None:
        if gae:
            g_values = -u if g_target is None else g_target.to(dtype) - u
        else:
            g_values = torch.zeros_like(u)
    d = s.dtype
    return u.to(d), _cast(g_values, d), _cast(g_next, d), _cast(g_boot, d)


# the slots of the fused backwards' raw tuples, in their order (upstream gradients, flags,
# coefficients; the two out= places after them), and slot -> position
_BWD_SLOTS = ("x", "v", "term", "trunc", "g", "lm")
_VTRACE_BWD_SLOTS = ("x", "v", "term", "trunc", "rho", "g", "lm", "rb", "cb", "pb")
_BWD_INDEX = {s: i for i, s in enumerate(_BWD_SLOTS)}
_VTRACE_BWD_INDEX = {s: i for i, s in enumerate(_VTRACE_BWD_SLOTS)}


# ------------------------------------------------------------------------- V-trace


def vtrace_backward(s: Saved, log_rhos, terminated, truncated, g_vs, g_pg):
    """(dL/drewards, dL/dvalues, dL/dnext_values, dL/dbootstrap_value) of V-trace
    (log_rhos, flags, gamma, lambda and the thresholds are constants)."""
    td, shape, out_dtype = s.td, s.shape, s.dtype
    dtype, device = _cdtype(out_dtype), log_rhos.device
    _, has_nv, has_boot = s.has
    T = shape[td]
    if T == 0:
        z = torch.zeros(shape, dtype=out_dtype, device=device)
        boot = torch.zeros(s.side_shape, dtype=out_dtype, device=device) if has_boot else None
        return z, z, z if has_nv else None, boot
    if _fused(device) and not has_nv:
        return _vtrace_backward_fused(s, g_vs, g_pg, log_rhos, terminated, truncated, dtype)
    gamma, lmbda, rho_bar, c_bar, pg_rho_bar = (_coef(c, dtype, device) for c in s.coefs)
    term, done = _flags(terminated, truncated, dtype, shape)
    ratio = log_rhos.detach().to(dtype).exp()
    rho = _min(ratio, rho_bar)
    pgrho = _min(ratio, pg_rho_bar)
    beta = torch.broadcast_to(_cut(done, gamma * lmbda * _min(ratio, c_bar)), shape)
    stop = torch.maximum(done, _last(shape, td, dtype, device))  # 1 - cont
    gv = _grad(g_vs, shape, dtype, device)
    gp = _grad(g_pg, shape, dtype, device)
    gvs = gv + _prev(_cut(stop, pgrho * gamma * gp), td)  # pg_{t-1} reads vs_t
    u = _scan(gvs, _prev(beta, td), reverse=False, td=td)
    ru, pgg = rho * u, pgrho * gp
    g_rewards = ru + pgg
    g_values = gvs - ru - pgg
    g_vnext = torch.broadcast_to(_cut(term, gamma * (ru + _cut(1.0 - stop, pgg))), shape)
    g_next = g_boot = None
    if has_nv:
        g_next = g_vnext
    else:
        g_values = g_values + _prev(g_vnext, td)  # V'_{t-1} = V_t for t >= 1
        if has_boot:
            g_boot = g_vnext.select(td, T - 1).sum_to_size(s.side_shape)
    d = out_dtype
    return g_rewards.to(d), g_values.to(d), _cast(g_next, d), _cast(g_boot, d)


def _vtrace_backward_fused(s, g_vs, g_pg, log_rhos, terminated, truncated, dtype):
    """vtrace_backward (shifted values) through the kernel's adjoint mode: one pass
    reads dL/dvs, dL/dpg, the ratios and the flags and writes dL/drewards and
    dL/dvalues; the bootstrap value's gradient is O(N)."""
    td, shape = s.td, s.shape
    device = log_rhos.device
    gamma, lmbda, rho_bar, c_bar, pg_rho_bar = s.coefs
    if g_vs is None:
        g_vs = torch.zeros(shape, dtype=dtype, device=device)
    if g_pg is None:
        g_pg = torch.zeros(shape, dtype=dtype, device=device)
    raw = (g_vs, g_pg, terminated, truncated, log_rhos, gamma, lmbda, rho_bar, c_bar,
           pg_rho_bar, None, None)  # _VTRACE_BWD_SLOTS
    key, out = _dispatch.cached((MODE_VTRACE_BWD, td, dtype), raw)
    if out is None:
        def coef(name, c, hi=1.0):
            return _constant(check.coefficient(name, c, shape, hi=hi))

        coefs = {"g": coef("gamma", gamma), "lm": coef("lmbda", lmbda),
                 "rb": coef("rho_bar", rho_bar, None), "cb": coef("c_bar", c_bar, None),
                 "pb": coef("pg_rho_bar", pg_rho_bar, None)}
        out = _dispatch.run(MODE_VTRACE_BWD, Layout(shape, td), dtype, device,
                            {"x": g_vs, "v": g_pg, "term": terminated, "trunc": truncated,
                             "rho": log_rhos.detach()},
                            coefs, reverse=False, n_out=2, fast=(key, raw, _VTRACE_BWD_INDEX))
    g_rewards, g_values = out
    g_boot = None
    if s.has[2]:  # V'_{T-1} = bootstrap_value: gamma_{T-1} (1 - term_{T-1}) dL/dr_{T-1}
        g_boot = _boot_grad(gamma, terminated, g_rewards, shape, td, dtype, device)
        g_boot = g_boot.sum_to_size(s.side_shape)
    d = s.dtype
    return g_rewards.to(d), g_values.to(d), None, _cast(g_boot, d)


# ------------------------------------------------------------------- forward scans


def _forward_decay(gamma, lmbda, done_shape, feat, dtype, device):
    """gamma * lmbda of a forward scan, laid out as the forward's coefficients: a tensor
    broadcastable to ``done`` gets the trailing feature axes appended, any other tensor
    broadcasts to x itself."""
    out = 1.0
    for c in (gamma, lmbda):
        c = _coef(c, dtype, device)
        if isinstance(c, torch.Tensor) and (not feat or aligned_strides(c, done_shape)
                                            is not None):
            c = c.reshape(tuple(c.shape) + (1,) * feat)
        out = out * c
    return out


def forward_scan_backward(s: Saved, done, g, need_init: bool):
    """(dL/dx, dL/dinit) of eligibility_traces / episodic_cumsum."""
    td, shape, out_dtype = s.td, s.shape, s.dtype
    dtype, device = _cdtype(out_dtype), done.device
    has_init = s.has[0] and need_init
    if shape[td] == 0:
        z = torch.zeros(shape, dtype=out_dtype, device=device)
        i = torch.zeros(s.side_shape, dtype=out_dtype, device=device) if has_init else None
        return z, i
    if g is None:
        g = torch.zeros(shape, dtype=dtype, device=device)
    feat = len(shape) - done.dim()
    fused = _fused(device)
    # the kernel builds the decay in registers: the torch-side one only where it is read
    decay = None if fused and not has_init else _forward_decay(
        *s.coefs, tuple(done.shape), feat, dtype, device)
    # u_t = g_t + beta_{t+1} u_{t+1} with beta_{t+1} = decay_t (1 - done_t)
    if fused:  # the kernel's trace mode run backward: one pass, no coefficients
        u = _trace_adjoint_fused(s, g, done, feat, dtype)
    else:
        done_b = (done != 0).to(dtype).reshape(tuple(done.shape) + (1,) * feat)
        u = _scan(_grad(g, shape, dtype, device),
                  torch.broadcast_to(_cut(done_b, decay), shape), reverse=True, td=td)
    g_init = None
    if has_init:
        d0 = torch.broadcast_to(decay, shape).select(td, 0) \
            if isinstance(decay, torch.Tensor) else decay
        # a zero decay drops init (the forward's carry rule): its gradient is exactly 0
        u0 = u.select(td, 0)
        if isinstance(d0, torch.Tensor):
            g_init = torch.where(d0 == 0, 0.0, u0 * d0)
        else:
            g_init = u0 * d0 if d0 != 0 else torch.zeros_like(u0)
        g_init = g_init.sum_to_size(s.side_shape).to(out_dtype)
    return u.to(out_dtype), g_init


def _trace_adjoint_fused(s, g, done, feat, dtype):
    """u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1}: the trace mode run in reverse,
    with the forward's coefficients read at step t (cached launch, like the forward's)."""
    td, shape = s.td, tuple(g.shape)
    gamma, lmbda = s.coefs
    raw = (g, done, gamma, lmbda, None, None)
    key, u = _dispatch.cached((MODE_TRACE, td, "adjoint", dtype), raw)
    if u is None:
        def coef(name, c):
            return _constant(_call._forward_coefficient(name, c, tuple(done.shape), shape,
                                                        feat))

        done_b = done.reshape(tuple(done.shape) + (1,) * feat)
        coefs = {"g": coef("gamma", gamma), "lm": coef("lmbda", lmbda)}
        u = _dispatch.run(MODE_TRACE, Layout(shape, td), dtype, g.device,
                          {"x": g, "term": done_b}, coefs, reverse=True,
                          fast=(key, raw, {"x": 0, "term": 1, "g": 2, "lm": 3}))
    return u


# ------------------------------------------------------------------- the primitive


def linrec_backward(s: Saved, reverse, beta, init, h, g, needs):
    """(dL/dalpha, dL/dbeta, dL/dinit) of linear_recurrence; ``needs``: which of the
    three are wanted."""
    td, shape = s.td, s.shape
    beta_shape, init_shape = beta.shape, None if init is None else init.shape
    out_dtype, device = h.dtype, h.device
    dtype = _cdtype(out_dtype)
    T = shape[td]
    need_a, need_b, need_i = needs
    if T == 0:
        z = torch.zeros(shape, dtype=out_dtype, device=device)
        return (z if need_a else None,
                torch.zeros(beta_shape, dtype=out_dtype, device=device) if need_b else None,
                torch.zeros(init_shape, dtype=out_dtype, device=device)
                if need_i and init is not None else None)
    b = torch.broadcast_to(beta.to(dtype), shape)
    g = _grad(g, shape, dtype, device)
    if reverse:  # u_t = g_t + beta_{t-1} u_{t-1}
        u = _scan(g, _prev(b, td), reverse=False, td=td)
        k = T - 1  # init enters at h_{T-1} = alpha + beta_{T-1} init
    else:  # u_t = g_t + beta_{t+1} u_{t+1}
        u = _scan(g, _next(b, td), reverse=True, td=td)
        k = 0
    g_beta = g_init = None
    if need_b:
        if init is None:
            edge = torch.zeros_like(h.narrow(td, 0, 1), dtype=dtype)
        else:
            notime = shape[:td] + shape[td + 1:]
            edge = torch.broadcast_to(init.to(dtype), notime).unsqueeze(td)
        hd = h.to(dtype)
        if reverse:  # h_{t+1}, h_T = init
            h_other = torch.cat([hd.narrow(td, 1, T - 1), edge], td)
        else:  # h_{t-1}, h_{-1} = init
            h_other = torch.cat([edge, hd.narrow(td, 0, T - 1)], td)
        g_beta = (u * h_other).sum_to_size(beta_shape).to(out_dtype)
    if need_i and init is not None:
        bk = b.select(td, k)  # a zero beta drops init: its gradient is exactly 0
        g_init = torch.where(bk == 0, 0.0, u.select(td, k) * bk)
        g_init = g_init.sum_to_size(init_shape).to(out_dtype)
    return u.to(out_dtype) if need_a else None, g_beta, g_init


# ------------------------------------------------------------ autograd.Functions


def _arg(spec, raw, name):
    return raw[spec.args.index(name)]


def coef_values(spec: Estimator, args: dict) -> tuple:
    """The constant coefficients a backward reads, from the call's arguments by name:
    (gamma, lmbda[, rho_bar, c_bar, pg_rho_bar]); 1 for one the row does not take
    (discounted returns' lambda, the cumsum's gamma and lambda)."""
    names = ("gamma", "lmbda", "rho_bar", "c_bar", "pg_rho_bar")[:max(2, len(spec.coefs))]
    return tuple(args[n] if n in spec.coefs else 1.0 for n in names)


# ------------------------------------------------------ each row's backward, by name


@dataclass(frozen=True)
class Backward:
    """How a row's gradients are taken; the row names it (``Estimator.backward``).

    ``saved(spec, args, td, out)``: the Saved record; ``tensors(spec, args, out)``: the
    tensors the pass reads; ``run(spec, s, tensors, grads, needs, reverse)``: the
    gradients of ``spec.grads`` (None where absent); ``present(spec, has, needs,
    tensors)``: which of them the pass returns (the custom op's fake needs it)."""

    saved: Callable
    tensors: Callable
    run: Callable
    present: Callable


def _saved_returns(spec, args, td, out):
    boot = args["bootstrap_value"]
    has = (args.get("values") is not None, args["next_values"] is not None, boot is not None)
    return Saved(td, tuple(out.shape), out.dtype, has, coef_values(spec, args),
                 None if boot is None else tuple(boot.shape))


def _saved_trace(spec, args, td, out):
    init = args["init"]
    return Saved(td, tuple(out.shape), out.dtype, (init is not None,), coef_values(spec, args),
                 None if init is None else tuple(init.shape))


def _saved_linrec(spec, args, td, out):
    init = args["init"]
    return Saved(td, tuple(out.shape), out.dtype, (), (),
                 None if init is None else tuple(init.shape))


def _flag_tensors(spec, args, out):
    return [args["terminated"], args["truncated"]]


def _returns_run(gae):
    def run(spec, s, tensors, grads, needs, reverse):
        if gae and len(grads) == 1:  # gae_advantages: no value targets, no gradient of them
            grads = (grads[0], None)
        res = returns_backward(gae, s, tensors[0], tensors[1], grads)
        return res if "values" in spec.grads else (res[0],) + res[2:]
    return run


def _returns_present(spec, has, needs, tensors):
    h = dict(zip(("values", "next_values", "bootstrap_value"), has))
    return [True] + [h[n] for n in spec.grads[1:]]


def _vtrace_present(spec, has, needs, tensors):  # values are always given
    h = dict(zip(("values", "next_values", "bootstrap_value"), has))
    return [True, True, h["next_values"], h["bootstrap_value"]]


def _linrec_present(spec, has, needs, tensors):
    a, b, i = needs
    return [a, b, i and tensors[1] is not None]


BACKWARDS = {
    "gae": Backward(_saved_returns, _flag_tensors, _returns_run(True), _returns_present),
    "td": Backward(_saved_returns, _flag_tensors, _returns_run(False), _returns_present),
    "vtrace": Backward(
        _saved_returns,
        lambda spec, args, out: [args["log_rhos"], args["terminated"], args["truncated"]],
        lambda spec, s, tensors, grads, needs, reverse: vtrace_backward(s, *tensors, *grads),
        _vtrace_present),
    "trace": Backward(
        _saved_trace, lambda spec, args, out: [args["done"]],
        lambda spec, s, tensors, grads, needs, reverse: forward_scan_backward(
            s, tensors[0], grads[0], needs[-1]),
        lambda spec, has, needs, tensors: [True, bool(has[0]) and bool(needs[-1])]),
    "linrec": Backward(
        _saved_linrec, lambda spec, args, out: [args["beta"], args["init"], out],
        lambda spec, s, tensors, grads, needs, reverse: linrec_backward(
            s, reverse, *tensors, grads[0], tuple(needs)),
        _linrec_present),
}


def saved_of(spec: Estimator, raw: tuple, td: int, out) -> Saved:
    """The Saved record of a call (``out``: its first output, for the dtype)."""
    return BACKWARDS[spec.backward].saved(spec, dict(zip(spec.args, raw)), td, out)


def saved_tensors(spec: Estimator, raw: tuple, out) -> list:
    """The tensors a backward reads: the flags (and V-trace's log-ratios), the forward
    scans' done, the primitive's beta, init and output ``out``."""
    return BACKWARDS[spec.backward].tensors(spec, dict(zip(spec.args, raw)), out)


def backward(spec: Estimator, s: Saved, tensors: list, grads, needs, reverse=False):
    """The gradients of ``spec.grads`` (None for an input not given or, for the forward
    scans' init and the primitive, not needed: ``needs``, one bool per ``spec.grads``)."""
    return BACKWARDS[spec.backward].run(spec, s, tensors, grads, needs, reverse)


def present_grads(spec: Estimator, has, needs, tensors) -> list:
    """Which of ``spec.grads`` the backward returns (the rest come back absent)."""
    return BACKWARDS[spec.backward].present(spec, has, needs, tensors)


class _Estimator(torch.autograd.Function):
    """Any differentiable row of the table: the forward through ``_call`` (the cached
    launch or the full path), the backward through :func:`backward`."""

    @staticmethod
    def forward(ctx, spec, raw, time_dim, out_arg, *diff):
        out = _call.forward(spec, raw, time_dim, out_arg)
        first = out[0] if spec.n_out == 2 else out
        td = normalize_time_dim(time_dim, first.dim())
        ctx.spec, ctx.s = spec, saved_of(spec, raw, td, first)
        ctx.reverse = bool(dict(zip(spec.args, raw)).get("reverse", False))
        ctx.save_for_backward(*saved_tensors(spec, raw, first))
        return out

    @staticmethod
    def backward(ctx, *grads):
        needs = ctx.needs_input_grad[4:]  # after spec, raw, time_dim, out_arg
        res = backward(ctx.spec, ctx.s, list(ctx.saved_tensors), grads, needs, ctx.reverse)
        return (None,) * 4 + tuple(res)


def apply(spec: Estimator, raw: tuple, time_dim, out_arg=None):
    """Run a differentiable estimator with a backward pass (the differentiable inputs
    are ``spec.grads``, taken from ``raw``)."""
    raw = _call.values(raw)  # negative-bit views as their values (differentiably)
    diff = tuple(_arg(spec, raw, n) for n in spec.grads)
    return _Estimator.apply(spec, raw, time_dim, out_arg, *diff)
