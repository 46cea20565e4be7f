"""group_advantages (GRPO, Dr. GRPO, RLOO) against the float64 per-group loop of
rl_triton_core.reference and against verl 0.9.1's own functions (when verl is installed).

Tolerances: float64 1e-12, float32 1e-6 relative (one rounding of a float64 result),
bfloat16 one bf16 ulp (2**-8 relative) against the reference computed from the same
bf16 scores. verl computes in the scores' dtype (its bf16 loop rounds at every step),
so against verl bf16 is compared loosely and float32 to 1e-5.
"""

import doctest

import numpy as np
import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import groups, reference

METHODS = ("grpo", "grpo_mean", "rloo")
TOL = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-6, 1e-6),
       torch.bfloat16: (2.0**-8, 1e-6)}
HAS_CUDA = torch.cuda.is_available()


def _batch(seed, n_groups=12, max_size=16, dtype=torch.float64, binary=False, shuffle=True):
    """Random groups of sizes 1..max_size (ids shuffled, not contiguous), random scores."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, max_size + 1, (n_groups,), generator=gen)
    sizes[0] = 1  # always a group of one
    labels = torch.randperm(4 * n_groups, generator=gen)[:n_groups]  # sparse ids
    group = torch.repeat_interleave(labels, sizes)
    if shuffle:
        group = group[torch.randperm(group.numel(), generator=gen)]
    if binary:
        scores = torch.randint(0, 2, group.shape, generator=gen).to(torch.float64)
    else:
        scores = 2.0 * torch.randn(group.shape, generator=gen, dtype=torch.float64) + 0.5
    return scores.to(dtype), group


def _close(got, want, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.to(torch.float64), want.to(torch.float64), rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("seed", range(4))
def test_matches_reference(method, dtype, seed):
    scores, group = _batch(seed, dtype=dtype)
    before = scores.clone()
    got = rc.group_advantages(scores, group, method=method, num_groups=4 * 12)
    assert got.dtype == dtype and got.shape == scores.shape
    assert torch.equal(scores, before)  # inputs never modified
    _close(got, reference.group_advantages(scores, group, method=method), dtype)


@pytest.mark.parametrize("method", METHODS)
def test_default_num_groups_and_int32_ids(method):
    scores, group = _batch(7, n_groups=5)
    group = torch.unique(group, return_inverse=True)[1].to(torch.int32)  # ids < B
    want = reference.group_advantages(scores, group, method=method)
    _close(rc.group_advantages(scores, group, method=method), want, torch.float64)


@pytest.mark.parametrize("method", METHODS)
def test_ties_give_exact_zero(method):
    """A group whose scores are all equal has advantage exactly 0 (std 0: GRPO divides
    0 by eps), for any value (the float64 mean of equal float32 values is exact)."""
    x = torch.tensor([0.1, 0.1, 0.1, 7.3, 7.3, -2.2, -2.2, -2.2, -2.2], dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert torch.equal(rc.group_advantages(x, g, method=method), torch.zeros_like(x))


@pytest.mark.parametrize("method", METHODS)
def test_singletons(method):
    x = torch.tensor([1.5, -2.0, 0.25], dtype=torch.float64)
    got = rc.group_advantages(x, torch.tensor([2, 0, 1]), method=method)
    want = x / (1 + 1e-6) if method == "grpo" else x
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)


def test_eps_and_permutation():
    scores, group = _batch(3)
    for eps in (0.0, 1e-3):
        want = reference.group_advantages(scores, group, method="grpo", eps=eps)
        _close(rc.group_advantages(scores, group, eps=eps), want, torch.float64)
    perm = torch.randperm(scores.numel(), generator=torch.Generator().manual_seed(1))
    a = rc.group_advantages(scores, group)
    b = rc.group_advantages(scores[perm], group[perm])
    torch.testing.assert_close(b, a[perm], rtol=1e-13, atol=1e-13)


def test_repeatable_bitwise():
    scores, group = _batch(5, dtype=torch.float32)
    a = rc.group_advantages(scores, group)
    assert torch.equal(a, rc.group_advantages(scores, group))


def test_empty_and_sizes():
    empty = rc.group_advantages(torch.empty(0), torch.empty(0, dtype=torch.long))
    assert empty.shape == (0,)
    sizes = groups.group_sizes(torch.tensor([3, 3, 0, 3, 1]))
    assert sizes.tolist() == [3, 3, 1, 3, 1]


def test_gradient_flows():
    scores = torch.randn(6, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    torch.autograd.gradcheck(lambda s: rc.group_advantages(s, g, method="grpo"), (scores,))


def test_bad_input():
    s, g = torch.randn(4), torch.tensor([0, 0, 1, 1])
    with pytest.raises(TypeError, match="scores"):
        rc.group_advantages(torch.tensor([1, 2, 3, 4]), g)
    with pytest.raises(ValueError, match="scores"):
        rc.group_advantages(s.reshape(2, 2), g)
    with pytest.raises(TypeError, match="group"):
        rc.group_advantages(s, g.float())
    with pytest.raises(TypeError, match="group"):
        rc.group_advantages(s, g.bool())
    with pytest.raises(ValueError, match="group"):
        rc.group_advantages(s, g[:3])
    with pytest.raises(ValueError, match="method"):
        rc.group_advantages(s, g, method="ppo")
    with pytest.raises(ValueError, match="eps"):
        rc.group_advantages(s, g, eps=-1.0)
    with pytest.raises(TypeError, match="num_groups"):
        rc.group_advantages(s, g, num_groups=2.0)
    with pytest.raises(ValueError, match="num_groups"):
        rc.group_advantages(s, g, num_groups=0)
    with pytest.raises(TypeError, match="group"):
        rc.group_advantages(s, [0, 0, 1, 1])


@pytest.mark.parametrize("fn", [groups.group_advantages, groups.group_sizes])
def test_docstring_example(fn):
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(recurse=False).find(fn, fn.__name__, globs={}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0


# --- against verl's own functions ---------------------------------------------------

def _verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos")


def _verl_case(seed, dtype, binary=False):
    scores, group = _batch(seed, dtype=torch.float64, binary=binary)
    uids = np.array([f"uid-{int(i)}" for i in group], dtype=object)
    gen = torch.Generator().manual_seed(seed + 100)
    T = 5
    # token rewards summing to the score (outcome reward on one token, the rest zero)
    last = torch.randint(0, T, (scores.numel(),), generator=gen)
    rewards = torch.zeros(scores.numel(), T, dtype=torch.float64)
    rewards[torch.arange(scores.numel()), last] = scores
    mask = (torch.rand(scores.numel(), T, generator=gen) > 0.3).long()
    return rewards.to(dtype), mask, uids, group


VERL_METHODS = [("compute_grpo_outcome_advantage", "grpo", {}),
                ("compute_grpo_outcome_advantage", "grpo_mean",
                 {"norm_adv_by_std_in_grpo": False}),
                ("compute_rloo_outcome_advantage", "rloo", {})]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("verl_name,method,kwargs", VERL_METHODS)
@pytest.mark.parametrize("binary", [False, True])
def test_matches_verl(verl_name, method, kwargs, dtype, binary):
    """Same numbers as verl's per-group loops. One documented difference: for a group of
    one verl divides by ``torch.tensor(1.0) + epsilon``, which is float32 (1 + 2**-20),
    so float64 singletons under GRPO agree to 5e-8 relative, not 1e-12."""
    core_algos = _verl()
    rewards, mask, uids, group = _verl_case(11, dtype, binary)
    want, want2 = getattr(core_algos, verl_name)(rewards.clone(), mask, uids, **kwargs)
    assert want is want2
    scores = rewards.sum(dim=-1)
    got = rc.group_advantages(scores, group, method=method).unsqueeze(-1) * mask
    assert got.dtype == want.dtype
    if dtype == torch.bfloat16:  # verl rounds mean, std and every step to bf16
        torch.testing.assert_close(got.double(), want.double(), rtol=0.03, atol=0.03)
        return
    single = groups.group_sizes(group) == 1
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got[~single].double(), want[~single].double(), rtol=rtol,
                               atol=rtol)
    if method == "grpo" and dtype == torch.float64:
        rtol = 5e-8
    torch.testing.assert_close(got[single].double(), want[single].double(), rtol=rtol,
                               atol=rtol)
    if binary:  # 0/1 rewards: the same ties, exactly zero where verl's are
        assert torch.equal(got == 0, want == 0)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_cuda_matches_cpu(method, dtype):
    scores, group = _batch(2, n_groups=300, dtype=dtype)
    cpu = rc.group_advantages(scores, group, method=method, num_groups=1200)
    s, g = scores.cuda(), group.cuda()
    a = rc.group_advantages(s, g, method=method, num_groups=1200)
    b = rc.group_advantages(s, g, method=method, num_groups=1200)
    assert a.device.type == "cuda" and torch.equal(a, b)  # repeatable
    _close(a.cpu(), reference.group_advantages(scores, group, method=method), dtype)
    _close(a.cpu(), cpu, dtype)


# --- the one-launch Triton kernel (interpreter without CUDA, and on CUDA) ------------

@pytest.fixture
def kernel_runs(impl, tuned, monkeypatch):
    """Counts the kernel's full launches and its replays (recorded calls, in Python or
    in C); a fresh table of records. Skips the CPU path, which has no such kernel."""
    if impl.name == "cpu":
        pytest.skip("the one-launch kernel is the Triton path's")
    from core_testlib import spy_c_replay

    from rl_triton_core import _tl
    from rl_triton_core.scan import _dispatch
    from rl_triton_core.token import _group_kernel

    if impl.is_interp:
        tuned(cpu_plans=True)
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    count = {"full": 0, "replay": 0}
    real_run, real_replay = _group_kernel.run, _tl.Replay.__call__

    def run(*a, **k):
        count["full"] += 1
        return real_run(*a, **k)

    def replay(self, args):
        count["replay"] += 1
        return real_replay(self, args)

    monkeypatch.setattr(_group_kernel, "run", run)
    monkeypatch.setattr(_tl.Replay, "__call__", replay)

    class Counted:  # a CUDA call repeated in C
        @staticmethod
        def append(res):
            count["replay"] += 1

    spy_c_replay(monkeypatch, Counted)
    return count


# the interpreter truncates float32 to bfloat16 (the GPU rounds): one bf16 ulp there
_KTOL = {**TOL, torch.bfloat16: (2.0**-7, 1e-6)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", METHODS)
def test_kernel_matches_reference(impl, kernel_runs, method, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n_groups = int(torch.randint(1, 40, (1,), generator=gen))
    scores, group = _batch(seed, n_groups=n_groups, dtype=dtype)
    group = group.to([torch.int64, torch.int32, torch.int16][seed % 3])
    s, g = scores.to(impl.device), group.to(impl.device)
    before = s.clone()
    got = rc.group_advantages(s, g, method=method, num_groups=4 * n_groups)
    assert kernel_runs["full"] == 1 and got.dtype == dtype
    assert torch.equal(s, before)
    want = reference.group_advantages(scores, group, method=method)
    rtol, atol = _KTOL[dtype]
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=rtol, atol=atol)
    again = rc.group_advantages(s, g, method=method, num_groups=4 * n_groups)
    assert kernel_runs == {"full": 1, "replay": 1}  # the recorded launch, the same bits
    assert torch.equal(again, got)
    # after the record, what the full path refuses is still refused
    with pytest.raises(ValueError, match="method"):
        rc.group_advantages(s, g, method="ppo", num_groups=4 * n_groups)
    with pytest.raises(ValueError, match="eps"):
        rc.group_advantages(s, g, method=method, eps=-1.0, num_groups=4 * n_groups)
    with pytest.raises(TypeError, match="num_groups"):
        rc.group_advantages(s, g, method=method, num_groups=2.0)
    with pytest.raises(TypeError, match="group"):
        rc.group_advantages(s, g.to(dtype), method=method)


def test_kernel_strided_views_and_ties(impl, kernel_runs):
    """Scores and ids read through strides (every other element of a larger tensor),
    groups of equal scores exactly 0, singletons s / (1 + eps)."""
    x = torch.tensor([0.1, 0.1, 0.1, 7.3, 7.3, -2.2, -2.2, -2.2, -2.2, 5.0],
                     dtype=torch.float32)
    g = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    xs = torch.stack([x, -x], 1).reshape(-1)[::2].to(impl.device)
    gs = torch.stack([g, g + 7], 1).reshape(-1)[::2].to(impl.device)
    assert xs.stride(0) == 2 and gs.stride(0) == 2
    for method in METHODS:
        got = rc.group_advantages(xs, gs, method=method).cpu()
        assert torch.equal(got[:9], torch.zeros(9))
        want = torch.tensor(5.0 / (1 + 1e-6) if method == "grpo" else 5.0)
        assert torch.equal(got[9], want)
    assert kernel_runs["full"] == 3


def test_kernel_sizes_and_fallbacks(impl, kernel_runs, monkeypatch):
    """One score; the largest batch one program holds; a larger batch, a gradient to
    track and a call under grad mode go through PyTorch's operations instead."""
    from rl_triton_core.token import _group_kernel

    one = rc.group_advantages(torch.tensor([2.5], device=impl.device), torch.tensor(
        [3], device=impl.device))
    assert kernel_runs["full"] == 1 and one.item() == pytest.approx(2.5 / (1 + 1e-6))
    monkeypatch.setattr(_group_kernel, "MAX_B", 64)
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(64, generator=gen, dtype=torch.float64)
    group = torch.randint(0, 9, (64,), generator=gen)
    s, g = scores.to(impl.device), group.to(impl.device)
    for b, runs in ((64, 2), (63, 3)):  # at the limit (and below): the kernel
        got = rc.group_advantages(s[:b], g[:b])
        assert kernel_runs["full"] == runs
        _close(got.cpu(), reference.group_advantages(scores[:b], group[:b]), torch.float64)
    big = torch.cat([s, s[:1]]), torch.cat([g, g[:1]])  # 65: PyTorch's operations
    _close(rc.group_advantages(*big).cpu(),
           reference.group_advantages(big[0].cpu(), big[1].cpu()), torch.float64)
    leaf = s[:8].clone().requires_grad_(True)
    pairs = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2], device=impl.device)  # (no group of one)
    torch.autograd.gradcheck(lambda t: rc.group_advantages(t, pairs), (leaf,))
    with torch.no_grad():  # no gradient taken: the kernel, though the leaf asks for one
        rc.group_advantages(leaf, pairs)
    assert kernel_runs["full"] == 4
    from torch.autograd import forward_ad as fwad

    x = s[:8].clone()
    with fwad.dual_level():  # forward mode: the tangent comes through (PyTorch's path)
        out = rc.group_advantages(fwad.make_dual(x, torch.ones_like(x)), pairs)
        assert fwad.unpack_dual(out).tangent is not None
    ties = torch.tensor([1.0, 1.0, 2.0, 2.0], device=impl.device)
    for eps in (1e-50, 1e40):  # eps that two float32s do not carry: PyTorch's path
        got = rc.group_advantages(ties, torch.tensor([0, 0, 1, 1], device=impl.device),
                                  eps=eps)
        assert torch.equal(got.cpu(), torch.zeros(4))
    assert kernel_runs["full"] == 4
