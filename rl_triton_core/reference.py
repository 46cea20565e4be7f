"""Float64 sequential reference: the formulas of ``semantics.md``, one plain loop each.

This module is the test oracle. Every function has the same name and signature as
the public estimator, converts its inputs to float64, moves the time axis to the
front, runs a Python loop over time (vectorised over the batch) written straight
from the formula, and returns float64 tensors in the input's layout. Speed is not a
goal; being obviously correct is. Input checking is deliberately minimal: the public
functions validate, the reference only computes.

Conventions (see ``semantics.md``):

* flags (bool, uint8 or float 0/1) are step-aligned; ``done = terminated or truncated``
  and a step with both set counts as terminated; ``truncated=None`` means all False;
* next values: explicit ``next_values`` (the data's shape), or shifted
  ``V'_t = V_{t+1}`` for ``t < T-1`` and ``V'_{T-1} = bootstrap_value`` (the data's
  shape without the time axis, 0 if omitted);
* ``gamma``, ``lmbda`` and the clip thresholds are numbers or tensors broadcastable to
  the data; the backward estimators use the values at step t in step t's formula;
* cuts (``semantics.md``, non-finite values): a term a flag switches off is a select,
  ``where(flag, 0, x)`` (``_cut``), never ``(1 - flag) * x``, and each step of a
  recurrence is ``h = alpha + beta h'`` with the carry dropped where beta is 0
  (``_carry``), so a NaN or inf behind a done flag (or a zero beta) stays there.
"""

from __future__ import annotations

import torch

__all__ = [
    "masked_gae",
    "masked_returns",
    "masked_whiten",
    "gae",
    "gae_advantages",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "expected_next_q_from_actions",
    "eligibility_traces",
    "episodic_cumsum",
    "linear_recurrence",
]

F64 = torch.float64


# --------------------------------------------------------------------------- helpers


