"""rl_triton_openrlhf against OpenRLHF 0.11.2's own ``RemoteExperienceMaker`` methods
(the installed file, loaded by the ``experience_maker`` fixture: see conftest.py), on
the CPU path. Tolerances: float64 1e-12, float32 1e-5; bfloat16 (OpenRLHF's loop rounds
each step to bf16, the core accumulates in float32 and rounds once): to the float64
reference at bf16 precision, to OpenRLHF loosely."""

import inspect
from types import SimpleNamespace

import pytest
import rl_triton_openrlhf as ours
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_testlib import as_mask, lengths_trimmed, pack, token_batch

import rl_triton_core as rc
from rl_triton_core import reference as ref

F64 = torch.float64
HAS_CUDA = torch.cuda.is_available()
GAMMAS = [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)]
EXACT = [(F64, "float64", 1e-12), (F64, "bool", 1e-12), (F64, "int64", 1e-12),
         (torch.float32, "bool", 1e-5), (torch.float32, "float32", 1e-5)]


def _theirs(experience_maker, name):
    fn = getattr(experience_maker.RemoteExperienceMaker, name)
    return lambda *args: fn(None, *args)  # self is unused


def _close(got, want, tol):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", ["get_advantages_and_returns", "get_cumulative_returns"])
def test_same_signature(experience_maker, name):
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
                if p.name != "self"]

    assert params(getattr(ours, name)) == params(
        getattr(experience_maker.RemoteExperienceMaker, name))


@pytest.mark.parametrize("gamma,lambd", GAMMAS)
@pytest.mark.parametrize("dtype,mask_kind,tol", EXACT)
@pytest.mark.parametrize("seed", range(3))
def test_gae(experience_maker, dtype, mask_kind, tol, gamma, lambd, seed):
    r, v, m = token_batch(seed, dtype=dtype)
    m = as_mask(m, mask_kind)
    inputs = [t.clone() for t in (r, v, m)]
    want = _theirs(experience_maker, "get_advantages_and_returns")(v, r, m, gamma, lambd)
    got = ours.get_advantages_and_returns(v, r, m, gamma, lambd)
    for g, w in zip(got, want):
        _close(g, w, tol)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (r, v, m)))


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5])
@pytest.mark.parametrize("dtype,mask_kind,tol", EXACT)
@pytest.mark.parametrize("seed", range(3))
def test_cumulative_returns(experience_maker, dtype, mask_kind, tol, gamma, seed):
    r, _, m = token_batch(seed, dtype=dtype)
    m = as_mask(m, mask_kind)
    want = _theirs(experience_maker, "get_cumulative_returns")(r, m, gamma)
    _close(ours.get_cumulative_returns(r, m, gamma), want, tol)


def test_no_action_mask(experience_maker):
    r, v, _ = token_batch(5)
    want = _theirs(experience_maker, "get_advantages_and_returns")(v, r, None, 0.9, 0.8)
    for g, w in zip(ours.get_advantages_and_returns(v, r, None, 0.9, 0.8), want):
        _close(g, w, 1e-12)
    want = _theirs(experience_maker, "get_cumulative_returns")(r, None, 0.9)
    _close(ours.get_cumulative_returns(r, None, 0.9), want, 1e-12)


