"""The token estimators' C kernel (rl_triton_core.token._ctoken) against the numba path.

Bit for bit (torch.equal, NaN where NaN) on random data: padded with left/right padding
and observation spans, packed with cu_seqlens, float32 / float64 / bfloat16, several
gamma/lambda, whitening on/off, empty responses and single valid tokens; against the
float64 reference at a tolerance; outputs and inputs checked; the forced-numba fallback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import tokens

ck = pytest.importorskip("rl_triton_core.token._ctoken")

ENV = "RL_TRITON_CORE_CPU_KERNEL"


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    na, nb = a.isnan(), b.isnan()
    return torch.equal(na, nb) and torch.equal(a.masked_fill(na, 0), b.masked_fill(nb, 0))


LEVELS = {"avx512": (2, 1, 0), "avx2": (1, 0), "scalar": (0,)}[ck.simd()]


def _close(a, b, rtol=2e-5):
    """Within float32 rounding: NaN where NaN, |a - b| <= rtol * max(1, max |b|)."""
    if isinstance(a, tuple):
        return all(_close(x, y, rtol) for x, y in zip(a, b))
    na, nb = a.isnan(), b.isnan()
    scale = max(1.0, float(b.masked_fill(nb, 0).abs().max())) if b.numel() else 1.0
    return torch.equal(na, nb) and float((a.masked_fill(na, 0) - b.masked_fill(nb, 0))
                                         .abs().max().nan_to_num(0.0) if a.numel() else 0.0
                                         ) <= rtol * scale


def _both(monkeypatch, fn, *args, **kw):
    """numba's result and the C kernel's float64 loops' (the float32 loop off); the C
    kernel's vector paths (AVX-512, AVX2, scalar: those this CPU has) checked to give the
    same bits as each other, and the float32 loop (float32 data on AVX-512), both its
    forms (the row walk and 16 responses a register), within float32 rounding of them."""
    monkeypatch.setenv(ENV, "numba")
    want = fn(*args, **kw)
    monkeypatch.setenv(ENV, "c")
    f32 = ck.use_f32(False)
    was = ck.use_simd(2)
    try:
        got = fn(*args, **kw)
        for level in LEVELS[1:]:
            ck.use_simd(level)
            assert _same(fn(*args, **kw), got), f"SIMD level {level} differs from {LEVELS[0]}"
    finally:
        ck.use_simd(was)
        ck.use_f32(f32)
    walk = ck.use_walk(True)
    try:
        for on in (True, False):  # the float32 loop one response at a time, and 16 a register
            ck.use_walk(on)
            assert _close(fn(*args, **kw), got), (
                f"the float32 loop (walk={on}) is not within float32 rounding")
    finally:
        ck.use_walk(walk)
    return want, got


def _mask(B, T, g, kind):
    t = torch.arange(T)
    lens = torch.randint(0, T + 1, (B,), generator=g)
    if kind == "right":
        m = t[None, :] < lens[:, None]
    elif kind == "left":
        m = t[None, :] >= (T - lens)[:, None]
    else:  # random observation spans inside right padding
        m = (t[None, :] < lens[:, None]) & ~(torch.rand(B, T, generator=g) < 0.2)
    if B > 2:
        m[0] = False  # an empty response
        m[1] = False
        m[1, T // 2] = True  # a single valid token
    return m


SHAPES = [(1, 1), (3, 5), (8, 8), (9, 17), (17, 33), (40, 200)]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_bitwise(monkeypatch, B, T, dtype):
    g = torch.Generator().manual_seed(B * 1000 + T)
    r = torch.randn(B, T, generator=g).to(dtype)
    v = torch.randn(B, T, generator=g).to(dtype)
    for kind, mdt in (("right", torch.int64), ("left", torch.bool), ("obs", torch.float32)):
        m = _mask(B, T, g, kind).to(mdt)
        for gamma, lmbda in ((1.0, 1.0), (0.99, 0.95), (0.0, 0.5)):
            for skip in (True, False):
                for whiten, fill in ((False, None), (True, None), (True, 0.0), (False, 0.0)):
                    want, got = _both(monkeypatch, rc.masked_gae, r, v, m, gamma=gamma,
                                      lmbda=lmbda, skip=skip, whiten=whiten, count_eps=1e-8,
                                      fill=fill, time_dim=-1)
                    assert _same(want, got), (kind, gamma, lmbda, skip, whiten, fill)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mdt", [torch.bool, torch.uint8, torch.int16, torch.int32,
                                 torch.int64, torch.float64, torch.bfloat16])
def test_returns_and_whiten_bitwise(monkeypatch, dtype, mdt):
    g = torch.Generator().manual_seed(7)
    r = torch.randn(19, 41, generator=g).to(dtype)
    m = _mask(19, 41, g, "obs").to(mdt)
    for skip in (True, False):
        want, got = _both(monkeypatch, rc.masked_returns, r, m, gamma=0.97, skip=skip,
                          time_dim=-1)
        assert _same(want, got)
    for shift in (True, False):
        for fill in (None, 0.0):
            want, got = _both(monkeypatch, rc.masked_whiten, r, m, shift_mean=shift, fill=fill,
                              count_eps=1e-8)
            assert _same(want, got)


def test_mixed_dtypes_and_strides(monkeypatch):
    g = torch.Generator().manual_seed(3)
    r = torch.randn(12, 70, generator=g)
    v = torch.randn(12, 70, generator=g).to(torch.bfloat16)
    m = _mask(12, 70, g, "obs")
    want, got = _both(monkeypatch, lambda: rc.masked_gae(r, v, m, gamma=0.9, lmbda=0.8,
                                                         whiten=True, time_dim=-1))
    assert _same(want, got)
    assert got[0].dtype == torch.float32
    # [T, B] data: the token axis strided
    want, got = _both(monkeypatch, lambda: rc.masked_gae(r.t(), v.t(), m.t(), gamma=0.9,
                                                         lmbda=0.8, whiten=True, time_dim=0))
    assert _same(want, got)
    # every other column: strided tokens
    want, got = _both(monkeypatch, lambda: rc.masked_gae(r[:, ::2], v[:, ::2], m[:, ::2],
                                                         whiten=True, time_dim=-1))
    assert _same(want, got)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_bitwise(monkeypatch, dtype):
    g = torch.Generator().manual_seed(11)
    n = 600
    r = torch.randn(n, generator=g).to(dtype)
    v = torch.randn(n, generator=g).to(dtype)
    m = torch.rand(n, generator=g) < 0.7
    cu = torch.tensor([0, 0, 1, 9, 57, 58, 300, 600])  # empty, 1-token and long responses
    for skip in (True, False):
        for whiten in (False, True):
            want, got = _both(monkeypatch, rc.masked_gae, r, v, m, gamma=0.99, lmbda=0.9,
                              skip=skip, whiten=whiten, cu_seqlens=cu, time_dim=-1)
            assert _same(want, got)
        want, got = _both(monkeypatch, rc.masked_returns, r, m, skip=skip, gamma=0.9,
                          cu_seqlens=cu, time_dim=-1)
        assert _same(want, got)


def test_threads_bitwise(monkeypatch):
    """Large enough for two threads (and the AVX2 groups' split)."""
    g = torch.Generator().manual_seed(5)
    r = torch.randn(37, 2051, generator=g)
    v = torch.randn(37, 2051, generator=g)
    m = _mask(37, 2051, g, "obs").long()
    want, got = _both(monkeypatch, lambda: rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95,
                                                         whiten=True, count_eps=1e-8,
                                                         time_dim=-1))
    assert _same(want, got)


