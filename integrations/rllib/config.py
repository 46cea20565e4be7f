"""The one-line switch: ``config = rl_triton_rllib.enable(config)``."""

from __future__ import annotations

import logging

from rl_triton_rllib._options import LEARNER_CONFIG_KEY, RLTritonOptions

logger = logging.getLogger(__name__)

__all__ = ["enable", "disable", "is_enabled"]

# Mixin subclasses made for custom learner classes, one per base (enable is idempotent).
_DERIVED: dict[type, type] = {}


def _resolve(learner_class):
    if isinstance(learner_class, str):
        from ray.rllib.utils.serialization import deserialize_type

        learner_class = deserialize_type(learner_class, error=True)
    return learner_class


def _mixins():
    from rl_triton_rllib.impala import TritonVTraceMixin
    from rl_triton_rllib.ppo import TritonGAEMixin

    return TritonGAEMixin, TritonVTraceMixin


def _triton_learner_class(base: type) -> type:
    """The learner class with the right mixin over ``base`` (``base`` if it has one)."""
    from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
    from ray.rllib.algorithms.impala.impala_learner import IMPALALearner
    from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner
    from rl_triton_rllib.impala import TritonAPPOTorchLearner, TritonIMPALATorchLearner
    from rl_triton_rllib.ppo import TritonPPOTorchLearner

    gae_mixin, vtrace_mixin = _mixins()
    if issubclass(base, (gae_mixin, vtrace_mixin)):
        return base
    if not issubclass(base, TorchLearner):
        raise ValueError(
            f"rl_triton_rllib.enable: the learner class must be a torch learner "
            f"(TorchLearner subclass), got {base.__module__}.{base.__qualname__}"
        )
    named = {
        PPOTorchLearner: TritonPPOTorchLearner,
        IMPALATorchLearner: TritonIMPALATorchLearner,
        APPOTorchLearner: TritonAPPOTorchLearner,
    }
    if base in named:
        return named[base]
    if base not in _DERIVED:
        mixin = vtrace_mixin if issubclass(base, IMPALALearner) else gae_mixin
        _DERIVED[base] = type(
            f"Triton{base.__name__}", (mixin, base),
            {"__module__": base.__module__,
             "__doc__": f"{base.__qualname__} with {mixin.__name__} (rl_triton_rllib)."},
        )
        logger.info("rl_triton: using %s over the custom learner class %s",
                    mixin.__name__, base.__qualname__)
    return _DERIVED[base]


def _base_of(learner_class: type) -> type:
    """The class under the rl_triton mixin (for :func:`disable`)."""
    mixins = _mixins()
    for klass in learner_class.__mro__[1:]:
        if klass not in mixins and not issubclass(klass, mixins):
            return klass
    raise AssertionError("unreachable: a learner class always has a non-mixin base")


def enable(config, *, gae: bool = True, vtrace: bool = True, fix_truncation: bool = False,
           synchronize: bool = False):
    """Run the config's credit assignment on the ``rl_triton_core`` kernels.

    Call before building the algorithm. Sets the learner class to the Triton one for
    the config's current learner class (PPO: ``TritonPPOTorchLearner``; IMPALA:
    ``TritonIMPALATorchLearner``; APPO: ``TritonAPPOTorchLearner``; a custom class:
    that class under the matching mixin) and writes the options to
    ``config.learner_config_dict["rl_triton"]``, which every local and remote learner
    reads in ``build()``. Idempotent: a second call only updates the options.

    Args:
        config: an RLlib ``AlgorithmConfig`` (torch framework, new API stack).
        gae: swap the ``GeneralAdvantageEstimation`` learner connector piece (PPO).
        vtrace: swap ``vtrace_torch`` in the IMPALA / APPO loss.
        fix_truncation: IMPALA / APPO: bootstrap truncated and cut chunk ends from
            V(s_{t+1}) instead of reproducing RLlib's cancelled bootstrap.
        synchronize: sync the device after the GAE connector, so that RLlib's
            connector timer measures the work (for benchmarks on CUDA).

    Returns:
        ``config`` itself, changed in place (for chaining).
    """
    options = RLTritonOptions(gae=gae, vtrace=vtrace, fix_truncation=fix_truncation,
                              synchronize=synchronize)
    framework = getattr(config, "framework_str", None)
    if framework != "torch":
        raise ValueError(
            f"rl_triton_rllib.enable: needs framework='torch', got framework={framework!r}")
    learner_class = _triton_learner_class(_resolve(config.learner_class))
    config.learners(
        learner_class=learner_class,
        learner_config_dict={LEARNER_CONFIG_KEY: options.to_dict()},
    )
    return config


def is_enabled(config) -> bool:
    """Whether ``config``'s learner class carries an rl_triton mixin."""
    learner_class = _resolve(config.learner_class)
    return isinstance(learner_class, type) and issubclass(learner_class, _mixins())


def disable(config):
    """Undo :func:`enable`: RLlib's learner class (the default one as ``None``) and no
    ``learner_config_dict["rl_triton"]`` entry. Returns ``config``."""
    learner_class = _resolve(config.learner_class)
    if isinstance(learner_class, type) and issubclass(learner_class, _mixins()):
        base = _base_of(learner_class)
        default = _resolve(config.get_default_learner_class())
        config.learners(learner_class=None if base is default else base)
    config.learner_config_dict.pop(LEARNER_CONFIG_KEY, None)
    return config
