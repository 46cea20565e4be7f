"""rl_triton_cleanrl.compute_gae against CleanRL's own loop and the float64 spec loop."""

from __future__ import annotations

import doctest

import pytest
import rl_triton_cleanrl
import torch
from rl_triton_cleanrl import compute_gae

SHAPES = [(1, 1), (1, 5), (2, 3), (16, 1), (128, 4), (97, 13), (512, 8)]
COEFFS = [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.0, 0.5), (0.5, 1.0)]


def cleanrl_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's GAE block (ppo.py / ppo_continuous_action.py), verbatim but for names."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


def spec_loop(rewards, values, done, terminated, next_values, gamma, lmbda):
    """GAE from semantics.md in float64, step-aligned flags:
    delta_t = r_t + gamma (1 - terminated_t) V'_t - V_t
    A_t = delta_t + gamma lambda (1 - done_t) A_{t+1},  A_T = 0
    """
    r, v, nv = rewards.double(), values.double(), next_values.double()
    term, done = terminated.double(), done.double()
    adv = torch.zeros_like(r)
    carry = torch.zeros_like(r[0])
    for t in reversed(range(r.shape[0])):
        delta = r[t] + gamma * (1.0 - term[t]) * nv[t] - v[t]
        carry = delta + gamma * lmbda * (1.0 - done[t]) * carry
        adv[t] = carry
    return adv, adv + v


