"""Drop-ins for ``torchrl.objectives.value.functional`` (TorchRL 0.14) on ``rl_triton_core``.

Every function here has the name, signature and return values of TorchRL's own
and gives the same numbers (within float tolerance); only the recursion runs in
the core: one Triton kernel for CUDA tensors, the core's CPU path for CPU
tensors. Swap one import::

    # from torchrl.objectives.value.functional import vec_generalized_advantage_estimate
    from rl_triton_torchrl.functional import vec_generalized_advantage_estimate

How TorchRL's arguments map onto the core (``semantics.md``):

* data ``[*B, T, *F]`` with the time axis at ``time_dim`` (default ``-2``, as in
  TorchRL): passed through as the core's ``time_dim``; every other axis is a
  batch axis, exactly as in TorchRL, where batch and feature axes never mix.
  ``time_dim`` is checked by TorchRL's rule (a ``RuntimeError`` otherwise).
* ``("next", "terminated")`` is the core's ``terminated`` (no bootstrap) and
  ``("next", "done")`` is passed as ``truncated`` (the trace stops there; a step
  with both set counts as terminated, so ``done`` needs no masking).
  ``terminated=None`` means ``terminated = done``, as in TorchRL.
* ``next_state_value`` is the core's ``next_values``; ``gamma`` and ``lmbda``
  (floats, 0-d tensors, or per-step tensors such as TorchRL's
  ``gamma ** steps_to_next_obs``) are passed as they are, except that a 0-d CPU
  tensor with data on another device is read as a number, and data of mixed
  dtypes (integer rewards included) is promoted to one floating dtype (TorchRL's
  arithmetic allows both; the core takes one device and one float data dtype per
  call).
* the plain and ``vec_`` forms are the same call: TorchRL's two forms differ in
  how they compute, not in what.

Where TorchRL is used instead (its own function, called with the same arguments):

* ``rolling_gamma=False``: each start step k discounts its whole return with its
  own ``gamma_k``; that is T different recursions, not one linear recurrence.
* a gradient through ``gamma``, ``lmbda`` or V-trace's ``log_pi``, ``log_mu``,
  ``rho_thresh``, ``c_thresh`` (grad mode on and one of them a tensor that
  requires grad): the core's backward passes differentiate the data (rewards,
  values, next values) and hold those inputs constant, TorchRL's arithmetic
  differentiates through them. Gradients to the data alone run in the core.

One input is out of scope on purpose: a step flagged ``terminated`` but not
``done``. TorchRL's environments never produce it (``done = terminated |
truncated``); TorchRL's functions would zero that step's bootstrap but carry the
trace on, while the core treats it as done.

``td0_return_estimate`` and ``td0_advantage_estimate`` (one step, no recursion)
are TorchRL's own, re-exported so that the import swap covers the whole module.
"""

from __future__ import annotations

import functools

import torch

import rl_triton_core as _core
from torchrl.objectives.value import functional as _torchrl_functional
from torchrl.objectives.value.functional import td0_advantage_estimate, td0_return_estimate

__all__ = [
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "td0_advantage_estimate",
    "td0_return_estimate",
    "td1_return_estimate",
    "vec_td1_return_estimate",
    "td1_advantage_estimate",
    "vec_td1_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_td_lambda_return_estimate",
    "td_lambda_advantage_estimate",
    "vec_td_lambda_advantage_estimate",
    "vtrace_advantage_estimate",
]

# The functions below replace these TorchRL functions (``install()`` patches them).
REPLACED = tuple(name for name in __all__ if not name.startswith("td0_"))

SHAPE_ERR = _torchrl_functional.SHAPE_ERR
_TIME_ERR = "The tensor shape and the time dimension are not compatible: got {} and time_dim={}."


def _torchrl_original(name: str):
    """TorchRL's own function ``name``, even while ``install()`` has patched the module."""
    fn = getattr(_torchrl_functional, name)
    while getattr(fn, "_rl_triton_torchrl", False):
        fn = fn.__wrapped__
    return fn


_TORCHRL = {name: _torchrl_original(name) for name in REPLACED}