def test_against_reference():
    g = torch.Generator().manual_seed(2)
    B, T = 6, 50
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = _mask(B, T, g, "obs")
    adv, ret = rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, time_dim=-1)
    rd, vd, md = r.double(), v.double(), m.double()
    nv = torch.zeros(B, dtype=torch.float64)
    a = torch.zeros(B, dtype=torch.float64)
    want = torch.zeros(B, T, dtype=torch.float64)
    for t in reversed(range(T)):  # verl's loop in float64
        delta = rd[:, t] + 0.99 * nv - vd[:, t]
        a_new = delta + 0.99 * 0.95 * a
        nv = vd[:, t] * md[:, t] + (1 - md[:, t]) * nv
        a = a_new * md[:, t] + (1 - md[:, t]) * a
        want[:, t] = a
    torch.testing.assert_close(adv.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ret.double(), want + vd, rtol=1e-5, atol=1e-5)
    w, _ = rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, whiten=True, count_eps=1e-8,
                         time_dim=-1)
    sel = want[m]
    mean = sel.sum() / (m.sum() + 1e-8)
    var = ((sel - mean) ** 2).sum() / (m.sum() + 1e-8) * (m.sum() / (m.sum() - 1))
    torch.testing.assert_close(w.double(), (want - mean) / torch.sqrt(var + 1e-8), rtol=1e-5,
                               atol=1e-5)


def test_outputs_written_and_inputs_kept():
    """Every output element is written (NaN-poisoned buffers), inputs are not modified."""
    g = torch.Generator().manual_seed(4)
    B, T = 11, 37
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = _mask(B, T, g, "obs")
    copies = [t.clone() for t in (r, v, m)]
    for mode in (0, 1, 2, 3):
        o0 = torch.full((B, T), float("nan"))
        o1 = torch.full((B, T), float("nan"))
        two = mode < 2
        ck.run(mode, r.numpy(), v.numpy() if two else None, m.numpy().view("uint8"), None,
               None, 0.9, 0.8, o0.numpy(), o1.numpy() if two else None, 1, 1e-8, 1e-8, True,
               True, None, 2)
        assert not o0.isnan().any()
        assert not two or not o1.isnan().any()
    for t, c in zip((r, v, m), copies):
        assert torch.equal(t, c)