def _tensor(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _time_pos(time_dim: int, ndim: int) -> int:
    if not -ndim <= time_dim < ndim:
        raise ValueError(f"time_dim={time_dim} out of range for a {ndim}-d tensor")
    return time_dim % ndim


def _data(name: str, x, shape: torch.Size, pos: int) -> torch.Tensor:
    """float64 copy of a data tensor of exactly ``shape``, time axis moved to the front."""
    x = _tensor(name, x)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    return x.to(F64).movedim(pos, 0)


def _flag(name: str, x, shape: torch.Size, pos: int) -> torch.Tensor:
    """0/1 float64 flag of exactly ``shape`` (any nonzero counts as set), time first."""
    x = _tensor(name, x)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    return (x != 0).to(F64).movedim(pos, 0)


def _param(x, shape, pos: int, device) -> torch.Tensor:
    """gamma / lmbda / thresholds: a number or a tensor broadcast to ``shape``, time first."""
    x = torch.as_tensor(x, dtype=F64, device=device)
    return torch.broadcast_to(x, shape).movedim(pos, 0)


def _flags(terminated, truncated, shape, pos):
    """(1 - terminated_t, 1 - done_t) as float64, time first."""
    term = _flag("terminated", terminated, shape, pos)
    if truncated is None:
        trunc = torch.zeros_like(term)
    else:
        trunc = _flag("truncated", truncated, shape, pos)
    done = torch.maximum(term, trunc)
    return 1.0 - term, 1.0 - done


def _next_values(values_tf, next_values, bootstrap_value, shape, pos, name="next_values"):
    """V'_t, time first: explicit ``next_values`` or the values shifted by one step."""
    if next_values is not None and bootstrap_value is not None:
        raise ValueError(f"give either {name} or bootstrap_value, not both")
    if next_values is not None:
        return _data(name, next_values, shape, pos)
    nv = torch.zeros_like(values_tf)
    T = nv.shape[0]
    if T > 1:
        nv[:-1] = values_tf[1:]
    if T > 0 and bootstrap_value is not None:
        nv[-1] = _bootstrap(bootstrap_value, nv.shape[1:], nv.device)
    return nv


def _bootstrap(bootstrap_value, step_shape, device) -> torch.Tensor:
    """V'_{T-1}: one value per stream, the data's shape without the time axis."""
    b = torch.as_tensor(bootstrap_value, dtype=F64, device=device)
    if b.shape != step_shape:
        raise ValueError(f"bootstrap_value must have shape {tuple(step_shape)}, "
                         f"got {tuple(b.shape)}")
    return b


def _cut(clear, x):
    """``x`` where the flag is clear (``clear`` = 1 - flag is 1), else 0: a select, so a
    NaN or inf in ``x`` behind a set flag does not come through (0 * NaN would)."""
    return torch.where(clear > 0, x, 0.0)


def _carry(alpha, beta, h):
    """One step of a recurrence, ``alpha + beta * h``, with the carry dropped where
    ``beta == 0``: exactly ``alpha`` there, also when ``h`` is NaN or infinite."""
    return torch.where(beta == 0, alpha, alpha + beta * h)


def _zeros_step(x_tf: torch.Tensor) -> torch.Tensor:
    """Zeros of one time step's shape (the carry's), also for an empty time axis."""
    return torch.zeros(x_tf.shape[1:], dtype=F64, device=x_tf.device)


def _out(h_tf: torch.Tensor, pos: int) -> torch.Tensor:
    """Back to the input layout (time axis where it was)."""
    return h_tf.movedim(0, pos).contiguous()


def _backward_inputs(rewards, values, terminated, truncated, next_values, bootstrap_value,
                     gamma, time_dim, values_name="values", next_name="next_values"):
    rewards = _tensor("rewards", rewards)
    shape = rewards.shape
    pos = _time_pos(time_dim, rewards.dim())
    r = _data("rewards", rewards, shape, pos)
    v = _data(values_name, values, shape, pos)
    nv = _next_values(v, next_values, bootstrap_value, shape, pos, next_name)
    not_term, not_done = _flags(terminated, truncated, shape, pos)
    g = _param(gamma, shape, pos, r.device)
    return r, v, nv, not_term, not_done, g, shape, pos


# ------------------------------------------------------------------ backward estimators


def gae(rewards, values, terminated, truncated=None, *, next_values=None,
        bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim):
    """Generalised advantage estimation (Schulman et al. 2015).

        delta_t = r_t + gamma_t (1 - terminated_t) V'_t - V_t
        A_t     = delta_t + gamma_t lmbda_t (1 - done_t) A_{t+1},   A_T = 0

    Returns ``(advantages A, value_targets A + V)``.
    """
    r, v, nv, not_term, not_done, g, shape, pos = _backward_inputs(
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, time_dim)
    lam = _param(lmbda, shape, pos, r.device)
    adv = torch.zeros_like(r)
    a_next = _zeros_step(r)  # A_T = 0, one per stream
    for t in reversed(range(r.shape[0])):
        delta = r[t] + _cut(not_term[t], g[t] * nv[t]) - v[t]
        a_next = _carry(delta, _cut(not_done[t], g[t] * lam[t]), a_next)
        adv[t] = a_next
    return _out(adv, pos), _out(adv + v, pos)


def gae_advantages(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim):
    """GAE's advantages alone (:func:`gae`'s first output)."""
    return gae(rewards, values, terminated, truncated, next_values=next_values,
               bootstrap_value=bootstrap_value, gamma=gamma, lmbda=lmbda, time_dim=time_dim)[0]


def lambda_returns(rewards, values, terminated, truncated=None, *, next_values=None,
                   bootstrap_value=None, gamma=0.99, lmbda=0.95, time_dim):
    """TD(lambda) returns.

        G_t = r_t + gamma_t (1 - terminated_t) [(1 - lmbda_t c_t) V'_t + lmbda_t c_t G_{t+1}]
        c_t = 1 - done_t,  c_{T-1} = 0 (the window end bootstraps fully)
    """
    r, v, nv, not_term, not_done, g, shape, pos = _backward_inputs(
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, time_dim)
    lam = _param(lmbda, shape, pos, r.device)
    T = r.shape[0]
    ret = torch.zeros_like(r)
    g_next = _zeros_step(r)
    for t in reversed(range(T)):
        c = not_done[t] if t < T - 1 else torch.zeros_like(not_done[t])
        lc = _cut(c, lam[t])
        g_next = _carry(r[t] + _cut(not_term[t], g[t] * (1.0 - lc) * nv[t]),
                        _cut(not_term[t], g[t] * lc), g_next)
        ret[t] = g_next
    return _out(ret, pos)


def discounted_returns(rewards, terminated, truncated=None, *, next_values=None,
                       bootstrap_value=None, gamma=0.99, time_dim):
    """Discounted returns: TD(lambda) returns with lmbda = 1.

        G_t = r_t + gamma_t (1 - terminated_t) [truncated_t V'_t + (1 - done_t) G_{t+1}]

    and at t = T-1 the carry is V'_{T-1}. Without ``next_values``: V'_t = 0 for
    t < T-1 and V'_{T-1} = ``bootstrap_value`` (0 if omitted).
    """
    rewards = _tensor("rewards", rewards)
    shape = rewards.shape
    pos = _time_pos(time_dim, rewards.dim())
    zeros = torch.zeros(shape, dtype=F64, device=rewards.device)
    if next_values is not None and bootstrap_value is not None:
        raise ValueError("give either next_values or bootstrap_value, not both")
    if next_values is None:
        nv = zeros.clone()
        if shape[pos] > 0 and bootstrap_value is not None:
            step_shape = shape[:pos] + shape[pos + 1:]
            nv.movedim(pos, 0)[-1] = _bootstrap(bootstrap_value, step_shape, nv.device)
        next_values = nv
    return lambda_returns(rewards, zeros, terminated, truncated, next_values=next_values,
                          gamma=gamma, lmbda=1.0, time_dim=time_dim)


def vtrace(log_rhos, rewards, values, terminated, truncated=None, *, next_values=None,
           bootstrap_value=None, gamma=0.99, lmbda=1.0, rho_bar=1.0, c_bar=1.0,
           pg_rho_bar=1.0, time_dim):
    """V-trace (Espeholt et al. 2018).

        rho_t    = min(rho_bar, exp(log_rho_t)),   c_t = lmbda min(c_bar, exp(log_rho_t))
        delta_t  = rho_t (r_t + gamma_t (1 - terminated_t) V'_t - V_t)
        D_t      = delta_t + gamma_t (1 - done_t) c_t D_{t+1},   D_T = 0
        vs_t     = V_t + D_t
        pg_adv_t = min(pg_rho_bar, exp(log_rho_t)) (r_t + gamma_t (1 - terminated_t) vs'_t - V_t)
        vs'_t    = vs_{t+1} if not done_t and t < T-1, else V'_t

    Returns ``(vs, pg_advantages)``.
    """
    r, v, nv, not_term, not_done, g, shape, pos = _backward_inputs(
        rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, time_dim)
    ratio = _data("log_rhos", log_rhos, shape, pos).exp()
    dev = r.device
    rho = torch.minimum(_param(rho_bar, shape, pos, dev), ratio)
    c = _param(lmbda, shape, pos, dev) * torch.minimum(_param(c_bar, shape, pos, dev), ratio)
    pg_rho = torch.minimum(_param(pg_rho_bar, shape, pos, dev), ratio)
    T = r.shape[0]
    D = torch.zeros_like(r)
    d_next = _zeros_step(r)
    for t in reversed(range(T)):
        delta = rho[t] * (r[t] + _cut(not_term[t], g[t] * nv[t]) - v[t])
        d_next = _carry(delta, _cut(not_done[t], g[t] * c[t]), d_next)
        D[t] = d_next
    vs = v + D
    pg = torch.zeros_like(r)
    for t in range(T):
        if t < T - 1:
            vs_next = torch.where(not_done[t] > 0, vs[t + 1], nv[t])
        else:
            vs_next = nv[t]
        pg[t] = pg_rho[t] * (r[t] + _cut(not_term[t], g[t] * vs_next) - v[t])
    return _out(vs, pos), _out(pg, pos)


def expected_next_q_from_actions(next_target_probs, next_q_values):
    """E_t = sum_a pi(a | s_{t+1}) Q(s_{t+1}, a), summed over the last (action) axis."""
    p = _tensor("next_target_probs", next_target_probs).to(F64)
    q = _tensor("next_q_values", next_q_values).to(F64)
    return (p * q).sum(-1)


def retrace(log_rhos, rewards, q_values, expected_next_q, terminated, truncated=None, *,
            gamma=0.99, lmbda=1.0, c_bar=1.0, time_dim):
    """Retrace(lambda) (Munos et al. 2016).

        c_t     = lmbda_t min(c_bar_t, exp(log_rho_t))
        delta_t = r_t + gamma_t (1 - terminated_t) E_t - Q_t
        D_t     = delta_t + gamma_t (1 - done_t) c_{t+1} D_{t+1},   D_T = 0
        Q_ret_t = Q_t + D_t

    The trace of step t uses the ratio (and lmbda, c_bar) of step t+1; c_T is never
    needed because D_T = 0. ``expected_next_q`` is E_t (see
    ``expected_next_q_from_actions``).
    """
    r, q, e, not_term, not_done, g, shape, pos = _backward_inputs(
        rewards, q_values, terminated, truncated, expected_next_q, None, gamma, time_dim,
        values_name="q_values", next_name="expected_next_q")
    ratio = _data("log_rhos", log_rhos, shape, pos).exp()
    dev = r.device
    c = _param(lmbda, shape, pos, dev) * torch.minimum(_param(c_bar, shape, pos, dev), ratio)
    T = r.shape[0]
    D = torch.zeros_like(r)
    d_next = _zeros_step(r)
    for t in reversed(range(T)):
        delta = r[t] + _cut(not_term[t], g[t] * e[t]) - q[t]
        c_next = c[t + 1] if t + 1 < T else torch.zeros_like(c[t])
        d_next = _carry(delta, _cut(not_done[t], g[t] * c_next), d_next)
        D[t] = d_next
    return _out(q + D, pos)


# ------------------------------------------------------------------- forward scans


def _forward_layout(x, done, time_dim):
    """x and done for the forward scans, time first; done gets x's trailing feature axes.

    ``done`` has (or broadcasts to) ``x``'s shape without the trailing feature axes after
    the time axis, ``x.shape[:done.dim()]``, and the time axis lies inside it.
    """
    x = _tensor("x", x)
    done = _tensor("done", done)
    pos = _time_pos(time_dim, x.dim())
    full = x.shape[: done.dim()]
    try:
        ok = pos < done.dim() and torch.broadcast_shapes(done.shape, full) == full
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"done must have (or broadcast to) x's shape {tuple(x.shape)} without "
                         f"trailing feature axes after time_dim, got {tuple(done.shape)}")
    done = torch.broadcast_to(done, full)
    n_feat = x.dim() - done.dim()
    d = (done != 0).to(F64).reshape(done.shape + (1,) * n_feat)
    return x.to(F64).movedim(pos, 0), d.movedim(pos, 0), done.shape, n_feat, pos