def _drop_in(fn):
    """Mark ``fn`` as the replacement of TorchRL's function of the same name."""
    original = _TORCHRL[fn.__name__]
    fn.__wrapped__ = original  # the original, as patches keep it (``inspect.unwrap``)
    fn._rl_triton_torchrl = True
    return fn


# ----------------------------------------------------------------- conventions


def _time_axis(time_dim: int, data: torch.Tensor) -> int:
    """The negative time axis of ``data`` under TorchRL's ``_transpose_time`` rule."""
    ndim = data.ndim
    td = time_dim - ndim if time_dim >= 0 else time_dim
    if not -ndim <= td <= -1:
        raise RuntimeError(_TIME_ERR.format(data.shape, td))
    return td


def _same_shape(*tensors) -> None:
    shape = tensors[0].shape
    if any(t.shape != shape for t in tensors[1:]):
        raise RuntimeError(SHAPE_ERR)


def _coefficient(value, device):
    """gamma / lmbda / a threshold on the data's device, as TorchRL's arithmetic allows.

    TorchRL multiplies its data by a 0-d CPU tensor on any device; the core wants one
    device per call. A one-element CPU tensor is read as a number (no copy, no sync).
    """
    if not isinstance(value, torch.Tensor) or value.device == device:
        return value
    if value.numel() == 1 and value.device.type == "cpu":
        return value.item()
    return value.to(device)


def _same_dtype(*tensors):
    """The data in one floating dtype, as TorchRL's arithmetic promotes it (the core takes
    one floating dtype per call): mixed floats promoted, integer or bool data (an integer
    reward) cast to the floating one (the default dtype where none is floating)."""
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    if len(dtypes) <= 1 and all(t.is_floating_point() for t in tensors):
        return tensors
    dtype = functools.reduce(torch.promote_types, dtypes) if dtypes else torch.get_default_dtype()
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in tensors)


def _wants_grad(*inputs) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in inputs
    )


def _core_or_torchrl(core_call, torchrl_call, constants):
    """``core_call()``, or ``torchrl_call()`` where a gradient must reach one of
    ``constants``: the inputs the core's backward holds constant (gamma, lmbda,
    V-trace's log-probabilities and thresholds)."""
    return torchrl_call() if _wants_grad(*constants) else core_call()


def _lambda_returns(gamma, lmbda, next_state_value, reward, done, terminated, time_dim):
    """TorchRL TD(lambda) returns (rolling gamma) as one ``rl_triton_core.lambda_returns``."""
    td = _time_axis(time_dim, next_state_value)
    device = next_state_value.device
    r, nv = _same_dtype(reward, next_state_value)
    # The returns read only V' (``next_values``), never V_t: no ``values`` to pass.
    return _core.lambda_returns(
        r, None, terminated, done, next_values=nv, gamma=_coefficient(gamma, device),
        lmbda=_coefficient(lmbda, device), time_dim=td,
    )


# ------------------------------------------------------------------------- GAE


def _gae(name, gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim):
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, state_value, reward, done, terminated)
    td = _time_axis(time_dim, state_value)
    device = state_value.device

    def core_call():
        r, v, nv = _same_dtype(reward, state_value, next_state_value)
        return _core.gae(
            r, v, terminated, done, next_values=nv, gamma=_coefficient(gamma, device),
            lmbda=_coefficient(lmbda, device), time_dim=td,
        )

    return _core_or_torchrl(
        core_call,
        lambda: _TORCHRL[name](
            gamma, lmbda, state_value, next_state_value, reward, done, terminated,
            time_dim=time_dim,
        ),
        (gamma, lmbda),
    )


@_drop_in
def generalized_advantage_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimate; TorchRL's signature, ``rl_triton_core.gae``'s math.

    ``delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t`` and
    ``A_t = delta_t + gamma lmbda (1 - done_t) A_{t+1}`` (Schulman et al. 2015,
    arXiv:1506.02438), all tensors ``[*B, T, *F]`` with time at ``time_dim``.

    Returns:
        ``(advantage, value_target)`` with ``value_target = advantage + state_value``.
    """
    return _gae("generalized_advantage_estimate", gamma, lmbda, state_value,
                next_state_value, reward, done, terminated, time_dim)


@_drop_in
def vec_generalized_advantage_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as :func:`generalized_advantage_estimate` (no ``[T, T]`` table is built)."""
    return _gae("vec_generalized_advantage_estimate", gamma, lmbda, state_value,
                next_state_value, reward, done, terminated, time_dim)


