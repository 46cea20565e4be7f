"""Parity with RLlib's own numbers (to 1e-5) on random batches of episode chunks.

No Ray instance needed: learners are built locally with ``config.build_learner``.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import rl_triton_rllib
import torch
from ray.rllib.algorithms.impala.torch.vtrace_torch_v2 import vtrace_torch as rllib_vtrace
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.postprocessing.value_predictions import (
    compute_value_targets as rllib_compute_value_targets,
)
from rl_triton_rllib import functional

TOL = dict(rtol=1e-5, atol=1e-5)
STATUSES = ("terminated", "truncated", "cut")  # cut: rollout ended mid-episode


# --------------------------------------------------------------- flat-stream function


def flat_stream(rng, n_chunks, max_len=300):
    """RLlib's learner layout: chunks of real steps, each + one phantom step (reward 0,
    no flags), the last real step flagged terminated or truncated (a cut counts as
    truncated, as AddOneTsToEpisodesAndTruncate writes it)."""
    values, rewards, term, trunc = [], [], [], []
    for _ in range(n_chunks):
        n = int(rng.integers(1, max_len + 1))
        status = STATUSES[rng.integers(3)]
        values.append(3 * rng.standard_normal(n + 1))
        rewards.append(np.append(rng.standard_normal(n), 0.0))
        t = np.zeros(n + 1, bool)
        u = np.zeros(n + 1, bool)
        (t if status == "terminated" else u)[n - 1] = True
        term.append(t)
        trunc.append(u)
    cat = np.concatenate
    return (cat(values).astype(np.float32), cat(rewards).astype(np.float32), cat(term),
            cat(trunc))


@pytest.mark.parametrize("gamma,lambda_", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compute_value_targets_matches_rllib(seed, gamma, lambda_):
    rng = np.random.default_rng(seed)
    v, r, te, tr = flat_stream(rng, n_chunks=int(rng.integers(1, 12)))
    expected = rllib_compute_value_targets(v, r, te, tr, gamma, lambda_)
    got = functional.compute_value_targets(v, r, te, tr, gamma, lambda_)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **TOL)
    # torch in, torch out (same device), same numbers
    got_t = functional.compute_value_targets(*map(torch.from_numpy, (v, r, te, tr)),
                                             gamma, lambda_)
    assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.float32
    np.testing.assert_allclose(got_t.numpy(), expected, **TOL)


def test_compute_value_targets_single_step_chunks():
    """Chunks of one real step (plus the phantom) in a row, all three statuses."""
    rng = np.random.default_rng(7)
    v, r, te, tr = flat_stream(rng, n_chunks=30, max_len=1)
    expected = rllib_compute_value_targets(v, r, te, tr, 0.99, 0.95)
    np.testing.assert_allclose(
        functional.compute_value_targets(v, r, te, tr, 0.99, 0.95), expected, **TOL)


# ------------------------------------------------------------ learner connector (PPO)


def random_episodes(rng, env, n_episodes, max_len):
    episodes = []
    for _ in range(n_episodes):
        n = int(rng.integers(1, max_len + 1))
        status = STATUSES[rng.integers(3)]
        obs = rng.uniform(-0.2, 0.2, size=(n + 1, 4)).astype(np.float32)
        episodes.append(SingleAgentEpisode(
            observations=list(obs),
            actions=[int(a) for a in rng.integers(0, 2, n)],
            rewards=list(rng.standard_normal(n).astype(np.float32) + 1.0),
            extra_model_outputs={
                Columns.ACTION_LOGP: list(np.full(n, -0.69, np.float32)),
                Columns.ACTION_DIST_INPUTS: [np.zeros(2, np.float32)] * n,
            },
            terminated=status == "terminated",
            truncated=status == "truncated",
            t_started=int(rng.integers(0, 3)) * 50,  # some chunks continue an episode
            len_lookback_buffer=0,
            observation_space=env.observation_space,
            action_space=env.action_space,
        ).to_numpy())
    return episodes


def learner_pair(model_config=None):
    """A stock PPO learner and a Triton one with the same weights."""
    config = PPOConfig().environment("CartPole-v1").training(gamma=0.99, lambda_=0.95)
    if model_config is not None:
        config.rl_module(model_config=model_config)
    env = gym.make("CartPole-v1")
    stock = config.build_learner(env=env)
    triton = rl_triton_rllib.enable(config.copy(copy_frozen=False)).build_learner(env=env)
    triton.module.set_state(stock.module.get_state())
    return stock, triton


def run_pipeline(learner, episodes):
    batch = learner._learner_connector(rl_module=learner.module, batch={},
                                       episodes=copy.deepcopy(episodes), shared_data={})
    return batch["default_policy"]


@pytest.mark.parametrize(
    "model_config",
    [None, DefaultModelConfig(use_lstm=True, max_seq_len=7, lstm_cell_size=16)],
    ids=["flat", "lstm-zero-padded"],
)
def test_gae_connector_matches_rllib(model_config):
    stock, triton = learner_pair(model_config)
    pieces = [type(p) for p in triton._learner_connector.connectors]
    assert rl_triton_rllib.TritonGeneralAdvantageEstimation in pieces
    rng = np.random.default_rng(3)
    env = gym.make("CartPole-v1")
    for _ in range(3):
        episodes = random_episodes(rng, env, n_episodes=int(rng.integers(1, 25)), max_len=40)
        expected = run_pipeline(stock, episodes)
        got = run_pipeline(triton, episodes)
        assert set(got) == set(expected)
        for column in (Postprocessing.ADVANTAGES, Postprocessing.VALUE_TARGETS):
            e, g = expected[column], got[column]
            assert g.shape == e.shape and g.dtype == e.dtype and g.device == e.device
            assert not g.requires_grad
            torch.testing.assert_close(g, e, **TOL)
        if model_config is not None:  # really the zero-padded [B, max_seq_len] layout
            assert got[Postprocessing.ADVANTAGES].shape[1] == 7


# ------------------------------------------------------------------ V-trace (IMPALA)


def vtrace_inputs(rng, T=40, B=6, gamma=0.99):
    f = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))
    terminated = torch.from_numpy(rng.random((T, B)) < 0.05)
    loss_mask = torch.from_numpy(rng.random((T, B)) > 0.08)  # phantom steps
    values = f(T, B).requires_grad_()
    return dict(
        target_action_log_probs=0.5 * f(T, B),
        behaviour_action_log_probs=0.5 * f(T, B),
        discounts=gamma * (1.0 - terminated.float()) * loss_mask.float(),
        rewards=f(T, B),
        values=values,
        bootstrap_values=f(B),
    )


@pytest.mark.parametrize("clip_rho,clip_pg_rho", [(1.0, 1.0), (2.0, 0.5), (None, None)])
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_torch_matches_rllib(seed, clip_rho, clip_pg_rho):
    inputs = vtrace_inputs(np.random.default_rng(seed))
    kwargs = dict(clip_rho_threshold=clip_rho, clip_pg_rho_threshold=clip_pg_rho)
    vs_e, pg_e = rllib_vtrace(**inputs, **kwargs)
    vs, pg = rl_triton_rllib.vtrace_torch(**inputs, **kwargs)
    for got, expected in ((vs, vs_e), (pg, pg_e)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert not got.requires_grad
        torch.testing.assert_close(got, expected, **TOL)


def test_vtrace_fix_truncation_worked_example():
    """docs/rllib.md's example: one truncated chunk of 3 steps + its extra step, r = 1,
    V = 1 everywhere (also V(s_3), held by the extra step), gamma = 0.9, on-policy."""
    T = 4
    inputs = dict(
        target_action_log_probs=torch.zeros(T, 1),
        behaviour_action_log_probs=torch.zeros(T, 1),
        discounts=torch.tensor([[0.9], [0.9], [0.9], [0.0]]),  # extra step: loss_mask 0
        rewards=torch.tensor([[1.0], [1.0], [1.0], [0.0]]),
        values=torch.ones(T, 1),
        bootstrap_values=torch.ones(1),
    )
    truncateds = torch.tensor([[False], [False], [True], [False]])
    # RLlib's convention: the bootstrap V(s_3) cancels out of step 2.
    vs_rllib, pg_rllib = rllib_vtrace(**inputs)
    vs, pg = rl_triton_rllib.vtrace_torch(**inputs)
    torch.testing.assert_close(vs, vs_rllib, **TOL)
    torch.testing.assert_close(pg, pg_rllib, **TOL)
    torch.testing.assert_close(vs[:3, 0], torch.tensor([2.71, 1.9, 1.0]), **TOL)
    torch.testing.assert_close(pg[:3, 0], torch.tensor([1.71, 0.9, 0.0]), **TOL)
    # fix_truncation: the discounted return bootstrapped from V(s_3) = 1.
    vs_fix, pg_fix = rl_triton_rllib.vtrace_torch(**inputs, truncateds=truncateds)
    torch.testing.assert_close(vs_fix[:3, 0], torch.tensor([3.439, 2.71, 1.9]), **TOL)
    torch.testing.assert_close(pg_fix[:3, 0], torch.tensor([2.439, 1.71, 0.9]), **TOL)


# ------------------------------------------------ the same mapping on the Triton kernels


@pytest.fixture
def triton_device(monkeypatch):
    """Run the core's Triton kernels: on CUDA tensors, or on CPU tensors under the
    Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA)."""
    import os

    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device = torch.device("cpu")
    else:
        pytest.skip("needs CUDA or TRITON_INTERPRET=1 (set before triton is imported)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    return device


def test_functional_on_triton_kernels(triton_device):
    rng = np.random.default_rng(4)
    v, r, te, tr = flat_stream(rng, n_chunks=6, max_len=120)
    expected = rllib_compute_value_targets(v, r, te, tr, 0.99, 0.95)
    got = functional.compute_value_targets(
        *(torch.from_numpy(x).to(triton_device) for x in (v, r, te, tr)), 0.99, 0.95)
    assert got.device.type == triton_device.type
    np.testing.assert_allclose(got.cpu().numpy(), expected, **TOL)

    inputs = vtrace_inputs(rng, T=30, B=4)
    for clip in (1.0, None):
        kwargs = dict(clip_rho_threshold=clip, clip_pg_rho_threshold=clip)
        expected = rllib_vtrace(**inputs, **kwargs)
        got = rl_triton_rllib.vtrace_torch(
            **{k: x.to(triton_device) for k, x in inputs.items()}, **kwargs)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g.cpu(), e, **TOL)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_integer_rewards_as_rllib_reads_them(dtype):
    """An env's integer rewards: RLlib's arithmetic promotes them to the values' dtype, and
    so do the drop-ins (the core itself takes float data only)."""
    inputs = vtrace_inputs(np.random.default_rng(0))
    ints = torch.randint(0, 3, inputs["rewards"].shape)
    inputs["rewards"] = ints > 0 if dtype == torch.bool else ints.to(dtype)
    vs_e, pg_e = rllib_vtrace(**inputs)
    vs, pg = rl_triton_rllib.vtrace_torch(**inputs)
    torch.testing.assert_close(vs, vs_e, **TOL)
    torch.testing.assert_close(pg, pg_e, **TOL)
    values, rewards, term, trunc = flat_stream(np.random.default_rng(1), 4)
    rewards = rewards.round().astype(np.int64)
    want = rllib_compute_value_targets(values, rewards, term, trunc, gamma=0.99, lambda_=0.95)
    got = functional.compute_value_targets(values, rewards, term, trunc, gamma=0.99,
                                           lambda_=0.95)
    np.testing.assert_allclose(got, want, **TOL)
