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


# What enable supports, for the messages of its refusals.
_SUPPORTED = (
    "PPO (GAE: PPOConfig), IMPALA and APPO (V-trace: IMPALAConfig, APPOConfig), with "
    "framework='torch', or a config whose learner class derives from PPOTorchLearner, "
    "IMPALATorchLearner or APPOTorchLearner"
)


def _type_name(obj) -> str:
    klass = type(obj)
    if klass.__module__ == "builtins":
        return klass.__qualname__
    return f"{klass.__module__}.{klass.__qualname__}"


def _check_config(config, caller: str = "enable") -> None:
    """Refuse anything that is not an RLlib AlgorithmConfig instance, naming what it got."""
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    if isinstance(config, AlgorithmConfig):
        return
    wants = (
        f"rl_triton_rllib.{caller}(config) takes an RLlib AlgorithmConfig, such as "
        "PPOConfig(), IMPALAConfig() or APPOConfig() with framework='torch'"
    )
    if isinstance(config, type) and issubclass(config, AlgorithmConfig):
        hint = f"; got the class {config.__qualname__} itself: call it, {config.__qualname__}()"
    elif isinstance(config, Algorithm):
        hint = (f"; got a built algorithm ({_type_name(config)}): call enable on its config "
                "before build_algo()")
    elif isinstance(config, dict):
        hint = (f"; got a dict (keys {sorted(map(str, config))[:6]}): turn it into a config "
                "first, e.g. PPOConfig.from_dict(d) or PPOConfig().environment(...)")
    else:
        hint = f"; got {_type_name(config)} ({config!r:.80})"
    raise TypeError(wants + hint)


def _algo_name(config) -> str:
    algo = getattr(config, "algo_class", None)
    if isinstance(algo, type):
        return algo.__name__
    if isinstance(algo, str):
        return algo
    return type(config).__name__


def _learner_class_of(config) -> type:
    try:
        learner_class = _resolve(config.learner_class)
    except NotImplementedError:
        raise ValueError(
            f"rl_triton_rllib.enable: {type(config).__name__} names no algorithm (it has no "
            f"default learner class); supported: {_SUPPORTED}"
        ) from None
    if not isinstance(learner_class, type):
        raise TypeError(
            "rl_triton_rllib.enable: the config's learner_class must be a class, got "
            f"{_type_name(learner_class)}; supported: {_SUPPORTED}"
        )
    return learner_class


def _triton_learner_class(base: type, algo: str = "this algorithm") -> type:
    """The learner class with the right mixin over ``base`` (``base`` if it has one).

    Raises ValueError for a learner that is not a torch learner of PPO (GAE) or of
    IMPALA / APPO (V-trace): the switch would change nothing there.
    """
    from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
    from ray.rllib.algorithms.impala.impala_learner import IMPALALearner
    from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner
    from ray.rllib.algorithms.ppo.ppo_learner import PPOLearner
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner
    from rl_triton_rllib.impala import TritonAPPOTorchLearner, TritonIMPALATorchLearner
    from rl_triton_rllib.ppo import TritonPPOTorchLearner

    gae_mixin, vtrace_mixin = _mixins()
    if issubclass(base, (gae_mixin, vtrace_mixin)):
        return base  # already switched (by enable, or a class the user built on a mixin)
    name = f"{base.__module__}.{base.__qualname__}"
    if not issubclass(base, TorchLearner):
        raise ValueError(
            f"rl_triton_rllib.enable: the learner class must be a torch learner "
            f"(TorchLearner subclass), got {name}; supported: {_SUPPORTED}"
        )
    if not issubclass(base, (PPOLearner, IMPALALearner)):
        raise ValueError(
            f"rl_triton_rllib.enable: {algo} is not supported: its learner class {name} "
            f"uses neither GAE (PPO) nor V-trace (IMPALA, APPO), so there is nothing to run "
            f"on the rl_triton_core kernels. Supported: {_SUPPORTED}. For another learner "
            "whose connector holds RLlib's GeneralAdvantageEstimation piece, put "
            "rl_triton_rllib.TritonGAEMixin first among its bases and set that class with "
            "config.learners(learner_class=...)"
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
        config: an RLlib ``AlgorithmConfig`` instance (torch framework, new API stack)
            of PPO, IMPALA or APPO, or one whose learner class derives from their torch
            learners.
        gae: swap the ``GeneralAdvantageEstimation`` learner connector piece (PPO).
        vtrace: swap ``vtrace_torch`` in the IMPALA / APPO loss.
        fix_truncation: IMPALA / APPO: bootstrap truncated and cut chunk ends from
            V(s_{t+1}) instead of reproducing RLlib's cancelled bootstrap.
        synchronize: sync the device after the GAE connector, so that RLlib's
            connector timer measures the work (for benchmarks on CUDA).

    Returns:
        ``config`` itself, changed in place (for chaining).

    Raises:
        TypeError: ``config`` is not an ``AlgorithmConfig`` instance (a dict, the
            class itself, a built ``Algorithm``, ...); the message names what it got.
        ValueError: the framework is not torch, the config is on RLlib's old API stack,
            or the algorithm has neither GAE nor V-trace (DQN, SAC, ...); the message
            names the supported algorithms.
    """
    _check_config(config)
    options = RLTritonOptions(gae=gae, vtrace=vtrace, fix_truncation=fix_truncation,
                              synchronize=synchronize)
    framework = getattr(config, "framework_str", None)
    if framework != "torch":
        raise ValueError(
            f"rl_triton_rllib.enable: needs framework='torch', got framework={framework!r} "
            f"(call config.framework('torch')); supported: {_SUPPORTED}")
    if not getattr(config, "enable_rl_module_and_learner", True):
        raise ValueError(
            "rl_triton_rllib.enable: needs RLlib's new API stack (RLModule and Learner); "
            f"this {type(config).__name__} has enable_rl_module_and_learner=False, where "
            "the learner class, and so the switch, would not be used. Call "
            "config.api_stack(enable_rl_module_and_learner=True, "
            "enable_env_runner_and_connector_v2=True)"
        )
    learner_class = _triton_learner_class(_learner_class_of(config), _algo_name(config))
    config.learners(
        learner_class=learner_class,
        learner_config_dict={LEARNER_CONFIG_KEY: options.to_dict()},
    )
    return config


def is_enabled(config) -> bool:
    """Whether ``config``'s learner class carries an rl_triton mixin."""
    _check_config(config, "is_enabled")
    learner_class = _resolve(config.learner_class)
    return isinstance(learner_class, type) and issubclass(learner_class, _mixins())


def disable(config):
    """Undo :func:`enable`: RLlib's learner class (the default one as ``None``) and no
    ``learner_config_dict["rl_triton"]`` entry. Returns ``config``."""
    _check_config(config, "disable")
    learner_class = _resolve(config.learner_class)
    if isinstance(learner_class, type) and issubclass(learner_class, _mixins()):
        base = _base_of(learner_class)
        default = _resolve(config.get_default_learner_class())
        config.learners(learner_class=None if base is default else base)
    config.learner_config_dict.pop(LEARNER_CONFIG_KEY, None)
    return config
