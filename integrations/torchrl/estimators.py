"""TorchRL's value estimators with their recursion run by ``rl_triton_core``.

Each class subclasses TorchRL's own (``GAE``, ``MultiAgentGAE``,
``TD1Estimator``, ``TDLambdaEstimator``, ``VTrace``) and keeps all of its code:
the value-network calls (vmap, ``params`` / ``target_params``, chunking,
``shifted``), ``time_dim`` resolution, ``set_keys``, ``average_gae`` and
``average_rewards``, ``skip_existing``, ``auto_reset_env``, the
``steps_to_next_obs`` gamma, ``differentiable``, the registry hook ``for_loss``.

Only the math changes. The methods that call TorchRL's functional
(``forward`` / ``value_estimate``) are TorchRL's very functions, rebuilt with
their functional names (``vec_generalized_advantage_estimate`` and the like)
resolved to :mod:`rl_triton_torchrl.functional`: the same code object, other
globals. No TorchRL source is copied here and TorchRL's modules are not
touched; each rebuilt method is checked at import to call the functions it is
meant to replace. If the installed TorchRL does not have the structure this
relies on, the class keeps TorchRL's math and warns once, saying why.

Use one estimator::

    from rl_triton_torchrl import GAE            # instead of torchrl.objectives.value.GAE
    adv = GAE(gamma=0.99, lmbda=0.95, value_network=critic)

or give one to a loss::

    loss.make_value_estimator(rl_triton_torchrl.GAE, gamma=0.99, lmbda=0.95,
                              value_network=critic)
"""

from __future__ import annotations

import copy
import functools
import types
import warnings

from rl_triton_torchrl import functional as _functional
from tensordict.nn import dispatch

from torchrl.objectives.value import advantages as _advantages

__all__ = [
    "TritonGAE",
    "TritonMultiAgentGAE",
    "TritonTD1Estimator",
    "TritonTDLambdaEstimator",
    "TritonVTrace",
]


def _with_core_math(method, *, replaces: tuple[str, ...], decorators=()):
    """TorchRL's ``method`` with the functional names in ``replaces`` bound to ours.

    ``method`` may be decorated (``forward`` is wrapped by TorchRL in
    ``_self_set_skip_existing``, ``_self_set_grad_enabled`` and ``dispatch``):
    the innermost function is rebuilt and ``decorators`` (outermost first) are
    applied again. Returns ``(new_method, None)`` or ``(method, reason)`` when
    the method does not have the expected structure.
    """
    chain = [method]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    fn = chain[-1]
    code = getattr(fn, "__code__", None)
    if code is None:
        return method, f"{method.__qualname__} is not a plain Python function"
    missing = [name for name in replaces if name not in code.co_names]
    if missing:
        return method, f"{fn.__qualname__} no longer calls {', '.join(missing)}"
    if len(chain) != len(decorators) + 1:
        return method, (
            f"{fn.__qualname__} has {len(chain) - 1} decorators, {len(decorators)} expected"
        )
    if code.co_freevars:
        return method, f"{fn.__qualname__} is a closure"
    namespace = dict(fn.__globals__)
    namespace.update({name: getattr(_functional, name) for name in replaces})
    new = types.FunctionType(code, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = copy.copy(fn.__kwdefaults__)
    functools.update_wrapper(new, fn)  # name, doc, annotations; __wrapped__ = TorchRL's
    for decorate in reversed(decorators):
        new = decorate(new)
    return new, None


_FORWARD_DECORATORS = tuple(
    getattr(_advantages, name, None)
    for name in ("_self_set_skip_existing", "_self_set_grad_enabled")
) + (dispatch,)


def _rebuild(cls, methods: dict) -> tuple:
    """The rebuilt ``methods`` of ``cls``, in order; TorchRL's own with a warning on failure.

    ``methods`` maps a method name to ``(functional names it calls, decorated)``.
    """
    rebuilt = []
    for attr, (replaces, decorated) in methods.items():
        decorators = _FORWARD_DECORATORS if decorated else ()
        if None in decorators:
            reason = "torchrl.objectives.value.advantages lacks its forward decorators"
        else:
            new, reason = _with_core_math(
                getattr(cls, attr), replaces=replaces, decorators=decorators
            )
            rebuilt.append(new)
        if reason is not None:
            warnings.warn(
                f"rl_triton_torchrl: {cls.__name__} keeps TorchRL's own math ({reason}); "
                "this adapter was written against torchrl 0.14",
                RuntimeWarning,
                stacklevel=2,
            )
            return tuple(getattr(cls, attr) for attr in methods)
    return tuple(rebuilt)


_GAE_METHODS = {
    "forward": (("vec_generalized_advantage_estimate", "generalized_advantage_estimate"), True),
    "value_estimate": (("vec_generalized_advantage_estimate",), False),
}


class TritonGAE(_advantages.GAE):
    """:class:`torchrl.objectives.value.GAE` with the recursion in ``rl_triton_core.gae``.

    Same constructor, keys, options and outputs as TorchRL's ``GAE``; see
    :mod:`rl_triton_torchrl.estimators`. ``vectorized`` no longer matters: both
    of TorchRL's paths run the same core call.
    """

    forward, value_estimate = _rebuild(_advantages.GAE, _GAE_METHODS)


class TritonMultiAgentGAE(_advantages.MultiAgentGAE):
    """:class:`torchrl.objectives.value.MultiAgentGAE` with the recursion in ``rl_triton_core.gae``.

    TorchRL broadcasts the team's reward and flags over the agent axis (a view:
    the core reads it with a zero stride, nothing is copied).
    """

    forward, value_estimate = _rebuild(_advantages.MultiAgentGAE, _GAE_METHODS)


class TritonTD1Estimator(_advantages.TD1Estimator):
    """:class:`torchrl.objectives.value.TD1Estimator` with ``rl_triton_core.lambda_returns``."""

    (value_estimate,) = _rebuild(
        _advantages.TD1Estimator, {"value_estimate": (("vec_td1_return_estimate",), False)}
    )


class TritonTDLambdaEstimator(_advantages.TDLambdaEstimator):
    """TorchRL's ``TDLambdaEstimator`` with the recursion in ``rl_triton_core.lambda_returns``."""

    (value_estimate,) = _rebuild(
        _advantages.TDLambdaEstimator,
        {
            "value_estimate": (
                ("vec_td_lambda_return_estimate", "td_lambda_return_estimate"),
                False,
            )
        },
    )


class TritonVTrace(_advantages.VTrace):
    """:class:`torchrl.objectives.value.VTrace` with the recursion in ``rl_triton_core.vtrace``."""

    (forward,) = _rebuild(
        _advantages.VTrace, {"forward": (("vtrace_advantage_estimate",), True)}
    )


#: TorchRL's class -> ours, as ``install()`` puts them in the value-estimator registry.
REPLACEMENTS = {
    _advantages.GAE: TritonGAE,
    _advantages.MultiAgentGAE: TritonMultiAgentGAE,
    _advantages.TD1Estimator: TritonTD1Estimator,
    _advantages.TDLambdaEstimator: TritonTDLambdaEstimator,
    _advantages.VTrace: TritonVTrace,
}