def _forward_param(p, done_shape, x_shape, n_feat, pos, device):
    """gamma / lmbda for the forward scans, time first: broadcast to done's shape if it
    can be (then constant over the feature axes), else to x's shape."""
    p = torch.as_tensor(p, dtype=F64, device=device)
    try:
        p = torch.broadcast_to(p, done_shape).reshape(done_shape + (1,) * n_feat)
    except RuntimeError:
        pass  # not broadcastable to done's shape: it must be to x's
    return torch.broadcast_to(p, x_shape).movedim(pos, 0)


def _init(init, x_tf):
    if init is None:
        return _zeros_step(x_tf)
    init = _tensor("init", init)
    if init.shape != x_tf.shape[1:]:
        raise ValueError(f"init must have shape {tuple(x_tf.shape[1:])}, got {tuple(init.shape)}")
    return init.to(F64)


def eligibility_traces(x, done, *, gamma=0.99, lmbda=0.95, init=None, time_dim):
    """Accumulating eligibility traces (forward).

        z_t = x_t + gamma_{t-1} lmbda_{t-1} (1 - done_{t-1}) z_{t-1},   z_{-1} = init (0)

    The decay multiplying z_{t-1} belongs to the transition out of step t-1. At t = 0
    (done_{-1} = 0) there is no step -1, so the decay applied to ``init`` is
    gamma_0 lmbda_0 (for scalar gamma and lmbda: gamma lmbda, as in semantics.md).
    """
    x_tf, d, done_shape, n_feat, pos = _forward_layout(x, done, time_dim)
    g = _forward_param(gamma, done_shape, x.shape, n_feat, pos, x_tf.device)
    lam = _forward_param(lmbda, done_shape, x.shape, n_feat, pos, x_tf.device)
    z = _init(init, x_tf)
    out = torch.zeros_like(x_tf)
    for t in range(x_tf.shape[0]):
        if t == 0:
            decay = g[0] * lam[0]
        else:
            decay = _cut(1.0 - d[t - 1], g[t - 1] * lam[t - 1])
        z = _carry(x_tf[t], decay, z)
        out[t] = z
    return _out(out, pos)


