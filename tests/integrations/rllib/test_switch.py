"""The switch: enable/disable, swapping pieces, patches, options (no Ray instance)."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest
import rl_triton_rllib
import torch
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.impala import IMPALAConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner import GeneralAdvantageEstimation
from rl_triton_rllib import impala as triton_impala


def gae_pieces(learner):
    return [p for p in learner._learner_connector.connectors
            if isinstance(p, GeneralAdvantageEstimation)]


def test_import_is_lazy():
    import subprocess
    import sys

    code = ("import sys, rl_triton_rllib; "
            "assert 'ray' not in sys.modules, 'ray imported eagerly'; "
            "rl_triton_rllib.RLTritonOptions(); "
            "assert 'ray' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("config_cls,expected", [
    (PPOConfig, "TritonPPOTorchLearner"),
    (IMPALAConfig, "TritonIMPALATorchLearner"),
    (APPOConfig, "TritonAPPOTorchLearner"),
])
def test_enable_sets_learner_class_and_options(config_cls, expected):
    config = config_cls()
    assert not rl_triton_rllib.is_enabled(config)
    out = rl_triton_rllib.enable(config, fix_truncation=True)
    assert out is config
    assert config.learner_class is getattr(rl_triton_rllib, expected)
    entry = config.learner_config_dict[rl_triton_rllib.LEARNER_CONFIG_KEY]
    assert entry == {"gae": True, "vtrace": True, "fix_truncation": True,
                     "synchronize": False}
    # idempotent; a second call only changes the options
    rl_triton_rllib.enable(config, gae=False)
    assert config.learner_class is getattr(rl_triton_rllib, expected)
    assert config.learner_config_dict["rl_triton"]["gae"] is False
    # the choice travels with the config (what remote learners receive)
    clone = pickle.loads(pickle.dumps(config))
    assert clone.learner_class is config.learner_class
    assert clone.learner_config_dict["rl_triton"]["gae"] is False
    rl_triton_rllib.disable(config)
    assert config._learner_class is None and "rl_triton" not in config.learner_config_dict
    assert not rl_triton_rllib.is_enabled(config)


def test_enable_over_custom_learner_class():
    class MyPPOLearner(PPOTorchLearner):
        pass

    config = PPOConfig().learners(learner_class=MyPPOLearner)
    rl_triton_rllib.enable(config)
    cls = config.learner_class
    assert issubclass(cls, MyPPOLearner) and issubclass(cls, rl_triton_rllib.TritonGAEMixin)
    rl_triton_rllib.enable(config)
    assert config.learner_class is cls
    rl_triton_rllib.disable(config)
    assert config.learner_class is MyPPOLearner


def test_bad_options():
    with pytest.raises(TypeError, match="fix_truncation"):
        rl_triton_rllib.enable(PPOConfig(), fix_truncation="yes")
    config = PPOConfig().learners(learner_config_dict={"rl_triton": {"gea": True}})
    with pytest.raises(ValueError, match="gea"):
        rl_triton_rllib.RLTritonOptions.from_config(config)
    with pytest.raises(ValueError, match="torch"):
        rl_triton_rllib.enable(PPOConfig().framework("tf2"))


@pytest.fixture(scope="module")
def env():
    return gym.make("CartPole-v1")


def test_learner_swaps_and_restores(env):
    config = rl_triton_rllib.enable(PPOConfig().environment("CartPole-v1"))
    learner = config.build_learner(env=env)
    (piece,) = gae_pieces(learner)
    assert isinstance(piece, rl_triton_rllib.TritonGeneralAdvantageEstimation)
    assert type(piece.__wrapped__) is GeneralAdvantageEstimation
    assert (piece.gamma, piece.lambda_) == (config.gamma, config.lambda_)
    assert "rl_triton" in str(piece)
    pipeline = learner._learner_connector
    assert rl_triton_rllib.swap_gae_connector(pipeline) == 0  # idempotent
    assert rl_triton_rllib.restore_gae_connector(pipeline) == 1
    (stock,) = gae_pieces(learner)
    assert type(stock) is GeneralAdvantageEstimation
    assert rl_triton_rllib.swap_gae_connector(pipeline) == 1
    # picklable (checkpoints, remote copies)
    clone = pickle.loads(pickle.dumps(gae_pieces(learner)[0]))
    assert isinstance(clone, rl_triton_rllib.TritonGeneralAdvantageEstimation)


def test_gae_option_off_keeps_stock_piece(env):
    config = rl_triton_rllib.enable(PPOConfig().environment("CartPole-v1"), gae=False)
    (piece,) = gae_pieces(config.build_learner(env=env))
    assert type(piece) is GeneralAdvantageEstimation


def test_survives_remove_of_gae(env, caplog):
    """RLlib (BC, IQL) and users drop the piece by name: before the swap (nothing to
    swap, no error) and after it (the Triton piece answers to the same name)."""

    class RemovingLearner(PPOTorchLearner):
        def build(self):
            super().build()
            self._learner_connector.remove("GeneralAdvantageEstimation")

    config = PPOConfig().environment("CartPole-v1").learners(learner_class=RemovingLearner)
    rl_triton_rllib.enable(config)
    with caplog.at_level("INFO", logger="rl_triton_rllib.ppo"):
        learner = config.build_learner(env=env)
    assert gae_pieces(learner) == []
    assert "nothing to swap" in caplog.text

    learner = rl_triton_rllib.enable(PPOConfig().environment("CartPole-v1")).build_learner(
        env=env)
    pipeline = learner._learner_connector
    n = len(pipeline.connectors)
    pipeline.remove("GeneralAdvantageEstimation")
    assert len(pipeline.connectors) == n - 1 and gae_pieces(learner) == []


def test_vtrace_patch_is_idempotent_and_undoable():
    from ray.rllib.algorithms.appo.torch import appo_torch_learner
    from ray.rllib.algorithms.impala.torch import impala_torch_learner, vtrace_torch_v2

    original = vtrace_torch_v2.vtrace_torch
    try:
        triton_impala.patch_vtrace()
        first = impala_torch_learner.vtrace_torch
        triton_impala.patch_vtrace()
        assert impala_torch_learner.vtrace_torch is first
        assert first.__wrapped__ is original
        assert appo_torch_learner.vtrace_torch.__wrapped__ is original
        # outside a Triton learner's loss the dispatcher is RLlib's function
        T, B = 5, 2
        kwargs = dict(target_action_log_probs=torch.zeros(T, B),
                      behaviour_action_log_probs=torch.zeros(T, B),
                      discounts=torch.full((T, B), 0.9), rewards=torch.ones(T, B),
                      values=torch.zeros(T, B), bootstrap_values=torch.zeros(B))
        for got, expected in zip(first(**kwargs), original(**kwargs), strict=True):
            torch.testing.assert_close(got, expected)
    finally:
        triton_impala.unpatch_vtrace()
    assert impala_torch_learner.vtrace_torch is original
    assert appo_torch_learner.vtrace_torch is original


# ------------------------------------------------------------------ clear refusals


@pytest.mark.parametrize("bad,named", [
    ({"env": "CartPole-v1"}, "got a dict"),
    (PPOConfig, "got the class PPOConfig itself"),
    ("PPO", "got str"),
    (None, "got NoneType"),
])
def test_enable_refuses_what_is_not_a_config(bad, named):
    """A dict (RLlib's old config style), the class, a name: a TypeError that says what
    it got and what it wants, before anything else is looked at."""
    with pytest.raises(TypeError) as info:
        rl_triton_rllib.enable(bad)
    message = str(info.value)
    assert named in message
    for wanted in ("AlgorithmConfig", "PPOConfig", "IMPALAConfig", "APPOConfig",
                   "framework='torch'"):
        assert wanted in message, (wanted, message)
    assert "needs framework" not in message  # the old, misleading message
    for other in (rl_triton_rllib.is_enabled, rl_triton_rllib.disable):
        with pytest.raises(TypeError, match=named):
            other(bad)


def test_enable_refuses_a_dict_and_names_its_keys():
    with pytest.raises(TypeError, match=r"dict \(keys \['env', 'lr'\]\).*from_dict"):
        rl_triton_rllib.enable({"env": "CartPole-v1", "lr": 1e-3})


@pytest.mark.parametrize("config_name", ["DQNConfig", "SACConfig"])
def test_enable_refuses_an_algorithm_without_gae_or_vtrace(config_name):
    """DQN and SAC have neither GAE nor V-trace: a ValueError naming the algorithm, its
    learner and the supported algorithms, and the config is left as it was."""
    import importlib

    package = {"DQNConfig": "ray.rllib.algorithms.dqn",
               "SACConfig": "ray.rllib.algorithms.sac"}[config_name]
    config = getattr(importlib.import_module(package), config_name)()
    algo = config_name.removesuffix("Config")
    learner_before = config.learner_class
    with pytest.raises(ValueError) as info:
        rl_triton_rllib.enable(config)
    message = str(info.value)
    assert f"{algo} is not supported" in message
    assert learner_before.__name__ in message  # e.g. DQNTorchLearner
    for supported in ("PPO", "IMPALA", "APPO", "GAE", "V-trace", "TritonGAEMixin"):
        assert supported in message, (supported, message)
    assert config.learner_class is learner_before  # not renamed
    assert "rl_triton" not in config.learner_config_dict
    assert not rl_triton_rllib.is_enabled(config)


def test_enable_refuses_a_custom_learner_outside_ppo_and_impala():
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner

    class MyDQNLearner(DQNTorchLearner):
        pass

    config = PPOConfig().learners(learner_class=MyDQNLearner)
    with pytest.raises(ValueError, match="MyDQNLearner.*neither GAE"):
        rl_triton_rllib.enable(config)
    assert config.learner_class is MyDQNLearner


def test_enable_refuses_a_config_of_no_algorithm():
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    with pytest.raises(ValueError, match="AlgorithmConfig names no algorithm.*PPO"):
        rl_triton_rllib.enable(AlgorithmConfig())


def test_enable_refuses_the_old_api_stack():
    config = PPOConfig().api_stack(enable_rl_module_and_learner=False,
                                   enable_env_runner_and_connector_v2=False)
    with pytest.raises(ValueError, match="new API stack.*enable_rl_module_and_learner"):
        rl_triton_rllib.enable(config)
    assert not rl_triton_rllib.is_enabled(config)
