r"""Backward passes: every gradient is the adjoint of a linear recurrence, run with the
library's own scan (the public :func:`linear_recurrence`, i.e. the Triton kernel or the
CPU path), plus elementwise torch ops. Nothing goes through the Python reference loop.

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
from differentiable ops and the public scan, so double backward works where the upstream
gradient is the variable (the coefficients are constants).
"""

from __future__ import annotations

import torch

from rl_triton_core._layout import aligned_strides, normalize_time_dim

_HALF = (torch.float16, torch.bfloat16)


def _cdtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the backward computes in: float32 for half types, else the data's."""
    return torch.float32 if dtype in _HALF else dtype


def _coef(c, dtype, device):
    """A gamma / lambda / threshold: a number stays one, a tensor goes to the backward's
    dtype and device (a constant: detached)."""
    if isinstance(c, torch.Tensor):
        return c.detach().to(device=device, dtype=dtype)
    return float(c)


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
    term = terminated.to(dtype)
    done = term if truncated is None else torch.maximum(term, truncated.to(dtype))
    if shape is not None:
        term, done = torch.broadcast_to(term, shape), torch.broadcast_to(done, shape)
    return term, done


def _grad(g, shape, dtype, device) -> torch.Tensor:
    """An upstream gradient in the backward's dtype, contiguous (zeros where None)."""
    if g is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return g.to(dtype).contiguous()


def _scan(alpha, beta, *, reverse, td):
    from rl_triton_core.estimators import linear_recurrence

    return linear_recurrence(alpha, beta.contiguous(), reverse=reverse, time_dim=td)


# ----------------------------------------------------------- gae / TD(lambda) / returns


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
        terminated, truncated = ctx.saved_tensors
        td, shape = ctx.td, ctx.shape
        dtype = _cdtype(ctx.dtype)
        device = terminated.device
        has_v, has_nv, has_boot = ctx.has
        nones = (None,) * 11
        if shape[td] == 0:  # empty time axis: zero gradients
            z = torch.zeros(shape, dtype=ctx.dtype, device=device)
            boot = None if not has_boot else torch.zeros(ctx.boot_shape, dtype=ctx.dtype,
                                                         device=device)
            return (*nones[:3], z, z if has_v else None, z if has_nv else None, boot,
                    *nones[:4])
        if _fused(device):
            return _returns_backward_fused(ctx, grads, terminated, truncated, dtype)
        gamma, lmbda = (_coef(c, dtype, device) for c in ctx.coef)
        term, done = _flags(terminated, truncated, dtype)
        if ctx.gae:
            g_adv, g_target = (_grad(g, shape, dtype, device) for g in grads)
            g_h = g_adv + g_target
            beta = gamma * lmbda * (1.0 - done)
            a_v_next = gamma * (1.0 - term)
        else:
            g_target = None
            g_h = _grad(grads[0], shape, dtype, device)
            c = (1.0 - done) * (1.0 - _last(shape, td, dtype, device))
            beta = gamma * (1.0 - term) * lmbda * c
            a_v_next = gamma * (1.0 - term) * (1.0 - lmbda * c)
        u = _scan(g_h, _prev(torch.broadcast_to(beta, shape), td), reverse=False, td=td)
        g_rewards = u
        g_vnext = torch.broadcast_to(a_v_next * u, shape)
        g_values = g_next = g_boot = None
        if has_v:
            g_values = -u + g_target if ctx.gae else torch.zeros_like(u)
        if has_nv:
            g_next = g_vnext
        else:
            if has_v:  # V'_{t-1} = V_t for t >= 1
                g_values = g_values + _prev(g_vnext, td)
            if has_boot:  # V'_{T-1} = bootstrap_value (summed over axes it was broadcast on)
                g_boot = g_vnext.select(td, shape[td] - 1)
                g_boot = g_boot.sum_to_size(ctx.boot_shape)
        d = ctx.dtype
        return (None, None, None, g_rewards.to(d), _cast(g_values, d), _cast(g_next, d),
                _cast(g_boot, d), None, None, None, None)