# ----------------------------------------------------------------------- TD(1)


@_drop_in
def td1_return_estimate(
    gamma: float | torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    *,
    time_dim: int = -2,
) -> torch.Tensor:
    """TD(1) (Monte-Carlo, bootstrapped) returns; ``rl_triton_core.discounted_returns``.

    ``G_t = r_t + gamma_t (1 - terminated_t) [truncated_t V'_t + (1 - done_t) G_{t+1}]``
    with the window end bootstrapping from ``V'_{T-1}``. ``rolling_gamma=False``
    runs TorchRL's own function (see the module docstring).
    """
    if rolling_gamma is not None and not rolling_gamma:
        return _TORCHRL["td1_return_estimate"](
            gamma, next_state_value, reward, done, terminated, rolling_gamma, time_dim=time_dim
        )
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, reward, done, terminated)
    td = _time_axis(time_dim, next_state_value)
    device = next_state_value.device

    def core_call():
        r, nv = _same_dtype(reward, next_state_value)
        return _core.discounted_returns(
            r, terminated, done, next_values=nv, gamma=_coefficient(gamma, device), time_dim=td
        )

    return _core_or_torchrl(
        core_call,
        lambda: _TORCHRL["td1_return_estimate"](
            gamma, next_state_value, reward, done, terminated, rolling_gamma, time_dim=time_dim
        ),
        (gamma,),
    )


@_drop_in
def td1_advantage_estimate(
    gamma: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    time_dim: int = -2,
) -> torch.Tensor:
    """TD(1) advantage: :func:`td1_return_estimate` minus ``state_value``."""
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, state_value, reward, done, terminated)
    returns = td1_return_estimate(
        gamma, next_state_value, reward, done, terminated=terminated,
        rolling_gamma=rolling_gamma, time_dim=time_dim,
    )
    return returns - state_value


@_drop_in
def vec_td1_return_estimate(
    gamma: float | torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    time_dim: int = -2,
) -> torch.Tensor:
    """Vectorized TD(1) returns: :func:`vec_td_lambda_return_estimate` with ``lmbda=1``."""
    return vec_td_lambda_return_estimate(
        gamma, 1.0, next_state_value, reward, done, terminated=terminated,
        rolling_gamma=rolling_gamma, time_dim=time_dim,
    )


@_drop_in
def vec_td1_advantage_estimate(
    gamma: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    time_dim: int = -2,
) -> torch.Tensor:
    """Vectorized TD(1) advantage: :func:`vec_td1_return_estimate` minus ``state_value``."""
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, state_value, reward, done, terminated)
    returns = vec_td1_return_estimate(
        gamma, next_state_value, reward, done, terminated=terminated,
        rolling_gamma=rolling_gamma, time_dim=time_dim,
    )
    return returns - state_value


# ------------------------------------------------------------------ TD(lambda)


def _td_lambda(name, gamma, lmbda, next_state_value, reward, done, terminated, rolling_gamma,
               time_dim):
    if rolling_gamma is not None and not rolling_gamma:
        return _TORCHRL[name](gamma, lmbda, next_state_value, reward, done, terminated,
                              rolling_gamma, time_dim=time_dim)
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, reward, done, terminated)
    return _core_or_torchrl(
        lambda: _lambda_returns(gamma, lmbda, next_state_value, reward, done, terminated,
                                time_dim),
        lambda: _TORCHRL[name](gamma, lmbda, next_state_value, reward, done, terminated,
                               rolling_gamma, time_dim=time_dim),
        (gamma, lmbda),
    )


