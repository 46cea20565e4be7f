"""``install()`` / ``uninstall()``: make the core's math TorchRL's default, and undo it.

Two patches, both idempotent and undoable, both importing TorchRL only when called:

* ``estimators``: the value-estimator registry (``torchrl.objectives.utils``) maps
  ``ValueEstimators.GAE``, ``MAGAE``, ``TD1``, ``TDLambda`` and ``VTrace`` to the
  subclasses of :mod:`rl_triton_torchrl.estimators`, with TorchRL's default
  hyper-parameters. Every loss builds its estimator through this registry
  (``loss.make_value_estimator(ValueEstimators.GAE, ...)``, and PPO, A2C,
  REINFORCE, DDPG, SAC, ... by default), so they all get the core.
* ``functional``: the names of TorchRL's GAE, TD(1), TD(lambda) and V-trace
  functions are bound to :mod:`rl_triton_torchrl.functional` in
  ``torchrl.objectives.value.functional`` and in the modules that imported
  them by name (``torchrl.objectives.value.advantages``, and
  ``torchrl.objectives.dreamer_v3`` if loaded). This reaches TorchRL's own
  estimator classes too, including instances built before ``install()``, and
  user code that calls ``torchrl.objectives.value.functional.<name>``.

A registry entry or a name that holds something else than TorchRL's original
(say, a user's own estimator) is left alone. ``uninstall()`` puts back exactly
what ``install()`` replaced; each drop-in keeps the original as ``__wrapped__``.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["install", "uninstall", "is_installed"]

# Modules that hold TorchRL's functional names: always patched / patched if loaded.
_FUNCTIONAL_MODULES = ("torchrl.objectives.value.functional", "torchrl.objectives.value.advantages")
_FUNCTIONAL_IF_LOADED = ("torchrl.objectives.dreamer_v3",)


def _registry():
    import torchrl.objectives.value.advantages  # noqa: F401  (registers TorchRL's estimators)
    from torchrl.objectives import utils

    return utils


def _functional_modules():
    mods = [importlib.import_module(name) for name in _FUNCTIONAL_MODULES]
    mods += [sys.modules[name] for name in _FUNCTIONAL_IF_LOADED if name in sys.modules]
    return mods


def install(*, estimators: bool = True, functional: bool = True) -> None:
    """Make ``rl_triton_core`` run TorchRL's GAE, TD(1), TD(lambda) and V-trace.

    Args:
        estimators: re-register the value-estimator registry entries (what
            losses build) to the Triton subclasses.
        functional: bind TorchRL's functional names to the drop-ins, which also
            reaches TorchRL's own estimator classes.

    Calling it again is harmless. Undo with :func:`uninstall`.
    """
    from rl_triton_torchrl.estimators import REPLACEMENTS
    from rl_triton_torchrl.functional import replacements

    if estimators:
        utils = _registry()
        table = utils._VALUE_ESTIMATOR_REGISTRY
        for key, entry in list(table.items()):
            ours = REPLACEMENTS.get(entry.cls)
            if ours is not None:
                table[key] = utils._ValueEstimatorRegistryEntry(ours, entry.default_kwargs)
    if functional:
        for module in _functional_modules():
            for name, ours in replacements().items():
                if getattr(module, name, None) is ours.__wrapped__:
                    setattr(module, name, ours)


def uninstall() -> None:
    """Undo :func:`install`: TorchRL's own classes and functions again; harmless twice."""
    from rl_triton_torchrl.estimators import REPLACEMENTS
    from rl_triton_torchrl.functional import replacements

    originals = {ours: torchrl_cls for torchrl_cls, ours in REPLACEMENTS.items()}
    utils = _registry()
    table = utils._VALUE_ESTIMATOR_REGISTRY
    for key, entry in list(table.items()):
        original = originals.get(entry.cls)
        if original is not None:
            table[key] = utils._ValueEstimatorRegistryEntry(original, entry.default_kwargs)
    for module in _functional_modules():
        for name, ours in replacements().items():
            if getattr(module, name, None) is ours:
                setattr(module, name, ours.__wrapped__)


def is_installed() -> dict:
    """What is patched now: ``{"estimators": bool, "functional": bool}`` (all entries / names)."""
    from rl_triton_torchrl.estimators import REPLACEMENTS
    from rl_triton_torchrl.functional import replacements

    ours = set(REPLACEMENTS.values())
    classes = [entry.cls for entry in _registry()._VALUE_ESTIMATOR_REGISTRY.values()]
    relevant = [cls for cls in classes if cls in ours or cls in REPLACEMENTS]
    functional = importlib.import_module(_FUNCTIONAL_MODULES[0])
    return {
        "estimators": bool(relevant) and all(cls in ours for cls in relevant),
        "functional": all(getattr(functional, name) is fn for name, fn in replacements().items()),
    }