def _fused(device) -> bool:
    """The Triton backend runs the adjoint and the values' gradient in one kernel pass."""
    from rl_triton_core._dispatch import backend_for

    return backend_for(device) == "triton"


def _returns_backward_fused(ctx, grads, terminated, truncated, dtype):
    """_Returns.backward through the kernel's adjoint modes: one pass reads the upstream
    gradients and the flags and writes dL/drewards (= u) and, for shifted values,
    dL/dvalues; the other gradients are O(N) (bootstrap) or one elementwise pass
    (explicit next values)."""
    from rl_triton_core import _fastpath
    from rl_triton_core import _validate as check
    from rl_triton_core._dispatch import run
    from rl_triton_core._layout import Layout
    from rl_triton_core._triton_scan import MODE_GAE_BWD, MODE_TD_BWD

    td, shape = ctx.td, ctx.shape
    device = terminated.device
    has_v, has_nv, has_boot = ctx.has
    # autograd materialises the gradient of an unused output as zeros (never None here)
    g0 = grads[0]
    g_target = grads[1] if ctx.gae else None
    shifted_values = has_v and not has_nv
    mode = MODE_GAE_BWD if ctx.gae else MODE_TD_BWD
    # the cached launch, as the forward's: a training loop repeats the same shapes
    slots = (g0, g_target, None, terminated, truncated, None, None, None, *ctx.coef,
             None, None, None, None, None)
    key = _fastpath.key_of((mode, td, shifted_values, dtype), slots)
    out = _fastpath.lookup(key, slots)
    if out is None:
        g, l = (_constant(check.coefficient(n, c, shape))
                for n, c in zip(("gamma", "lmbda"), ctx.coef))
        out = run(mode, Layout(shape, td), dtype, device, x=g0, v=g_target, term=terminated,
                  trunc=truncated, g=g, l=l, reverse=False, two_out=shifted_values,
                  fast=(key, slots))
    u, g_values = out if shifted_values else (out, None)
    g_next = g_boot = None
    if has_nv:  # dL/dV'_t = a_t u_t
        gamma, lmbda = (_coef(c, dtype, device) for c in ctx.coef)
        term, done = _flags(terminated, truncated, dtype)
        a = gamma * (1.0 - term)
        if not ctx.gae:
            c = (1.0 - done) * (1.0 - _last(shape, td, dtype, device))
            a = a * (1.0 - lmbda * c)
        g_next = torch.broadcast_to(a * u, shape)
    elif has_boot:  # V'_{T-1} = bootstrap_value: a_{T-1} = gamma_{T-1} (1 - term_{T-1}) in both
        g_boot = _boot_grad(ctx.coef[0], terminated, u, shape, td, dtype, device)
        g_boot = g_boot.sum_to_size(ctx.boot_shape)
    if has_v and g_values is None:
        if ctx.gae:
            g_values = -u if g_target is None else g_target.to(dtype) - u
        else:
            g_values = torch.zeros_like(u)
    d = ctx.dtype
    return (None, None, None, u.to(d), _cast(g_values, d), _cast(g_next, d), _cast(g_boot, d),
            None, None, None, None)


def _constant(coefficient):
    """A validated (number, tensor) coefficient as the backward kernels take it: the
    tensor detached (flags, gamma, lambda and the clip thresholds are constants)."""
    value, tensor = coefficient
    return value, None if tensor is None else tensor.detach()


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
    if term.dtype == torch.bool:  # two small kernels, not a cast and three products
        return torch.where(term, 0.0, g_last)
    return (1.0 - term.to(dtype)) * g_last


def _cast(g, dtype):
    return None if g is None else g.to(dtype)


def returns(fn, gae, td, rewards, values, next_values, bootstrap_value, terminated, truncated,
            gamma, lmbda):
    """Run ``fn(rewards, values, next_values, bootstrap_value)`` with a backward pass."""
    return _Returns.apply(fn, gae, td, rewards, values, next_values, bootstrap_value,
                          terminated, truncated, gamma, lmbda)


# ------------------------------------------------------------------------- V-trace