def episodic_cumsum(x, done, *, init=None, time_dim):
    """Episodic prefix sum (forward): running episode return or length.

        C_t = x_t + (1 - done_{t-1}) C_{t-1},   C_{-1} = init (0),  done_{-1} = 0
    """
    x_tf, d, _, _, pos = _forward_layout(x, done, time_dim)
    c = _init(init, x_tf)
    out = torch.zeros_like(x_tf)
    for t in range(x_tf.shape[0]):
        keep = 1.0 - d[t - 1] if t > 0 else torch.ones_like(x_tf[0])
        c = _carry(x_tf[t], keep, c)
        out[t] = c
    return _out(out, pos)


def linear_recurrence(alpha, beta, *, reverse=True, init=None, time_dim):
    """The one primitive: a first-order linear recurrence along ``time_dim``.

        reverse=True:   h_t = alpha_t + beta_t h_{t+1},   h_T    = init (0)
        reverse=False:  h_t = alpha_t + beta_t h_{t-1},   h_{-1} = init (0)

    Where beta_t = 0 the carry is dropped: h_t = alpha_t, whatever h_{t+-1} (NaN too).
    """
    alpha = _tensor("alpha", alpha)
    beta = _tensor("beta", beta)
    pos = _time_pos(time_dim, alpha.dim())
    a = alpha.to(F64).movedim(pos, 0)
    b = _data("beta", beta, alpha.shape, pos)
    h = _init(init, a)
    out = torch.zeros_like(a)
    steps = reversed(range(a.shape[0])) if reverse else range(a.shape[0])
    for t in steps:
        h = _carry(a[t], b[t], h)
        out[t] = h
    return _out(out, pos)


