"""rl_triton_rllib: RLlib 2.60 credit assignment on the ``rl_triton_core`` kernels.

Three levels of use (see ``docs/rllib.md``):

1. one line, for PPO, IMPALA and APPO::

       import rl_triton_rllib
       config = rl_triton_rllib.enable(config)          # before config.build_algo()

   sets the learner class (``TritonPPOTorchLearner``, ``TritonIMPALATorchLearner``,
   ``TritonAPPOTorchLearner``, or the matching mixin over a custom learner class) and
   the ``learner_config_dict["rl_triton"]`` entry, so the choice travels with the
   config to remote learners;
2. one object at a time: the learner classes, or the mixins
   (``TritonGAEMixin``, ``TritonVTraceMixin``) for a learner class of your own, or
   the connector piece ``TritonGeneralAdvantageEstimation`` in a pipeline you build;
3. by hand: ``compute_value_targets`` and ``vtrace_torch``, with the signatures of
   RLlib's functions of the same names.

The adapter holds no estimator math: it maps RLlib's containers onto one call of the
core's public ``gae`` / ``vtrace`` and back. Ray is imported only when one of the
RLlib-facing names is first used.
"""

from __future__ import annotations

import importlib

from rl_triton_rllib._options import LEARNER_CONFIG_KEY, RLTritonOptions

__all__ = [
    "enable",
    "disable",
    "is_enabled",
    "RLTritonOptions",
    "LEARNER_CONFIG_KEY",
    "compute_value_targets",
    "vtrace_torch",
    "TritonGeneralAdvantageEstimation",
    "TritonGAEMixin",
    "TritonPPOTorchLearner",
    "TritonVTraceMixin",
    "TritonIMPALATorchLearner",
    "TritonAPPOTorchLearner",
    "swap_gae_connector",
    "restore_gae_connector",
    "patch_vtrace",
    "unpatch_vtrace",
]

# Public name -> submodule that defines it (imported on first use: it imports Ray).
_LAZY = {
    "enable": "rl_triton_rllib.config",
    "disable": "rl_triton_rllib.config",
    "is_enabled": "rl_triton_rllib.config",
    "compute_value_targets": "rl_triton_rllib.functional",
    "vtrace_torch": "rl_triton_rllib.functional",
    "TritonGeneralAdvantageEstimation": "rl_triton_rllib.ppo",
    "TritonGAEMixin": "rl_triton_rllib.ppo",
    "TritonPPOTorchLearner": "rl_triton_rllib.ppo",
    "swap_gae_connector": "rl_triton_rllib.ppo",
    "restore_gae_connector": "rl_triton_rllib.ppo",
    "TritonVTraceMixin": "rl_triton_rllib.impala",
    "TritonIMPALATorchLearner": "rl_triton_rllib.impala",
    "TritonAPPOTorchLearner": "rl_triton_rllib.impala",
    "patch_vtrace": "rl_triton_rllib.impala",
    "unpatch_vtrace": "rl_triton_rllib.impala",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rl_triton_rllib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