class _VTrace(torch.autograd.Function):
    """V-trace ``(vs, pg_advantages)`` with gradients to rewards, values, next_values and
    bootstrap_value (log_rhos, flags, gamma, lambda and the thresholds are constants)."""

    @staticmethod
    def forward(ctx, fn, time_dim, rewards, values, next_values, bootstrap_value, log_rhos,
                terminated, truncated, coefs):
        with torch.no_grad():
            vs, pg = fn(rewards, values, next_values, bootstrap_value)
        ctx.td = normalize_time_dim(time_dim, vs.dim())
        ctx.has = (next_values is not None, bootstrap_value is not None)
        ctx.coefs = coefs
        ctx.boot_shape = None if bootstrap_value is None else bootstrap_value.shape
        ctx.dtype = vs.dtype
        ctx.save_for_backward(log_rhos, terminated, truncated)
        return vs, pg

    @staticmethod
    def backward(ctx, g_vs, g_pg):
        log_rhos, terminated, truncated = ctx.saved_tensors
        td, shape, out_dtype = ctx.td, log_rhos.shape, ctx.dtype
        dtype, device = _cdtype(out_dtype), log_rhos.device
        has_nv, has_boot = ctx.has
        T = shape[td]
        if T == 0:
            z = torch.zeros(shape, dtype=out_dtype, device=device)
            boot = torch.zeros(ctx.boot_shape, dtype=out_dtype, device=device) \
                if has_boot else None
            return None, None, z, z, z if has_nv else None, boot, None, None, None, None
        if _fused(device) and not has_nv:
            return _vtrace_backward_fused(ctx, g_vs, g_pg, log_rhos, terminated, truncated,
                                          dtype)
        gamma, lmbda, rho_bar, c_bar, pg_rho_bar = (_coef(c, dtype, device) for c in ctx.coefs)
        term, done = _flags(terminated, truncated, dtype, shape)
        ratio = log_rhos.detach().to(dtype).exp()
        rho = _min(ratio, rho_bar)
        pgrho = _min(ratio, pg_rho_bar)
        beta = torch.broadcast_to(gamma * (1.0 - done) * lmbda * _min(ratio, c_bar), shape)
        gnt = gamma * (1.0 - term)
        cont = (1.0 - done) * (1.0 - _last(shape, td, dtype, device))
        gv = _grad(g_vs, shape, dtype, device)
        gp = _grad(g_pg, shape, dtype, device)
        gvs = gv + _prev(pgrho * gnt * cont * gp, td)  # pg_{t-1} reads vs_t
        u = _scan(gvs, _prev(beta, td), reverse=False, td=td)
        ru, pgg = rho * u, pgrho * gp
        g_rewards = ru + pgg
        g_values = gvs - ru - pgg
        g_vnext = torch.broadcast_to(gnt * (ru + pgg * (1.0 - cont)), shape)
        g_next = g_boot = None
        if has_nv:
            g_next = g_vnext
        else:
            g_values = g_values + _prev(g_vnext, td)  # V'_{t-1} = V_t for t >= 1
            if has_boot:
                g_boot = g_vnext.select(td, T - 1).sum_to_size(ctx.boot_shape)
        d = out_dtype
        return (None, None, g_rewards.to(d), g_values.to(d), _cast(g_next, d), _cast(g_boot, d),
                None, None, None, None)