def test_pooled_outputs_reused_and_independent():
    g = torch.Generator().manual_seed(6)
    r, v = torch.randn(64, 4096, generator=g), torch.randn(64, 4096, generator=g)
    m = torch.ones(64, 4096, dtype=torch.bool)
    a1, b1 = rc.masked_gae(r, v, m, time_dim=-1)
    keep = a1.clone()
    a2, b2 = rc.masked_gae(r * 2, v, m, time_dim=-1)  # must not write into a1 / b1
    assert torch.equal(a1, keep)
    assert a1.data_ptr() not in (a2.data_ptr(), b2.data_ptr())
    del a1, b1
    before = ck.cache_info()["blocks"]
    a3, _ = rc.masked_gae(r, v, m, time_dim=-1)  # takes a freed block
    assert ck.cache_info()["blocks"] == before - 2 or before < 2
    assert torch.equal(a3, keep)
    a3.add_(1.0)  # an ordinary writable tensor
    assert torch.equal(a3, keep + 1.0)


def test_bad_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="r "):
        ck.run(0, object(), x.numpy(), x.numpy(), None, None, 1.0, 1.0, x.numpy(), x.numpy(),
               0, 0.0, 0.0, True, True, None, 1)
    with pytest.raises(ValueError, match="out0 must have shape"):
        ck.run(0, x.numpy(), x.numpy(), x.numpy(), None, None, 1.0, 1.0,
               torch.zeros(3, 3).numpy(), x.numpy(), 0, 0.0, 0.0, True, True, None, 1)
    with pytest.raises(TypeError, match="m has an unsupported"):
        ck.run(0, x.numpy(), x.numpy(), x.to(torch.complex64).numpy(), None, None, 1.0, 1.0,
               x.numpy(), x.numpy(), 0, 0.0, 0.0, True, True, None, 1)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rc.masked_gae(torch.zeros(5), torch.zeros(5), torch.ones(5), time_dim=-1,
                      cu_seqlens=torch.tensor([0, 3, 9]))


def test_forced_numba_fallback(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.setenv(ENV, "numba")
    assert tokens._ckernel() is None
    adv, ret = rc.masked_gae(torch.tensor([[0.0, 0.0, 1.0, 0.0]]),
                             torch.tensor([[0.5, 0.6, 0.7, 0.0]]),
                             torch.tensor([[1, 0, 1, 0]]), time_dim=-1)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.3, 0.3, 0.0]]))