def cleanrl_rollout(num_steps, num_envs, dtype, seed, p_done=0.1, p_term=0.5):
    """Random CleanRL buffers, plus the step-aligned terminations and true next values."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(num_steps, num_envs, generator=g, dtype=torch.float64)
    values = torch.randn(num_steps, num_envs, generator=g, dtype=torch.float64)
    dones = (torch.rand(num_steps, num_envs, generator=g) < p_done).double()
    next_value = torch.randn(1, num_envs, generator=g, dtype=torch.float64)
    next_done = (torch.rand(num_envs, generator=g) < p_done).double()
    done = torch.cat((dones[1:], next_done[None]))  # step-aligned
    terminations = done * (torch.rand(num_steps, num_envs, generator=g) < p_term).double()
    final_values = torch.randn(num_steps, num_envs, generator=g, dtype=torch.float64)
    next_values = torch.cat((values[1:], next_value))
    truncated = (done != 0) & (terminations == 0)
    next_values = torch.where(truncated, final_values, next_values)
    bufs = dict(
        rewards=rewards,
        values=values,
        dones=dones,
        next_value=next_value,
        next_done=next_done,
        terminations=terminations,
        next_values=next_values,
    )
    return {k: x.to(dtype) for k, x in bufs.items()}


def original_args(b):
    return b["rewards"], b["values"], b["dones"], b["next_value"], b["next_done"]


@pytest.mark.parametrize("num_steps,num_envs", SHAPES)
@pytest.mark.parametrize("gamma,gae_lambda", COEFFS)
def test_equals_cleanrl_loop_bit_for_bit_float64(num_steps, num_envs, gamma, gae_lambda):
    b = cleanrl_rollout(num_steps, num_envs, torch.float64, seed=num_steps * 1000 + num_envs)
    adv, ret = compute_gae(*original_args(b), gamma, gae_lambda)
    ref_adv, ref_ret = cleanrl_loop(*original_args(b), gamma, gae_lambda)
    assert adv.dtype == ret.dtype == torch.float64
    assert adv.shape == ret.shape == (num_steps, num_envs)
    assert torch.equal(adv, ref_adv), (adv - ref_adv).abs().max()
    assert torch.equal(ret, ref_ret), (ret - ref_ret).abs().max()


@pytest.mark.parametrize("num_steps,num_envs", SHAPES)
@pytest.mark.parametrize("gamma,gae_lambda", COEFFS)
def test_equals_cleanrl_loop_float32(num_steps, num_envs, gamma, gae_lambda):
    b32 = cleanrl_rollout(num_steps, num_envs, torch.float32, seed=num_steps * 1000 + num_envs)
    adv, ret = compute_gae(*original_args(b32), gamma, gae_lambda)
    assert adv.dtype == ret.dtype == torch.float32
    # CleanRL's loop run in float64 on the same float32 data is the exact answer.
    b64 = {k: x.double() for k, x in b32.items()}
    ref_adv, ref_ret = cleanrl_loop(*original_args(b64), gamma, gae_lambda)
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=1e-5, atol=1e-5)
    # ... and CleanRL's loop in float32 agrees too.
    loop_adv, _ = cleanrl_loop(*original_args(b32), gamma, gae_lambda)
    torch.testing.assert_close(adv, loop_adv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_steps,num_envs", SHAPES)
@pytest.mark.parametrize("gamma,gae_lambda", COEFFS)
def test_truncation_correct_matches_spec(num_steps, num_envs, gamma, gae_lambda):
    b = cleanrl_rollout(num_steps, num_envs, torch.float64, seed=7 + num_steps + num_envs)
    adv, ret = compute_gae(
        *original_args(b),
        gamma,
        gae_lambda,
        terminations=b["terminations"],
        next_values=b["next_values"],
    )
    done = torch.cat((b["dones"][1:], b["next_done"][None]))
    ref_adv, ref_ret = spec_loop(
        b["rewards"], b["values"], done, b["terminations"], b["next_values"], gamma, gae_lambda
    )
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-12, atol=1e-12)


def test_truncation_equals_loop_with_bootstrap_folded_into_reward():
    """The examples' `--gae-backend cleanrl-loop --bootstrap-truncated`: CleanRL's loop, with
    gamma * V(final_obs) added to the reward of truncated steps, gives the same answer."""
    gamma, gae_lambda = 0.99, 0.95
    b = cleanrl_rollout(256, 8, torch.float64, seed=3, p_done=0.2)
    done = torch.cat((b["dones"][1:], b["next_done"][None]))
    truncated = (done != 0) & (b["terminations"] == 0)
    assert truncated.any() and (b["terminations"] != 0).any()
    adv, ret = compute_gae(
        *original_args(b),
        gamma,
        gae_lambda,
        terminations=b["terminations"],
        next_values=b["next_values"],
    )
    folded = b["rewards"] + gamma * b["next_values"] * truncated
    ref_adv, ref_ret = cleanrl_loop(folded, *original_args(b)[1:], gamma, gae_lambda)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-12, atol=1e-12)


def test_all_terminated_equals_original():
    """terminations == every done: the truncation-correct call reduces to CleanRL's original."""
    b = cleanrl_rollout(64, 6, torch.float64, seed=11, p_done=0.2)
    done = torch.cat((b["dones"][1:], b["next_done"][None]))
    adv, ret = compute_gae(
        *original_args(b), 0.99, 0.95, terminations=done, next_values=b["next_values"]
    )
    ref_adv, ref_ret = cleanrl_loop(*original_args(b), 0.99, 0.95)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-12, atol=1e-12)


def test_flag_dtypes_and_next_value_shapes():
    b = cleanrl_rollout(32, 5, torch.float32, seed=5, p_done=0.3)
    ref = compute_gae(*original_args(b), 0.99, 0.95)
    for dones, next_done in (
        (b["dones"].bool(), b["next_done"].bool()),
        (b["dones"].to(torch.uint8), b["next_done"].to(torch.uint8)),
    ):
        for next_value in (b["next_value"], b["next_value"].reshape(-1)):
            out = compute_gae(b["rewards"], b["values"], dones, next_value, next_done, 0.99, 0.95)
            torch.testing.assert_close(out, ref, rtol=0, atol=0)
    out = compute_gae(
        *original_args(b),
        0.99,
        0.95,
        terminations=b["terminations"].bool(),
        next_values=b["next_values"],
    )
    ref = compute_gae(
        *original_args(b), 0.99, 0.95, terminations=b["terminations"], next_values=b["next_values"]
    )
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_inputs_not_modified():
    b = cleanrl_rollout(40, 3, torch.float32, seed=9, p_done=0.3)
    before = {k: x.clone() for k, x in b.items()}
    compute_gae(*original_args(b), 0.99, 0.95)
    compute_gae(
        *original_args(b), 0.99, 0.95, terminations=b["terminations"], next_values=b["next_values"]
    )
    for k in b:
        assert torch.equal(b[k], before[k]), k