# --- token level (LLM post-training): the frameworks' own loops, in float64 ---------


def masked_whiten(x, mask, *, shift_mean=True, unbiased=True, eps=1e-8, count_eps=0.0,
                  fill=None):
    """verl's ``masked_whiten`` (``count_eps=1e-8``) and TRL's (``count_eps=0``). Where
    they raise (no valid token, or one under the unbiased variance), the formula: one
    valid token has no unbiased variance, NaN."""
    x = x.to(F64)
    m = (mask != 0).to(F64)
    n = m.sum()
    mean = torch.where(m.bool(), x, 0.0).mul(m).sum() / (n + count_eps)
    c = x - mean
    var = torch.where(m.bool(), c * c, 0.0).mul(m).sum() / (n + count_eps)
    if unbiased:
        var = torch.where(n == 1, torch.nan, var * (n / (n - 1)))
    y = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        y = y + mean
    if fill is not None:
        y = torch.where(m.bool(), y, torch.full_like(y, fill))
    return y


def masked_gae(rewards, values, mask, *, gamma=1.0, lmbda=1.0, skip=True, whiten=False,
               count_eps=0.0, eps=1e-8, unbiased=True, fill=None, time_dim):
    """skip=True: verl's ``compute_gae_advantage_return`` loop; skip=False: OpenRLHF's
    ``get_advantages_and_returns`` loop. [B, T] data (time_dim -1) or [T, B] (0)."""
    r = rewards.to(F64)
    v = values.to(F64)
    m = (mask != 0).to(F64)
    if time_dim in (0, -2) and r.dim() == 2:
        r, v, m = r.t(), v.t(), m.t()
    if not skip:
        v, r = m * v, m * r
    T = r.shape[-1]
    nextvalues = torch.zeros_like(r[..., 0])
    lastgaelam = torch.zeros_like(r[..., 0])
    adv = torch.zeros_like(r)
    for t in reversed(range(T)):
        if skip:
            delta = r[..., t] + gamma * nextvalues - v[..., t]
            new = delta + gamma * lmbda * lastgaelam
            nextvalues = v[..., t] * m[..., t] + (1 - m[..., t]) * nextvalues
            lastgaelam = new * m[..., t] + (1 - m[..., t]) * lastgaelam
        else:
            nv = v[..., t + 1] if t < T - 1 else 0.0
            delta = r[..., t] + gamma * nv - v[..., t]
            lastgaelam = delta + gamma * lmbda * lastgaelam
        adv[..., t] = lastgaelam
    ret = adv + v
    if whiten:
        adv = masked_whiten(adv, m, unbiased=unbiased, eps=eps, count_eps=count_eps, fill=fill)
    elif fill is not None:
        adv = torch.where(m.bool(), adv, torch.full_like(adv, fill))
    if time_dim in (0, -2) and r.dim() == 2:
        adv, ret = adv.t(), ret.t()
    return adv, ret