def test_bf16(experience_maker):
    r, v, m = token_batch(6)
    m = m.bool()
    # float32 rewards (OpenRLHF promotes them), bf16 critic values: float32 out
    vb = v.bfloat16()
    want = _theirs(experience_maker, "get_advantages_and_returns")(vb, r.float(), m, 0.99, 0.95)
    got = ours.get_advantages_and_returns(vb, r.float(), m, 0.99, 0.95)
    exact = ref.masked_gae(r.float().double(), vb.double(), m, gamma=0.99, lmbda=0.95,
                           skip=False, time_dim=-1)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == w.dtype == torch.float32
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, w, rtol=0.02, atol=0.02)
    rb = r.bfloat16()
    want = _theirs(experience_maker, "get_advantages_and_returns")(vb, rb, m, 0.99, 0.95)
    got = ours.get_advantages_and_returns(vb, rb, m, 0.99, 0.95)
    exact = ref.masked_gae(rb.double(), vb.double(), m, gamma=0.99, lmbda=0.95, skip=False,
                           time_dim=-1)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), e, rtol=2**-7, atol=2**-6)
        torch.testing.assert_close(g.double(), w.double(), rtol=0.05, atol=0.1)
    want = _theirs(experience_maker, "get_cumulative_returns")(rb, m, 0.99)
    got = ours.get_cumulative_returns(rb, m, 0.99)
    assert got.dtype == want.dtype == torch.bfloat16  # OpenRLHF accumulates in float32 too
    torch.testing.assert_close(got, want, rtol=2**-7, atol=2**-7)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), row=st.integers(0, 11),
       gamma=st.floats(0.5, 1.0), lambd=st.floats(0.0, 1.0))