def test_bad_input_names_the_argument():
    b = cleanrl_rollout(8, 3, torch.float32, seed=1)
    with pytest.raises(ValueError, match="terminations and next_values"):
        compute_gae(*original_args(b), 0.99, 0.95, terminations=b["terminations"])
    with pytest.raises(ValueError, match="terminations and next_values"):
        compute_gae(*original_args(b), 0.99, 0.95, next_values=b["next_values"])
    with pytest.raises(ValueError, match="rewards"):
        compute_gae(b["rewards"][None], *original_args(b)[1:], 0.99, 0.95)
    with pytest.raises(ValueError, match="values"):
        compute_gae(b["rewards"], b["values"][:-1], *original_args(b)[2:], 0.99, 0.95)
    with pytest.raises(ValueError, match="dones"):
        compute_gae(*original_args(b)[:2], b["dones"].T, *original_args(b)[3:], 0.99, 0.95)
    with pytest.raises(ValueError, match="next_value"):
        compute_gae(*original_args(b)[:3], b["next_value"][:, :2], b["next_done"], 0.99, 0.95)
    with pytest.raises(ValueError, match="next_done"):
        compute_gae(*original_args(b)[:4], b["next_done"][:2], 0.99, 0.95)
    with pytest.raises(TypeError, match="rewards"):
        compute_gae(b["rewards"].numpy(), *original_args(b)[1:], 0.99, 0.95)
    with pytest.raises(TypeError, match="next_done"):
        compute_gae(*original_args(b)[:4], [0.0, 0.0, 0.0], 0.99, 0.95)
    with pytest.raises(ValueError, match="next_values"):
        compute_gae(
            *original_args(b),
            0.99,
            0.95,
            terminations=b["terminations"],
            next_values=b["next_values"][:-1],
        )


def test_docstring_example_runs():
    result = doctest.testmod(rl_triton_cleanrl, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_cuda_matches_cleanrl_loop(dtype, tol):
    for truncation in (False, True):
        b = cleanrl_rollout(128, 64, dtype, seed=21)
        extra = (
            dict(terminations=b["terminations"], next_values=b["next_values"]) if truncation else {}
        )
        adv, ret = compute_gae(*original_args(b), 0.99, 0.95, **extra)
        cuda = {k: x.cuda() for k, x in b.items()}
        extra_cuda = (
            dict(terminations=cuda["terminations"], next_values=cuda["next_values"])
            if truncation
            else {}
        )
        adv_c, ret_c = compute_gae(*original_args(cuda), 0.99, 0.95, **extra_cuda)
        assert adv_c.is_cuda and ret_c.is_cuda
        torch.testing.assert_close(adv_c.cpu(), adv, rtol=tol, atol=tol)
        torch.testing.assert_close(ret_c.cpu(), ret, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="next_value"):
        compute_gae(*original_args(cuda)[:3], b["next_value"], cuda["next_done"], 0.99, 0.95)


def test_transposed_buffers_are_named():
    """CleanRL's buffers are [num_steps, num_envs]: transposed ones get an error that
    says so (not one that blames next_value)."""
    steps, envs = 16, 4
    rewards, values = torch.randn(envs, steps), torch.randn(envs, steps)
    dones = torch.zeros(envs, steps)
    with pytest.raises(ValueError, match="look transposed"):
        compute_gae(rewards, values, dones, torch.randn(envs), torch.zeros(envs), 0.99, 0.95)