def masked_returns(rewards, mask, *, gamma=1.0, skip=True, time_dim):
    """skip=True: verl's REINFORCE++ return loop; skip=False: OpenRLHF's
    ``get_cumulative_returns``. [B, T] data (time_dim -1) or [T, B] (0)."""
    r = rewards.to(F64)
    m = (mask != 0).to(F64)
    if time_dim in (0, -2) and r.dim() == 2:
        r, m = r.t(), m.t()
    if not skip:
        r = m * r
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[..., 0])
    for t in reversed(range(r.shape[-1])):
        new = r[..., t] + gamma * running
        if skip:
            out[..., t] = new * m[..., t]
            running = new * m[..., t] + running * (1 - m[..., t])
        else:
            running = new
            out[..., t] = new
    return out.t() if time_dim in (0, -2) and r.dim() == 2 else out


def group_advantages(scores, group, *, method="grpo", eps=1e-6):
    """verl 0.9.1's GRPO / Dr. GRPO / RLOO outcome advantages, one group at a time in
    float64 (a Python loop over the groups, torch.std for the spread). [B] scores, [B]
    group ids (any hashable values), float64 [B] out."""
    s = torch.as_tensor(scores).to(F64).reshape(-1)
    ids = [int(x) for x in torch.as_tensor(group).reshape(-1).tolist()]
    members = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    out = torch.empty_like(s)
    for idx in members.values():
        x = s[idx]
        n = len(idx)
        if n == 1:
            out[idx] = x / (1.0 + eps) if method == "grpo" else x
        elif method == "grpo":
            out[idx] = (x - x.mean()) / (x.std() + eps)
        elif method == "grpo_mean":
            out[idx] = x - x.mean()
        elif method == "rloo":
            out[idx] = x * n / (n - 1) - x.mean() * n / (n - 1)
        else:
            raise ValueError(f"unknown method {method!r}")
    return out