def test_properties(seed, row, gamma, lambd):
    """One sequence alone equals the same sequence in the batch; the packed batch
    (trailing padding dropped, cu_seqlens) equals the padded one."""
    r, v, m = token_batch(seed)
    m = m.bool()
    adv, ret = ours.get_advantages_and_returns(v, r, m, gamma, lambd)
    cum = ours.get_cumulative_returns(r, m, gamma)
    sl = slice(row, row + 1)
    adv1, ret1 = ours.get_advantages_and_returns(v[sl], r[sl], m[sl], gamma, lambd)
    torch.testing.assert_close(adv1[0], adv[row], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret1[0], ret[row], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours.get_cumulative_returns(r[sl], m[sl], gamma)[0], cum[row],
                               rtol=1e-12, atol=1e-12)
    lengths = lengths_trimmed(m)
    pr, pv, pm, cu = pack(lengths, r, v, m)
    padv, pret = rc.masked_gae(pr, pv, pm, gamma=gamma, lmbda=lambd, skip=False,
                               cu_seqlens=cu, time_dim=-1)
    pcum = rc.masked_returns(pr, pm, gamma=gamma, skip=False, cu_seqlens=cu, time_dim=-1)
    fadv, fret, fcum, _ = pack(lengths, adv, ret, cum)
    for a, b in ((padv, fadv), (pret, fret), (pcum, fcum)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_install(installed, experience_maker):
    cls = experience_maker.RemoteExperienceMaker
    originals = {n: cls.__dict__[n] for n in ("get_advantages_and_returns",
                                              "get_cumulative_returns")}
    assert not any(installed.is_installed().values())
    installed.install()
    installed.install()
    assert all(installed.is_installed().values())
    maker = cls.__new__(cls)  # the trainer calls self.get_...(...)
    r, v, m = token_batch(2)
    for g, w in zip(maker.get_advantages_and_returns(v, r, m, 0.9, 0.8),
                    ours.get_advantages_and_returns(v, r, m, 0.9, 0.8)):
        assert torch.equal(g, w)
    installed.uninstall()
    installed.uninstall()
    assert {n: cls.__dict__[n] for n in originals} == originals


FRESH_PROCESS_USER_PATCH = r"""
import functools, sys
sys.path.insert(0, {here!r})
import conftest  # OpenRLHF's real experience_maker with stand-ins for its GPU stack
sys.modules.update(conftest._stand_ins(conftest._root()))
import rl_triton_openrlhf
from openrlhf.trainer.ppo_utils import experience_maker

cls = experience_maker.RemoteExperienceMaker
theirs = dict(cls.__dict__)
original = theirs["get_advantages_and_returns"]
if {kind!r} == "function":
    def mine(self, values, rewards, action_mask, gamma, lambd):
        return None
else:  # a user's wrapper, with OpenRLHF's name, qualname and module
    @functools.wraps(original)
    def mine(self, *args):
        return original(self, *args)
cls.get_advantages_and_returns = mine

rl_triton_openrlhf.install()  # the first install() of this process
assert cls.__dict__["get_advantages_and_returns"] is mine, "the user's method replaced"
assert rl_triton_openrlhf.is_installed() == {{"get_advantages_and_returns": False,
                                             "get_cumulative_returns": True}}
rl_triton_openrlhf.uninstall()
assert cls.__dict__["get_advantages_and_returns"] is mine, "the user's method put back"
assert cls.__dict__["get_cumulative_returns"] is theirs["get_cumulative_returns"]
"""


@pytest.mark.parametrize("kind", ["function", "wrapper"])
def test_install_leaves_a_users_patch_made_before_the_first_install(experience_maker, kind):
    """In a fresh process (no install() has run yet), a user's own method, set on the
    class before install(), is neither replaced nor put back; the other method is."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = FRESH_PROCESS_USER_PATCH.format(here=here, kind=kind)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def _args(estimator):
    return SimpleNamespace(
        algo=SimpleNamespace(advantage=SimpleNamespace(estimator=estimator, gamma=0.99,
                                                       lambd=0.95, no_std_norm=False),
                             kl=SimpleNamespace(use_loss=False)),
        rollout=SimpleNamespace(n_samples_per_prompt=2),
        reward=SimpleNamespace(clip_range=None, overlong_buffer_len=None,
                               stop_properly_penalty_coef=None))


def _experiences(seed, n=3):
    out = []
    for i in range(n):
        r, v, m = token_batch(seed + i, n_random=0)  # 8 rows each
        out.append(SimpleNamespace(
            rewards=r[:, 0].float().clone(), values=v.float(), action_mask=m.bool(),
            kl=0.1 * r.float(), index=list(range(8 * i, 8 * i + 8)), info={}))
    return out


@pytest.mark.parametrize("estimator", ["gae", "reinforce", "rloo", "group_norm"])
def test_trainer_step(installed, experience_maker, estimator):
    """OpenRLHF's real ``compute_advantages_and_returns`` (reward shaping, KL, the
    per-experience calls, the normalisation across experiences) with and without
    install(): the same advantages and returns."""
    cls = experience_maker.RemoteExperienceMaker

    def run():
        maker = cls.__new__(cls)
        maker.strategy = SimpleNamespace(args=_args(estimator))
        maker.advantage_estimator = estimator
        maker.kl_ctl = SimpleNamespace(value=0.05)
        exps = maker.compute_advantages_and_returns(_experiences(3))
        return [(e.advantages, e.returns) for e in exps]

    want = run()
    installed.install()
    got = run()
    for (ga, gr), (wa, wr) in zip(got, want):
        torch.testing.assert_close(ga, wa, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gr, wr, rtol=1e-5, atol=1e-5)


def test_import_does_not_import_openrlhf():
    import subprocess
    import sys

    code = ("import sys, rl_triton_openrlhf; "
            "assert not any(m.split('.')[0] in ('openrlhf', 'ray', 'deepspeed') "
            "for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_cuda(experience_maker):
    """On CUDA (the Triton kernels), against OpenRLHF's loop on the same tensors."""
    r, v, m = token_batch(3, T=300, n_random=500)
    r, v, m = r.float().cuda(), v.float().cuda(), m.bool().cuda()
    want = _theirs(experience_maker, "get_advantages_and_returns")(v, r, m, 0.99, 0.95)
    got = ours.get_advantages_and_returns(v, r, m, 0.99, 0.95)
    assert got[0].device.type == "cuda"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    want = _theirs(experience_maker, "get_cumulative_returns")(r, m, 0.99)
    torch.testing.assert_close(ours.get_cumulative_returns(r, m, 0.99), want, rtol=1e-4,
                               atol=1e-4)
