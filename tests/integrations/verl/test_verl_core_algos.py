"""rl_triton_verl's drop-ins against verl 0.9.1's own functions (the real installed
``verl.trainer.ppo.core_algos``) on the CPU path.

Tolerances: float64 data with a float64 mask 1e-12. With an integer mask verl's
``masked_var`` computes the Bessel factor ``n / (n - 1)`` as a float32 number (int64 /
int64 in torch), and ``mask.sum() + 1e-8`` is float32 too, so float64 results differ by
up to ~1e-7 relative: 1e-6 there. float32 1e-5. bfloat16: verl rounds every step of its
loop to bfloat16, the core accumulates in float32 and rounds once, so bf16 is compared
to verl loosely and to the float64 reference at bf16 precision.
"""

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from llm_testlib import as_mask, lengths_trimmed, pack, token_batch
from rl_triton_verl import core_algos as ours

import rl_triton_core as rc
from rl_triton_core import reference as ref

F64 = torch.float64
HAS_CUDA = torch.cuda.is_available()
GAMMAS = [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)]
# (data dtype, mask kind, rtol=atol)
EXACT = [(F64, "float64", 1e-12), (F64, "int64", 1e-6), (torch.float32, "int64", 1e-5),
         (torch.float32, "float32", 1e-5)]  # verl takes no bool mask (1 - mask)


def _close(got, want, tol):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("name", sorted(ours.REGISTRY_NAMES.values()))
def test_same_signature(core_algos, name):
    def params(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(getattr(ours, name)) == params(getattr(core_algos, name))
    assert core_algos.ADV_ESTIMATOR_REGISTRY[
        {v: k for k, v in ours.REGISTRY_NAMES.items()}[name]] is getattr(core_algos, name)


@pytest.mark.parametrize("gamma,lam", GAMMAS)
@pytest.mark.parametrize("dtype,mask_kind,tol", EXACT)
@pytest.mark.parametrize("seed", range(3))
def test_gae(core_algos, dtype, mask_kind, tol, gamma, lam, seed):
    r, v, m = token_batch(seed, dtype=dtype)
    m = as_mask(m, mask_kind)
    inputs = [t.clone() for t in (r, v, m)]
    want = core_algos.compute_gae_advantage_return(r, v, m, gamma, lam)
    got = ours.compute_gae_advantage_return(r, v, m, gamma=gamma, lam=lam)
    for g, w in zip(got, want):
        _close(g, w, tol)
    assert all(torch.equal(a, b) for a, b in zip(inputs, (r, v, m)))  # inputs unchanged


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5])
@pytest.mark.parametrize("dtype,mask_kind,tol", EXACT)
@pytest.mark.parametrize("seed", range(3))
def test_reinforce_plus_plus(core_algos, dtype, mask_kind, tol, gamma, seed):
    r, _, m = token_batch(seed, dtype=dtype)
    m = as_mask(m, mask_kind)
    config = SimpleNamespace(gamma=gamma)
    want = core_algos.compute_reinforce_plus_plus_outcome_advantage(r, m, config=config)
    got = ours.compute_reinforce_plus_plus_outcome_advantage(r, m, config=config)
    for g, w in zip(got, want):
        _close(g, w, tol)


def test_bf16(core_algos):
    """bf16 values with float32 rewards: float32 out like verl's, to the float64
    reference to 1e-5 (verl itself rounds ``gamma * nextvalues`` to bf16 there: python
    float times a bf16 tensor, so it is only close to its own float32 result); bf16
    rewards and values: bf16 out, to the float64 reference at bf16 precision and to
    verl's step-by-step bf16 loop loosely."""
    r, v, m = token_batch(4)
    m = m.long()
    vb = v.bfloat16()
    want = core_algos.compute_gae_advantage_return(r.float(), vb, m, 0.99, 0.95)
    got = ours.compute_gae_advantage_return(r.float(), vb, m, 0.99, 0.95)
    exact = ref.masked_gae(r.float().double(), vb.double(), m, gamma=0.99, lmbda=0.95,
                           skip=True, whiten=True, count_eps=1e-8, time_dim=-1)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == w.dtype == torch.float32
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(g, w, rtol=0.05, atol=0.05)
    rb, vb = r.bfloat16(), v.bfloat16()
    want = core_algos.compute_gae_advantage_return(rb, vb, m, 0.99, 0.95)
    got = ours.compute_gae_advantage_return(rb, vb, m, 0.99, 0.95)
    exact = ref.masked_gae(rb.double(), vb.double(), m, gamma=0.99, lmbda=0.95, skip=True,
                           whiten=True, count_eps=1e-8, time_dim=-1)
    for g, w, e in zip(got, want, exact):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g.double(), e, rtol=2**-7, atol=2**-7)
        torch.testing.assert_close(g.double(), w.double(), rtol=0.05, atol=0.05)


