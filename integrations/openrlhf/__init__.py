"""rl_triton_openrlhf: OpenRLHF's token-level GAE and REINFORCE returns on ``rl_triton_core``.

Same numbers as OpenRLHF 0.11's ``get_advantages_and_returns`` and
``get_cumulative_returns`` (methods of
``openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker``), without the
Python loop over tokens. Two levels of use (``docs/llm.md``):

1. one call in the process that makes experiences (OpenRLHF's ``PPOTrainer`` is a Ray
   actor: patch its process, e.g. with Ray's setup hook)::

       import rl_triton_openrlhf
       rl_triton_openrlhf.install()      # undo with rl_triton_openrlhf.uninstall()

       ray.init(runtime_env={"worker_process_setup_hook": "rl_triton_openrlhf.install"})

2. by hand: :func:`get_advantages_and_returns` ``(values, rewards, action_mask, gamma,
   lambd)`` and :func:`get_cumulative_returns` ``(rewards, action_mask, gamma)``.

``install()`` sets both methods of ``RemoteExperienceMaker`` to these functions (as
static methods), keeps OpenRLHF's for :func:`uninstall`, and leaves a method that is
neither (a subclass's or a user's patch) alone. OpenRLHF is imported only by
``install()`` / ``uninstall()`` / ``is_installed()``.
"""

from __future__ import annotations

import importlib

from rl_triton_openrlhf.functional import get_advantages_and_returns, get_cumulative_returns

__all__ = ["install", "uninstall", "is_installed", "get_advantages_and_returns",
           "get_cumulative_returns", "EXPERIENCE_MAKER"]

EXPERIENCE_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
_METHODS = {"get_advantages_and_returns": get_advantages_and_returns,
            "get_cumulative_returns": get_cumulative_returns}
_ORIGINALS: dict = {}


def _maker_class():
    return importlib.import_module(EXPERIENCE_MAKER).RemoteExperienceMaker


def install() -> None:
    """Make OpenRLHF's experience maker compute GAE and REINFORCE returns on
    ``rl_triton_core``. Harmless twice; undo with :func:`uninstall`."""
    cls = _maker_class()
    for name, ours in _METHODS.items():
        current = cls.__dict__.get(name)
        if current is None:
            continue
        if isinstance(current, staticmethod) and current.__func__ is ours:
            continue
        if name in _ORIGINALS and current is not _ORIGINALS[name]:
            continue  # someone else's patch: left alone
        _ORIGINALS[name] = current
        setattr(cls, name, staticmethod(ours))


def uninstall() -> None:
    """Undo :func:`install`: OpenRLHF's own methods again; harmless twice."""
    cls = _maker_class()
    for name, ours in _METHODS.items():
        current = cls.__dict__.get(name)
        if isinstance(current, staticmethod) and current.__func__ is ours and name in _ORIGINALS:
            setattr(cls, name, _ORIGINALS[name])


def is_installed() -> dict:
    """``{method name: bool}``: which of the two methods are ours now."""
    cls = _maker_class()
    return {name: isinstance(cls.__dict__.get(name), staticmethod)
            and cls.__dict__[name].__func__ is ours for name, ours in _METHODS.items()}


def __dir__():
    return sorted(set(globals()) | set(__all__))