def _vtrace_backward_fused(ctx, g_vs, g_pg, log_rhos, terminated, truncated, dtype):
    """_VTrace.backward (shifted values) through the kernel's adjoint mode: one pass
    reads dL/dvs, dL/dpg, the ratios and the flags and writes dL/drewards and
    dL/dvalues; the bootstrap value's gradient is O(N)."""
    from rl_triton_core import _fastpath
    from rl_triton_core import _validate as check
    from rl_triton_core._dispatch import run
    from rl_triton_core._layout import Layout
    from rl_triton_core._triton_scan import MODE_VTRACE_BWD

    td, shape = ctx.td, log_rhos.shape
    device = log_rhos.device
    gamma, lmbda, rho_bar, c_bar, pg_rho_bar = ctx.coefs
    slots = (g_vs, g_pg, None, terminated, truncated, None, None, log_rhos, gamma, lmbda,
             rho_bar, c_bar, pg_rho_bar, None, None)
    key = _fastpath.key_of((MODE_VTRACE_BWD, td, dtype), slots)
    out = _fastpath.lookup(key, slots)
    if out is None:
        def coef(name, c, hi=1.0):
            return _constant(check.coefficient(name, c, shape, hi=hi))

        out = run(MODE_VTRACE_BWD, Layout(shape, td), dtype, device, x=g_vs, v=g_pg,
                  term=terminated, trunc=truncated, g=coef("gamma", gamma),
                  l=coef("lmbda", lmbda), rho=log_rhos.detach(),
                  rb=coef("rho_bar", rho_bar, None), cb=coef("c_bar", c_bar, None),
                  pb=coef("pg_rho_bar", pg_rho_bar, None), reverse=False, two_out=True,
                  fast=(key, slots))
    g_rewards, g_values = out
    g_boot = None
    if ctx.has[1]:  # V'_{T-1} = bootstrap_value: gamma_{T-1} (1 - term_{T-1}) dL/dr_{T-1}
        g_boot = _boot_grad(ctx.coefs[0], terminated, g_rewards, shape, td, dtype, device)
        g_boot = g_boot.sum_to_size(ctx.boot_shape)
    d = ctx.dtype
    return (None, None, g_rewards.to(d), g_values.to(d), None, _cast(g_boot, d),
            None, None, None, None)


def vtrace(fn, time_dim, rewards, values, next_values, bootstrap_value, log_rhos, terminated,
           truncated, gamma, lmbda, rho_bar, c_bar, pg_rho_bar):
    """Run ``fn(rewards, values, next_values, bootstrap_value)`` (a V-trace call that
    validates its inputs) with a backward pass."""
    return _VTrace.apply(fn, time_dim, rewards, values, next_values, bootstrap_value, log_rhos,
                         terminated, truncated, (gamma, lmbda, rho_bar, c_bar, pg_rho_bar))


# ------------------------------------------------------------------- forward scans


def _forward_decay(gamma, lmbda, done_shape, feat, dtype, device):
    """gamma * lmbda of a forward scan, laid out as _forward_coefficient in estimators:
    a tensor broadcastable to ``done`` gets the trailing feature axes appended, any other
    tensor broadcasts to x itself."""
    out = 1.0
    for c in (gamma, lmbda):
        c = _coef(c, dtype, device)
        if isinstance(c, torch.Tensor) and (not feat or aligned_strides(c, done_shape)
                                            is not None):
            c = c.reshape(tuple(c.shape) + (1,) * feat)
        out = out * c
    return out


class _Forward(torch.autograd.Function):
    """eligibility_traces / episodic_cumsum with gradients to x and init."""

    @staticmethod
    def forward(ctx, fn, time_dim, x, init, done, gamma, lmbda):
        with torch.no_grad():
            z = fn(x, init)
        ctx.td = normalize_time_dim(time_dim, z.dim())
        ctx.coef = (gamma, lmbda)
        ctx.init_shape = None if init is None else init.shape
        ctx.dtype = z.dtype
        ctx.save_for_backward(done)
        return z

    @staticmethod
    def backward(ctx, g):
        (done,) = ctx.saved_tensors
        td, shape, out_dtype = ctx.td, g.shape, ctx.dtype
        dtype, device = _cdtype(out_dtype), g.device
        has_init = ctx.init_shape is not None and ctx.needs_input_grad[3]
        if shape[td] == 0:
            z = torch.zeros(shape, dtype=out_dtype, device=device)
            i = torch.zeros(ctx.init_shape, dtype=out_dtype, device=device) if has_init else None
            return None, None, z, i, None, None, None
        feat = len(shape) - done.dim()
        fused = _fused(device)
        # the kernel builds the decay in registers: the torch-side one only where it is read
        decay = None if fused and not has_init else _forward_decay(
            *ctx.coef, tuple(done.shape), feat, dtype, device)
        # u_t = g_t + beta_{t+1} u_{t+1} with beta_{t+1} = decay_t (1 - done_t)
        if fused:  # the kernel's trace mode run backward: one pass, no coefficients
            u = _trace_adjoint_fused(ctx, g, done, feat, dtype)
        else:
            notdone = 1.0 - done.to(dtype).reshape(tuple(done.shape) + (1,) * feat)
            u = _scan(_grad(g, shape, dtype, device),
                      torch.broadcast_to(decay * notdone, shape), reverse=True, td=td)
        g_init = None
        if has_init:
            d0 = torch.broadcast_to(decay, shape).select(td, 0) \
                if isinstance(decay, torch.Tensor) else decay
            g_init = (u.select(td, 0) * d0).sum_to_size(ctx.init_shape).to(out_dtype)
        return None, None, u.to(out_dtype), g_init, None, None, None


