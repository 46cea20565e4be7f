"""``install()`` / ``uninstall()``: verl's advantage estimators on ``rl_triton_core``, and back.

verl's trainer reaches an estimator two ways (``verl/trainer/ppo/ray_trainer.py``,
``compute_advantage``): GAE and GRPO by module attribute
(``core_algos.compute_gae_advantage_return(...)``,
``core_algos.compute_grpo_outcome_advantage(...)``), every other one through
``core_algos.get_adv_estimator_fn(name)``, i.e. the ``ADV_ESTIMATOR_REGISTRY`` dict.
``install()`` replaces both: the registry entries
``gae``, ``reinforce_plus_plus``, ``grpo``, ``grpo_vectorized``, ``rloo`` and
``rloo_vectorized`` (set directly: ``register_adv_est`` refuses a second registration),
and the module attributes of the same functions. An entry or attribute that holds
something other than verl's original (a user's own estimator, set before or after the
first ``install()``) is left alone: verl's original is recognised by what it is, the
function that ``core_algos``'s source defines under that name, not by what the attribute
held when ``install()`` first ran. ``uninstall()`` puts back exactly what ``install()``
replaced. Both are idempotent and import verl only when called.

verl runs its trainer in a Ray actor (the ``TaskRunner``): patch that process, e.g. with
Ray's setup hook on verl's command line::

    +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rl_triton_verl.install
"""

from __future__ import annotations

import importlib

__all__ = ["install", "uninstall", "is_installed"]

_ORIGINALS: dict = {}  # function name -> verl's original function


def _core_algos():
    return importlib.import_module("verl.trainer.ppo.core_algos")


def _is_verls(fn, ca, name: str) -> bool:
    """``fn`` is verl's own ``name``: a function defined in ``core_algos``'s source (its
    globals are that module's namespace) under that name. A user's replacement is not,
    even a ``functools.wraps`` wrapper that copies verl's name, qualname and module."""
    return (getattr(fn, "__globals__", None) is vars(ca)
            and getattr(fn, "__qualname__", None) == name)


def _ours():
    from rl_triton_verl import core_algos as ours

    return {name: getattr(ours, name) for name in ours.REGISTRY_NAMES.values()}


def install() -> None:
    """Make verl's GAE, REINFORCE++, GRPO (and Dr. GRPO) and RLOO estimators, loop and
    vectorised forms, run on ``rl_triton_core``. Harmless twice; undo with :func:`uninstall`."""
    from rl_triton_verl.core_algos import REGISTRY_NAMES

    ca = _core_algos()
    ours = _ours()
    registry = ca.ADV_ESTIMATOR_REGISTRY
    for key, name in REGISTRY_NAMES.items():
        attribute, entry = getattr(ca, name, None), registry.get(key)
        verls = [fn for fn in (attribute, entry) if _is_verls(fn, ca, name)]
        if not verls:  # ours already, or a user's in both places
            continue
        _ORIGINALS[name] = verls[0]
        if _is_verls(entry, ca, name):
            registry[key] = ours[name]
        if _is_verls(attribute, ca, name):
            setattr(ca, name, ours[name])


def uninstall() -> None:
    """Undo :func:`install`: verl's own functions again; harmless twice."""
    from rl_triton_verl.core_algos import REGISTRY_NAMES

    ca = _core_algos()
    ours = _ours()
    for key, name in REGISTRY_NAMES.items():
        original = _ORIGINALS.get(name)
        if original is None:
            continue
        if ca.ADV_ESTIMATOR_REGISTRY.get(key) is ours[name]:
            ca.ADV_ESTIMATOR_REGISTRY[key] = original
        if getattr(ca, name, None) is ours[name]:
            setattr(ca, name, original)


def is_installed() -> dict:
    """What is patched now: ``{registry key: bool}`` (the registry entry and the module
    attribute both ours)."""
    from rl_triton_verl.core_algos import REGISTRY_NAMES

    ca = _core_algos()
    ours = _ours()
    return {key: ca.ADV_ESTIMATOR_REGISTRY.get(key) is ours[name]
            and getattr(ca, name, None) is ours[name] for key, name in REGISTRY_NAMES.items()}
