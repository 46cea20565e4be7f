"""End-to-end runs on CartPole (CPU): PPO and APPO with the flag on.

All tests here share one small Ray instance (``ray_session``, 2 CPUs). The learning
test is ``slow`` (deselected in CI: ``-m "not slow"``).
"""

from __future__ import annotations

import math

import pytest
import rl_triton_rllib
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.ppo import PPOConfig
from rl_triton_rllib import functional

pytestmark = pytest.mark.usefixtures("ray_session")


def ppo_config(num_learners=0, **training):
    training = {"train_batch_size_per_learner": 400, "minibatch_size": 100,
                "num_epochs": 1, **training}
    return (PPOConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0)
            .learners(num_learners=num_learners)
            .training(**training)
            .debugging(seed=0))


def check_ppo_run(algo, iterations=2):
    def learner_view(learner):
        """What a (possibly remote) learner runs: class, pieces, options. Nested, so
        that cloudpickle ships it by value to a remote learner."""
        return {
            # a remote learner's class is Ray Train's subclass of the learner class
            "learner": [klass.__name__ for klass in type(learner).__mro__],
            "pieces": [type(p).__qualname__ for p in learner._learner_connector.connectors],
            "options": learner.config.learner_config_dict.get("rl_triton"),
        }

    (view,) = [r.get() for r in algo.learner_group.foreach_learner(learner_view)]
    assert "TritonPPOTorchLearner" in view["learner"]
    assert "TritonGeneralAdvantageEstimation" in view["pieces"]
    assert view["options"]["gae"] is True
    for _ in range(iterations):
        result = algo.train()
    losses = result["learners"]["default_policy"]
    assert math.isfinite(losses["total_loss"]) and math.isfinite(losses["vf_loss"])
    assert result["env_runners"]["num_env_steps_sampled_lifetime"] >= 400 * iterations
    return result


def test_ppo_smoke_local_learner():
    algo = rl_triton_rllib.enable(ppo_config()).build_algo()
    try:
        check_ppo_run(algo)
    finally:
        algo.stop()


def test_ppo_smoke_remote_learner():
    """num_learners=1: the learner is a Ray actor built from the shipped config."""
    algo = rl_triton_rllib.enable(ppo_config(num_learners=1)).build_algo()
    try:
        assert not algo.learner_group.is_local
        check_ppo_run(algo)
    finally:
        algo.stop()


@pytest.mark.parametrize("fix_truncation", [False, True])
def test_appo_smoke(monkeypatch, fix_truncation):
    """APPO with the V-trace switch: the loss goes through
    rl_triton_rllib.functional.vtrace_torch (spied on; the learner runs in this process)
    and trains."""
    calls = []
    inner = functional.vtrace_torch

    def spy(**kwargs):
        truncateds = kwargs.get("truncateds")
        calls.append(None if truncateds is None else bool(truncateds.any()))
        return inner(**kwargs)

    monkeypatch.setattr(functional, "vtrace_torch", spy)
    config = (APPOConfig()
              .environment("CartPole-v1")
              .env_runners(num_env_runners=0, rollout_fragment_length=50)
              .learners(num_learners=0)
              .training(train_batch_size_per_learner=200)
              .reporting(min_time_s_per_iteration=1)
              .debugging(seed=0))
    rl_triton_rllib.enable(config, fix_truncation=fix_truncation)
    algo = config.build_algo()
    try:
        trained = False
        for _ in range(8):
            result = algo.train()
            losses = result.get("learners", {}).get("default_policy", {})
            if "total_loss" in losses:
                assert math.isfinite(losses["total_loss"])
                trained = True
                break
        assert trained, "APPO made no learner update in 8 iterations"
    finally:
        algo.stop()
    assert calls, "the Triton V-trace was never called"
    if fix_truncation:
        assert any(calls), "fix_truncation passed no truncated chunk ends"
    else:
        assert set(calls) == {None}


@pytest.mark.slow
def test_ppo_learns_cartpole():
    """PPO with the flag reaches a CartPole return >= 150."""
    config = ppo_config(train_batch_size_per_learner=4000, minibatch_size=128,
                        num_epochs=6, lr=3e-4)
    algo = rl_triton_rllib.enable(config).build_algo()
    best = -math.inf
    try:
        for _ in range(30):
            result = algo.train()
            best = max(best, result["env_runners"].get("episode_return_mean", -math.inf))
            if best >= 150:
                break
    finally:
        algo.stop()
    assert best >= 150, f"best mean return {best:.1f} < 150 after 30 iterations"
