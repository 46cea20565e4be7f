"""rl_triton_verl: verl's token-level and group advantage estimators on ``rl_triton_core``.

Same numbers as verl 0.9.1's ``verl.trainer.ppo.core_algos`` (GAE, REINFORCE++, GRPO,
Dr. GRPO, RLOO and the vectorised GRPO / RLOO), without a Python loop over tokens or
groups. Two levels of use (``docs/llm.md``):

1. everywhere, one call in the process that runs verl's trainer::

       import rl_triton_verl
       rl_triton_verl.install()          # undo with rl_triton_verl.uninstall()

   or, on verl's command line (its trainer runs in a Ray actor)::

       +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=rl_triton_verl.install

2. by hand: the drop-ins with verl's names and signatures,
   ``from rl_triton_verl.core_algos import compute_gae_advantage_return``.

The adapter holds no math: :mod:`rl_triton_verl.core_algos` says how verl's conventions
map onto the core's ``masked_gae`` / ``masked_returns`` / ``masked_whiten`` /
``group_advantages``. verl is imported only by ``install()`` / ``uninstall()`` /
``is_installed()``, not by ``import rl_triton_verl``.
"""

from __future__ import annotations

import importlib

from rl_triton_verl._install import install, is_installed, uninstall

_FUNCTIONS = (
    "compute_gae_advantage_return",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
)

__all__ = ["install", "uninstall", "is_installed", *_FUNCTIONS]


def __getattr__(name: str):
    if name in _FUNCTIONS or name == "core_algos":
        module = importlib.import_module("rl_triton_verl.core_algos")
        value = module if name == "core_algos" else getattr(module, name)
    else:
        raise AttributeError(f"module 'rl_triton_verl' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