@_drop_in
def td_lambda_return_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    *,
    time_dim: int = -2,
) -> torch.Tensor:
    """TD(lambda) returns; ``rl_triton_core.lambda_returns``.

    ``G_t = r_t + gamma_t (1 - terminated_t) [(1 - lmbda_t c_t) V'_t + lmbda_t c_t G_{t+1}]``,
    ``c_t = 1 - done_t`` and ``c_{T-1} = 0``. ``rolling_gamma=False`` runs
    TorchRL's own function (see the module docstring).
    """
    return _td_lambda("td_lambda_return_estimate", gamma, lmbda, next_state_value, reward,
                      done, terminated, rolling_gamma, time_dim)


@_drop_in
def vec_td_lambda_return_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    *,
    time_dim: int = -2,
) -> torch.Tensor:
    """Same as :func:`td_lambda_return_estimate` (no ``[T, T]`` table is built)."""
    return _td_lambda("vec_td_lambda_return_estimate", gamma, lmbda, next_state_value, reward,
                      done, terminated, rolling_gamma, time_dim)


@_drop_in
def td_lambda_advantage_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    time_dim: int = -2,
) -> torch.Tensor:
    """TD(lambda) advantage: :func:`td_lambda_return_estimate` minus ``state_value``."""
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, state_value, reward, done, terminated)
    returns = td_lambda_return_estimate(
        gamma, lmbda, next_state_value, reward, done, terminated=terminated,
        rolling_gamma=rolling_gamma, time_dim=time_dim,
    )
    return returns - state_value


@_drop_in
def vec_td_lambda_advantage_estimate(
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rolling_gamma: bool | None = None,
    time_dim: int = -2,
) -> torch.Tensor:
    """Vectorized TD(lambda) advantage: the returns minus ``state_value``."""
    if terminated is None:
        terminated = done
    _same_shape(next_state_value, state_value, reward, done, terminated)
    returns = vec_td_lambda_return_estimate(
        gamma, lmbda, next_state_value, reward, done, terminated=terminated,
        rolling_gamma=rolling_gamma, time_dim=time_dim,
    )
    return returns - state_value


# --------------------------------------------------------------------- V-trace


@_drop_in
def vtrace_advantage_estimate(
    gamma: float | torch.Tensor,
    log_pi: torch.Tensor,
    log_mu: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    rho_thresh: float | torch.Tensor = 1.0,
    c_thresh: float | torch.Tensor = 1.0,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets (Espeholt et al. 2018, arXiv:1802.01561); ``rl_triton_core.vtrace``.

    TorchRL's ``log_pi`` is the log-probability under the policy being learned and
    ``log_mu`` under the behaviour policy: ``log_rhos = log_pi - log_mu``.
    ``rho_thresh`` clips both the TD errors and the policy-gradient advantages
    (the core's ``rho_bar`` and ``pg_rho_bar``), ``c_thresh`` the traces
    (``c_bar``), with ``lmbda = 1``.

    Returns:
        ``(advantage, value_target)``: the policy-gradient advantages and ``vs``.
    """
    _same_shape(next_state_value, state_value, reward, done)

    def torchrl_call():
        return _TORCHRL["vtrace_advantage_estimate"](
            gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated,
            rho_thresh=rho_thresh, c_thresh=c_thresh, time_dim=time_dim,
        )

    td = _time_axis(time_dim, state_value)
    device = state_value.device

    def core_call():
        log_rhos, r, v, nv = _same_dtype(log_pi - log_mu, reward, state_value, next_state_value)
        rho_bar = _coefficient(rho_thresh, device)
        vs, pg_advantage = _core.vtrace(
            log_rhos, r, v, done if terminated is None else terminated, done,
            next_values=nv, gamma=_coefficient(gamma, device), lmbda=1.0,
            rho_bar=rho_bar, c_bar=_coefficient(c_thresh, device), pg_rho_bar=rho_bar,
            time_dim=td,
        )
        return pg_advantage, vs

    return _core_or_torchrl(
        core_call, torchrl_call, (gamma, log_pi, log_mu, rho_thresh, c_thresh)
    )


@functools.cache
def replacements() -> dict:
    """``{name: drop-in}`` for every TorchRL function this module replaces."""
    return {name: globals()[name] for name in REPLACED}