def _groups(seed, n=40):
    gen = torch.Generator().manual_seed(seed)
    r, _, m = token_batch(seed, n_random=n - 8)
    labels = torch.randint(0, 12, (r.shape[0],), generator=gen)
    uids = np.array([f"prompt-{int(i):03d}" for i in labels], dtype=object)
    return r, m, uids


OUTCOME = [("compute_grpo_outcome_advantage", {}),
           ("compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
           ("compute_grpo_vectorized_outcome_advantage", {}),
           ("compute_grpo_vectorized_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
           ("compute_rloo_outcome_advantage", {}),
           ("compute_rloo_vectorized_outcome_advantage", {})]


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,kwargs", OUTCOME)
@pytest.mark.parametrize("seed", range(3))
def test_outcome(core_algos, name, kwargs, dtype, seed):
    """Against verl's loops and vectorised forms. float64: 1e-12 except where verl rounds
    to float32 (GRPO's group of one divides by float32 1 + eps; the vectorised GRPO's
    group statistics are float32): 1e-6 there."""
    r, m, uids = _groups(seed)
    r = r.to(dtype)
    want, want2 = getattr(core_algos, name)(r.clone(), m.long(), uids, **kwargs)
    got, got2 = getattr(ours, name)(r, m.long(), uids, **kwargs)
    assert got is got2 and want is want2
    grpo = "grpo" in name and kwargs.get("norm_adv_by_std_in_grpo", True)
    tol = {F64: 1e-6 if grpo or "grpo_vectorized" in name else 1e-12,
           torch.float32: 1e-5, torch.bfloat16: 0.05}[dtype]
    if dtype == torch.bfloat16 and "grpo_vectorized" in name:
        tol = 1e-5  # verl upcasts there: float32 group statistics (its RLOO's are bf16)
    _close(got, want, tol)


def test_outcome_labels(core_algos):
    """Labels of any kind verl's dict takes: ints, strings, mixed (unsortable) objects."""
    r, m, _ = _groups(9, n=12)
    for uids in (np.arange(12) % 5, np.array(["a", "b", "c"] * 4, dtype=object),
                 np.array([1, "1", 2.5, "x"] * 3, dtype=object), list(range(12))):
        want = core_algos.compute_grpo_outcome_advantage(r.clone(), m, uids)[0]
        _close(ours.compute_grpo_outcome_advantage(r, m, uids)[0], want, 1e-6)
    with pytest.raises(ValueError, match="index"):
        ours.compute_grpo_outcome_advantage(r, m, np.arange(5))


def test_empty_mask_where_verl_raises(core_algos):
    """verl's masked_var reads the mask sum on the host and raises on an empty mask and
    on a mask of one token; the drop-ins do not synchronise and follow the formula
    instead (documented): no valid token gives advantages 0 (the count_eps of 1e-8 keeps
    the mean 0 / 1e-8 = 0, the Bessel factor 0 / -1); one valid token has no unbiased
    variance: NaN, as the float64 reference computes it."""
    r, v, _ = token_batch(1)
    m = torch.zeros_like(r, dtype=torch.long)
    config = SimpleNamespace(gamma=1.0)
    with pytest.raises(ValueError):
        core_algos.compute_gae_advantage_return(r, v, m, 1.0, 1.0)
    with pytest.raises(ValueError):
        core_algos.compute_reinforce_plus_plus_outcome_advantage(r, m, config=config)
    adv, ret = ours.compute_gae_advantage_return(r, v, m, 1.0, 1.0)
    assert torch.equal(adv, torch.zeros_like(adv))
    _close(ret, v, 1e-12)  # nothing valid: A = 0 everywhere, returns = V
    adv, ret = ours.compute_reinforce_plus_plus_outcome_advantage(r, m, config=config)
    assert torch.equal(adv, torch.zeros_like(adv)) and torch.equal(ret, torch.zeros_like(ret))
    m[3, 4] = 1
    with pytest.raises(ValueError):
        core_algos.compute_gae_advantage_return(r, v, m, 1.0, 1.0)
    adv, _ = ours.compute_gae_advantage_return(r, v, m, 1.0, 1.0)
    want = ref.masked_gae(r, v, m, skip=True, whiten=True, count_eps=1e-8, time_dim=-1)[0]
    assert torch.isnan(want).all()
    torch.testing.assert_close(adv, want, equal_nan=True, rtol=1e-12, atol=1e-12)
    adv, ret = ours.compute_reinforce_plus_plus_outcome_advantage(r, m, config=config)
    want = ref.masked_whiten(ret, m, count_eps=1e-8, fill=0.0)
    torch.testing.assert_close(adv, want, equal_nan=True, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="config"):
        ours.compute_reinforce_plus_plus_outcome_advantage(r, m)


def test_tensor_gamma(core_algos):
    """0-dim tensors for gamma and lam (verl's annotation) are read on the host; verl's
    ``gamma * lam`` of two float32 tensors is a float32 product, hence 1e-6."""
    r, v, m = token_batch(2)
    want = core_algos.compute_gae_advantage_return(r, v, m, torch.tensor(0.9), torch.tensor(0.7))
    got = ours.compute_gae_advantage_return(r, v, m, torch.tensor(0.9), torch.tensor(0.7))
    for g, w in zip(got, want):
        _close(g, w, 1e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), row=st.integers(0, 11),
       gamma=st.floats(0.5, 1.0), lam=st.floats(0.0, 1.0))
def test_properties(seed, row, gamma, lam):
    """One sequence alone gives the returns it gets inside a batch (returns are not
    whitened); the packed batch (trailing padding dropped, cu_seqlens) gives the padded
    batch's advantages and returns."""
    r, v, m = token_batch(seed)
    adv, ret = ours.compute_gae_advantage_return(r, v, m, gamma, lam)
    _, ret1 = ours.compute_gae_advantage_return(r[row:row + 1], v[row:row + 1],
                                                m[row:row + 1], gamma, lam)
    torch.testing.assert_close(ret1[0], ret[row], rtol=1e-12, atol=1e-12)
    lengths = lengths_trimmed(m)
    pr, pv, pm, cu = pack(lengths, r, v, m)
    padv, pret = rc.masked_gae(pr, pv, pm, gamma=gamma, lmbda=lam, skip=True, whiten=True,
                               count_eps=1e-8, cu_seqlens=cu, time_dim=-1)
    fadv, fret, _ = pack(lengths, adv, ret)
    torch.testing.assert_close(padv, fadv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pret, fret, rtol=1e-12, atol=1e-12)


def test_trainer_calls_what_install_patches(core_algos):
    """verl's compute_advantage (ray_trainer.py, read as text: importing it needs the
    whole training stack) calls GAE and GRPO by module attribute and the others through
    the registry: install() patches both."""
    import importlib.util
    import pathlib

    spec = importlib.util.find_spec("verl")
    src = (pathlib.Path(spec.origin).parent / "trainer/ppo/ray_trainer.py").read_text()
    for call in ("core_algos.compute_gae_advantage_return(",
                 "core_algos.compute_grpo_outcome_advantage(", "core_algos.get_adv_estimator_fn("):
        assert call in src


def test_install(installed, core_algos):
    reg = core_algos.ADV_ESTIMATOR_REGISTRY
    originals = {k: reg[k] for k in ours.REGISTRY_NAMES}
    other = {k: v for k, v in reg.items() if k not in ours.REGISTRY_NAMES}
    assert not any(installed.is_installed().values())
    installed.install()
    installed.install()  # idempotent
    assert all(installed.is_installed().values())
    for key, name in ours.REGISTRY_NAMES.items():
        assert reg[key] is getattr(ours, name) is getattr(core_algos, name)
        assert core_algos.get_adv_estimator_fn(key) is getattr(ours, name)
    assert {k: v for k, v in reg.items() if k not in ours.REGISTRY_NAMES} == other
    r, v, m = token_batch(0)
    adv, _ = core_algos.compute_gae_advantage_return(r, v, m, 1.0, 1.0)  # what the trainer calls
    assert torch.isfinite(adv).all()
    installed.uninstall()
    installed.uninstall()
    assert {k: reg[k] for k in ours.REGISTRY_NAMES} == originals
    assert all(getattr(core_algos, n) is originals[k] for k, n in ours.REGISTRY_NAMES.items())


def test_install_leaves_a_users_estimator(installed, core_algos):
    reg = core_algos.ADV_ESTIMATOR_REGISTRY
    original = reg["rloo"]

    def mine(**kwargs):
        return None

    reg["rloo"] = mine
    try:
        installed.install()
        assert reg["rloo"] is mine and reg["gae"] is ours.compute_gae_advantage_return
        installed.uninstall()
        assert reg["rloo"] is mine
    finally:
        reg["rloo"] = original


FRESH_PROCESS_USER_PATCHES = r"""
import functools
import verl.trainer.ppo.core_algos as ca
import rl_triton_verl
from rl_triton_verl import core_algos as ours

reg = ca.ADV_ESTIMATOR_REGISTRY
verls = {k: reg[k] for k in ours.REGISTRY_NAMES}
def mine(**kwargs):
    return None
gae = ca.compute_gae_advantage_return
@functools.wraps(gae)  # a user's wrapper, with verl's name and module
def logged(*args, **kwargs):
    return gae(*args, **kwargs)
ca.compute_rloo_outcome_advantage = mine
ca.compute_gae_advantage_return = logged
reg["grpo_vectorized"] = mine

def check():
    assert ca.compute_rloo_outcome_advantage is mine, "the user's attribute replaced"
    assert ca.compute_gae_advantage_return is logged, "the user's wrapper replaced"
    assert reg["grpo_vectorized"] is mine, "the user's registry entry replaced"

rl_triton_verl.install()  # the first install() of this process
check()
for key, name in ours.REGISTRY_NAMES.items():  # verl's own entries: replaced
    if key != "grpo_vectorized":
        assert reg[key] is getattr(ours, name), key
    if name not in ("compute_rloo_outcome_advantage", "compute_gae_advantage_return"):
        assert getattr(ca, name) is getattr(ours, name), name
rl_triton_verl.uninstall()
check()
for key, name in ours.REGISTRY_NAMES.items():
    if key != "grpo_vectorized":
        assert reg[key] is verls[key], key
    if name not in ("compute_rloo_outcome_advantage", "compute_gae_advantage_return"):
        assert getattr(ca, name) is verls[key], name
"""


def test_install_leaves_a_users_patch_made_before_the_first_install(core_algos):
    """In a fresh process (no install() has run yet), a user's own module attribute or
    registry entry, set before install(), is neither replaced nor put back."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", FRESH_PROCESS_USER_PATCHES],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_import_does_not_import_verl():
    import subprocess
    import sys

    code = ("import sys, rl_triton_verl; rl_triton_verl.compute_gae_advantage_return; "
            "assert not any(m == 'verl' or m.startswith('verl.') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name", ["gae", "reinforce_plus_plus", "grpo", "rloo_vectorized"])
def test_cuda(core_algos, name):
    """On CUDA (the Triton kernels), against verl on the same CUDA tensors, float32."""
    r, v, m = token_batch(3, T=300, n_random=500)
    r, v, m = r.float().cuda(), v.float().cuda(), m.long().cuda()
    fn = ours.REGISTRY_NAMES[name]
    if name == "gae":
        args, kwargs = (r, v, m, 0.99, 0.95), {}
    elif name == "reinforce_plus_plus":
        args, kwargs = (r, m), {"config": SimpleNamespace(gamma=0.99)}
    else:
        uids = np.array([f"p{i % 64}" for i in range(r.shape[0])], dtype=object)
        args, kwargs = (r, m, uids), {}
    got = getattr(ours, fn)(*args, **kwargs)
    want = getattr(core_algos, fn)(*args, **kwargs)
    assert got[0].device.type == "cuda"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