def test_c_path_does_not_import_numba():
    code = ("import sys, torch, rl_triton_core as rc\n"
            "r = torch.randn(4, 300)\n"
            "rc.masked_gae(r, r, r > 0, whiten=True, time_dim=-1)\n"
            "rc.masked_returns(r, r > 0, time_dim=-1)\n"
            "rc.masked_whiten(r, r > 0)\n"
            "assert 'numba' not in sys.modules, 'numba imported'\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != ENV}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_loop_matches_vector_loop(dtype):
    """The padded batch as an explicit layout runs the scalar loop (the AVX2 groups run
    padded data only): the same bits."""
    import numpy as np

    g = torch.Generator().manual_seed(9)
    B, T = 13, 29
    r = torch.randn(B, T, generator=g).to(dtype)
    v = torch.randn(B, T, generator=g).to(dtype)
    m = _mask(B, T, g, "obs")
    layout = (np.arange(B, dtype=np.int64), np.zeros(B, dtype=np.int64),
              np.full(B, T, dtype=np.int64))
    was = ck.use_f32(False)  # the float64 loops (the float32 loop: see below)
    try:
        _scalar_vs_vector(r, v, m, layout, B, T, dtype)
    finally:
        ck.use_f32(was)


def _scalar_vs_vector(r, v, m, layout, B, T, dtype):
    for mode in (0, 1, 2, 3):
        outs = []
        for lay in (None, layout):
            o0, o1 = torch.empty(B, T, dtype=torch.float64), torch.empty(B, T, dtype=torch.float64)
            if dtype == torch.float32:
                o0, o1 = o0.float(), o1.float()
            two = mode < 2
            mu = ck.run(mode, tokens._np(r), tokens._np(v) if two else None, tokens._np_mask(m),
                        None, lay, 0.95, 0.9, o0.numpy(), o1.numpy() if two else None, 1, 1e-8,
                        1e-8, True, True, None, 1)
            outs.append((o0, o1 if two else o0, mu))
        assert _same(outs[0][:2], outs[1][:2]) and outs[0][2] == outs[1][2]


def test_streamed_stores_bitwise(monkeypatch):
    """Outputs large enough (>= 4 MiB together) for the streamed stores, with a group of
    fewer than 8 rows at the end."""
    g = torch.Generator().manual_seed(8)
    B, T = 260, 8192
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = _mask(B, T, g, "obs").long()
    want, got = _both(monkeypatch, rc.masked_gae, r, v, m, gamma=0.99, lmbda=0.95,
                      whiten=True, count_eps=1e-8, time_dim=-1)
    assert _same(want, got)
    want, got = _both(monkeypatch, rc.masked_returns, r, m, gamma=0.99, time_dim=-1)
    assert _same(want, got)
    # the whitening streamed too: responses starting anywhere in a line (left padding),
    # the mean kept or not, in place (masked_gae) or from the input (masked_whiten)
    m = _mask(B, T, g, "left").long()
    want, got = _both(monkeypatch, rc.masked_gae, r, v, m, gamma=0.99, lmbda=0.95,
                      whiten=True, time_dim=-1)
    assert _same(want, got)
    for shift in (True, False):
        want, got = _both(monkeypatch, rc.masked_whiten, r, m, shift_mean=shift)
        assert _same(want, got)



@pytest.mark.skipif(ck.simd() != "avx512", reason="the float32 loop runs on AVX-512 only")
@pytest.mark.parametrize("walk", [True, False])
@pytest.mark.parametrize("skip", [True, False])
def test_float32_loop_against_reference(skip, walk):
    """The float32 loop (one response at a time where the CPU has AVX-512 VPOPCNTDQ, else
    and with ``walk=False`` 16 responses a register) at verl's defaults (gamma = lambda =
    1, the longest sums) against the float64 reference, whitened and not; a partial group
    (21 rows) and a partial last block (8190 tokens); and it does run (its bits differ
    from the float64 loop's somewhere)."""
    from rl_triton_core import reference

    g = torch.Generator().manual_seed(13)
    B, T = 21, 8190
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = _mask(B, T, g, "obs").long()
    for gamma, lmbda in ((1.0, 1.0), (0.99, 0.95)):
        adv64, ret64 = reference.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip,
                                            time_dim=-1)
        was, walked = ck.use_f32(True), ck.use_walk(walk)
        try:
            adv, ret = rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip, time_dim=-1)
            wht, _ = rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip, whiten=True,
                                   count_eps=1e-8, time_dim=-1)
            ck.use_f32(False)
            adv_f64, _ = rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip,
                                       time_dim=-1)
        finally:
            ck.use_f32(was)
            ck.use_walk(walked)
        assert not torch.equal(adv, adv_f64), "the float32 loop did not run"
        assert _close(adv.double(), adv64, 1e-5) and _close(ret.double(), ret64, 1e-5)
        want = reference.masked_whiten(adv64, m, count_eps=1e-8)
        assert _close(wht.double(), want, 1e-5)


@pytest.mark.skipif(not hasattr(ck, "has_walk") or not ck.has_walk(),
                    reason="the float32 row walk needs AVX-512 VPOPCNTDQ")
@pytest.mark.parametrize("mdt", [torch.bool, torch.int64, torch.float32])
def test_row_walk_against_the_group_loop(mdt):
    """The float32 row walk (one response at a time, the masked tokens compressed out of
    each 16-token block) against the float32 loop over 16 responses a register, every
    mode: within float32 rounding, and not the same bits (the walk ran). Lengths around
    the 16-token blocks, gamma lambda 0 (the rounds' coefficient) and 1, whitened and not,
    NaN rewards on masked tokens."""
    g = torch.Generator().manual_seed(21)
    differs = False
    for B, T in ((5, 1), (7, 15), (9, 16), (17, 17), (33, 95), (4, 1000)):
        r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
        m = _mask(B, T, g, "obs")
        r = r.masked_fill(~m & (torch.rand(B, T, generator=g) < 0.3), float("nan"))
        mm = m.to(mdt)
        for gamma, lmbda in ((1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5)):
            outs = {}
            for walk in (True, False):
                was = ck.use_walk(walk)
                try:
                    outs[walk] = [
                        x for skip in (True, False) for whiten in (False, True)
                        for x in rc.masked_gae(r, v, mm, gamma=gamma, lmbda=lmbda, skip=skip,
                                               whiten=whiten, count_eps=1e-8, time_dim=-1)
                    ] + [rc.masked_returns(r, mm, gamma=gamma, skip=skip, time_dim=-1)
                         for skip in (True, False)]
                finally:
                    ck.use_walk(was)
            for a, b in zip(outs[True], outs[False]):
                assert _close(a.double(), b.double()), (B, T, gamma, lmbda)
                differs |= not _same(a, b)
    assert differs, "the row walk did not run (the same bits as the group loop everywhere)"