def _trace_adjoint_fused(ctx, g, done, feat, dtype):
    """u_t = g_t + gamma_t lambda_t (1 - done_t) u_{t+1}: the trace mode run in reverse,
    with the forward's coefficients read at step t (cached launch, like the forward's)."""
    from rl_triton_core import _fastpath
    from rl_triton_core._dispatch import run
    from rl_triton_core._layout import Layout
    from rl_triton_core._triton_scan import MODE_TRACE
    from rl_triton_core.estimators import _forward_coefficient

    td, shape = ctx.td, tuple(g.shape)
    gamma, lmbda = ctx.coef
    slots = (g, None, None, done, None, None, None, None, gamma, lmbda, None, None, None,
             None, None)
    key = _fastpath.key_of((MODE_TRACE, td, "adjoint", dtype), slots)
    u = _fastpath.lookup(key, slots)
    if u is None:
        def coef(name, c):
            return _constant(_forward_coefficient(name, c, tuple(done.shape), shape, feat))

        done_b = done.reshape(tuple(done.shape) + (1,) * feat)
        u = run(MODE_TRACE, Layout(shape, td), dtype, g.device, x=g, term=done_b,
                g=coef("gamma", gamma), l=coef("lmbda", lmbda), reverse=True,
                fast=(key, slots))
    return u


def forward_scan(fn, time_dim, x, init, done, gamma, lmbda):
    """Run ``fn(x, init)`` (a forward scan that validates its inputs) with a backward pass."""
    return _Forward.apply(fn, time_dim, x, init, done, gamma, lmbda)


# ------------------------------------------------------------------- the primitive


class _LinRec(torch.autograd.Function):
    """linear_recurrence with gradients to alpha, beta and init."""

    @staticmethod
    def forward(ctx, fn, time_dim, reverse, alpha, beta, init):
        with torch.no_grad():
            h = fn(alpha, beta, init)
        ctx.td = normalize_time_dim(time_dim, h.dim())
        ctx.reverse = reverse
        ctx.shapes = (beta.shape, None if init is None else init.shape)
        ctx.save_for_backward(beta, init, h)
        return h

    @staticmethod
    def backward(ctx, g):
        beta, init, h = ctx.saved_tensors
        td, reverse, shape = ctx.td, ctx.reverse, h.shape
        beta_shape, init_shape = ctx.shapes
        out_dtype, device = h.dtype, h.device
        dtype = _cdtype(out_dtype)
        T = shape[td]
        need_a, need_b, need_i = ctx.needs_input_grad[3:6]
        if T == 0:
            z = torch.zeros(shape, dtype=out_dtype, device=device)
            return (None, None, None, z if need_a else None,
                    torch.zeros(beta_shape, dtype=out_dtype, device=device) if need_b else None,
                    torch.zeros(init_shape, dtype=out_dtype, device=device) if need_i else None)
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
            g_init = (u.select(td, k) * b.select(td, k)).sum_to_size(init_shape).to(out_dtype)
        return None, None, None, u.to(out_dtype) if need_a else None, g_beta, g_init


def linear_recurrence(fn, time_dim, reverse, alpha, beta, init):
    """Run ``fn(alpha, beta, init)`` (the validating public call) with a backward pass."""
    return _LinRec.apply(fn, time_dim, reverse, alpha, beta, init)


def wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
