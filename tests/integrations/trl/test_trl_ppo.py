"""rl_triton_trl against TRL 1.12.0's own PPO advantage block and masked_whiten (compiled
from the installed file: see conftest.py), on the CPU path.

Tolerances: TRL's Bessel factor ``mask_sum / (mask_sum - 1)`` of a bool mask is int64 /
int64 in torch, a float32 number, so float64 results agree with TRL to ~1e-7 relative
(1e-6 here) and with the float64 reference to 1e-12; float32 1e-5; bf16 loosely (TRL's
loop rounds each step to bf16).
"""

import pytest
import rl_triton_trl as ours
import torch
from llm_testlib import token_batch

import rl_triton_core as rc
from rl_triton_core import reference as ref

F64 = torch.float64
HAS_CUDA = torch.cuda.is_available()


def _trl_batch(seed, dtype=F64, T=9, right_padded=True):
    """TRL's layout: right padding after each response, values zeroed past it."""
    r, v, m = token_batch(seed, T=T, dtype=dtype)
    if right_padded:
        gen = torch.Generator().manual_seed(seed)
        seq_len = torch.randint(-1, T, (r.shape[0],), generator=gen)  # index of last token
        seq_len[0], seq_len[1] = T - 1, 0
        idx = torch.arange(T).repeat(r.shape[0], 1)
        padding_mask = idx > seq_len.unsqueeze(1)
        padding_mask_p1 = idx > (seq_len + 1).unsqueeze(1)
        v = torch.masked_fill(v, padding_mask_p1, 0)
    else:  # any mask (multi-turn spans, left padding): the block does not look at it
        padding_mask = m == 0
    return r, v, padding_mask


def _check(trl_ppo, r, v, pm, gamma, lam, tol):
    inputs = [t.clone() for t in (r, v, pm)]
    want = trl_ppo.advantages(r, v, pm, gamma, lam)
    got = ours.ppo_advantages(r, v, pm, gamma, lam)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (r, v, pm)))
    return got


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.95), (0.9, 0.5)])
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-6), (torch.float32, 1e-5)])
@pytest.mark.parametrize("right_padded", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_ppo_advantages(trl_ppo, dtype, tol, gamma, lam, right_padded, seed):
    r, v, pm = _trl_batch(seed, dtype, right_padded=right_padded)
    got = _check(trl_ppo, r, v, pm, gamma, lam, tol)
    if dtype == F64:  # and to the exact formula
        every = torch.ones_like(pm)
        a, ret = ref.masked_gae(r, v, every, gamma=gamma, lmbda=lam, skip=False, time_dim=-1)
        a = ref.masked_whiten(a, ~pm, count_eps=0.0, fill=0.0)
        torch.testing.assert_close(got[0], a, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[1], ret, rtol=1e-12, atol=1e-12)


def test_length_one_and_int_mask(trl_ppo):
    r, v, pm = _trl_batch(4, torch.float32)
    pm[:, 1:] = True  # every response one token long
    _check(trl_ppo, r, v, pm, 0.99, 0.95, 1e-5)
    a = ours.ppo_advantages(r, v, pm, 0.99, 0.95)
    b = ours.ppo_advantages(r, v, pm.int(), 0.99, 0.95)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bf16(trl_ppo):
    r, v, pm = _trl_batch(5)
    rb, vb = r.bfloat16(), v.bfloat16()
    want = trl_ppo.advantages(rb, vb, pm, 0.99, 0.95)
    got = ours.ppo_advantages(rb, vb, pm, 0.99, 0.95)
    every = torch.ones_like(pm)
    a, ret = ref.masked_gae(rb.double(), vb.double(), every, gamma=0.99, lmbda=0.95, skip=False,
                            time_dim=-1)
    exact = (ref.masked_whiten(a, ~pm, fill=0.0), ret)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), e, rtol=2**-7, atol=2**-6)
        torch.testing.assert_close(g.double(), w.double(), rtol=0.05, atol=0.1)


@pytest.mark.parametrize("shift_mean", [True, False])
def test_masked_whiten(trl_ppo, shift_mean):
    r, _, pm = _trl_batch(6, torch.float32)
    want = trl_ppo.masked_whiten(r, ~pm, shift_mean=shift_mean)
    got = ours.masked_whiten(r, ~pm, shift_mean=shift_mean)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_all_padding_where_trl_raises(trl_ppo):
    """TRL's masked_var reads the mask sum on the host and raises when it is 0; here
    nothing reads the device: the whitening gives NaN, which the fill then overwrites
    (every token is padding), and the returns are what TRL's loop gives."""
    r, v, pm = _trl_batch(7)
    pm[:] = True
    with pytest.raises(ValueError):
        trl_ppo.advantages(r, v, pm, 0.99, 0.95)
    adv, ret = ours.ppo_advantages(r, v, pm, 0.99, 0.95)
    assert adv.eq(0).all()  # every position is padding: filled with 0 after whitening
    want = ref.masked_gae(r, v, torch.ones_like(pm), gamma=0.99, lmbda=0.95, skip=False,
                          time_dim=-1)[1]
    torch.testing.assert_close(ret, want, rtol=1e-12, atol=1e-12)
    assert torch.isnan(ours.masked_whiten(r, ~pm)).all()


def test_one_sequence_and_packed():
    """A sequence's returns alone equal its returns in the batch; the packed form
    (cu_seqlens) of the same plain GAE gives the padded result."""
    r, v, pm = _trl_batch(8)
    _, ret = ours.ppo_advantages(r, v, pm, 0.9, 0.8)
    for row in range(r.shape[0]):
        _, ret1 = ours.ppo_advantages(r[row:row + 1], v[row:row + 1], pm[row:row + 1], 0.9, 0.8)
        torch.testing.assert_close(ret1[0], ret[row], rtol=1e-12, atol=1e-12)
    B, T = r.shape
    cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32)
    every = torch.ones(B * T, dtype=torch.bool)
    _, pret = rc.masked_gae(r.reshape(-1), v.reshape(-1), every, gamma=0.9, lmbda=0.8,
                            skip=False, cu_seqlens=cu, time_dim=-1)
    torch.testing.assert_close(pret.reshape(B, T), ret, rtol=1e-12, atol=1e-12)


def test_block_is_the_one_documented(trl_ppo):
    """The adapter's docstring quotes TRL's block; it is still TRL's code."""
    for line in ("delta = rewards[:, t] + args.gamma * nextvalues - values[:, t]",
                 "lastgaelam = delta + args.gamma * args.lam * lastgaelam",
                 "advantages = masked_whiten(advantages, ~padding_mask)"):
        assert line in trl_ppo.block and line in ours.__doc__


def test_bad_input():
    with pytest.raises(TypeError, match="padding_mask"):
        ours.ppo_advantages(torch.zeros(2, 3), torch.zeros(2, 3), [[0, 0, 0]], 1.0, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda(trl_ppo):
    """On CUDA (the Triton kernels), against TRL's block on the same tensors, float32."""
    r, v, pm = _trl_batch(3, torch.float32, T=300)
    r, v, pm = r.cuda(), v.cuda(), pm.cuda()
    got = ours.ppo_advantages(r, v, pm, 0.99, 0.95)
    want = trl_ppo.advantages(r, v, pm, 0.99, 0.95)
    assert got[0].device.type == "cuda"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
