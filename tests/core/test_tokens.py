"""Token-level estimators (masked GAE, masked returns, masked whitening) against the
float64 reference loops (the frameworks' own loops), on the CPU path, the Triton
interpreter and CUDA; packed equals padded; one response equals itself in a batch."""

from __future__ import annotations

import os

import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import reference as ref

INTERP = os.environ.get("TRITON_INTERPRET") == "1"


def _backends():
    out = [pytest.param(("cpu", "cpu"), id="numba")]
    if INTERP:
        out.append(pytest.param(("cpu", "triton"), id="interpreter"))
    out.append(pytest.param(("cuda", "auto"), id="cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]))
    return out


@pytest.fixture(params=_backends())
def where(request, monkeypatch):
    device, backend = request.param
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", backend)
    return device, backend


def _mask(g, B, T, kind):
    """Right padding, left padding, multi-turn observation spans, all-masked rows."""
    lens = torch.randint(0, T + 1, (B,), generator=g)
    t = torch.arange(T)
    if kind == "right":
        m = t[None, :] < lens[:, None]
    elif kind == "left":
        m = t[None, :] >= (T - lens)[:, None]
    else:  # multi-turn: valid spans with observation tokens between them
        m = torch.rand(B, T, generator=g) < 0.7
        spans = torch.rand(B, T, generator=g) < 0.15
        m &= ~spans.cumsum(1).remainder(2).bool()
        m &= t[None, :] < lens[:, None]
    if B > 2:
        m[1] = False  # an all-masked row
    return m


def _inputs(seed, B, T, dtype, kind, device, mask_dtype=torch.bool):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = _mask(g, B, T, kind)
    return (r.to(dtype).to(device), v.to(dtype).to(device), m.to(mask_dtype).to(device))


def _tol(dtype):
    return {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 3e-2)


def _close(got, want, dtype, what):
    assert not torch.isnan(got).any() or torch.isnan(want).any(), what
    tol = _tol(dtype)
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=tol, atol=tol * 10,
                               msg=lambda s: f"{what}: {s}")


def _shapes(backend):
    if backend == "triton":  # the interpreter is slow
        return [(1, 1), (3, 7), (4, 40)]
    return [(1, 1), (3, 7), (5, 300), (8, 1100)]


@pytest.mark.parametrize("kind", ["right", "left", "multi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("skip", [True, False])
def test_masked_gae(where, kind, dtype, skip):
    device, backend = where
    for i, (B, T) in enumerate(_shapes(backend)):
        seed = 1000 * i + 7
        r, v, m = _inputs(seed, B, T, dtype, kind, device)
        gamma, lmbda = 0.5 + 0.5 * torch.rand(()).item(), torch.rand(()).item()
        a, ret = rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip, time_dim=-1)
        wa, wret = ref.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, skip=skip, time_dim=-1)
        what = f"seed={seed} B={B} T={T} {dtype} {kind} skip={skip}"
        assert a.dtype == dtype and a.shape == r.shape and a.device == r.device
        _close(a, wa, dtype, "advantages " + what)
        _close(ret, wret, dtype, "returns " + what)


@pytest.mark.parametrize("small_tokens", [4096, 0])  # one launch where small; two
@pytest.mark.parametrize("kind", ["right", "multi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("count_eps,fill", [(1e-8, None), (0.0, 0.0)])
def test_masked_gae_whitened(where, kind, dtype, count_eps, fill, small_tokens, monkeypatch):
    # bfloat16 data: the advantages are whitened as stored, rounded to bfloat16, against
    # the float64 reference on the same inputs (bfloat16's tolerance)
    monkeypatch.setattr(rc._config, "_current",
                        rc.current_tuning().replace(small_tokens=small_tokens))
    device, backend = where
    for i, (B, T) in enumerate(_shapes(backend)[1:]):
        seed = 1000 * i + 11
        r, v, m = _inputs(seed, B, T, dtype, kind, device)
        m[0, 0] = True
        m[0, -1] = True  # at least two valid tokens
        a, ret = rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, whiten=True,
                               count_eps=count_eps, fill=fill, time_dim=-1)
        wa, wret = ref.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, whiten=True,
                                  count_eps=count_eps, fill=fill, time_dim=-1)
        what = f"seed={seed} B={B} T={T} {dtype} {kind}"
        _close(a, wa, dtype, "whitened advantages " + what)
        _close(ret, wret, dtype, "returns " + what)


@pytest.mark.parametrize("kind", ["right", "left", "multi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("skip", [True, False])
def test_masked_returns(where, kind, dtype, skip):
    device, backend = where
    for i, (B, T) in enumerate(_shapes(backend)):
        seed = 1000 * i + 13
        r, _, m = _inputs(seed, B, T, dtype, kind, device, mask_dtype=torch.float32)
        got = rc.masked_returns(r, m, gamma=0.9, skip=skip, time_dim=-1)
        want = ref.masked_returns(r, m, gamma=0.9, skip=skip, time_dim=-1)
        _close(got, want, dtype, f"seed={seed} B={B} T={T} {dtype} {kind} skip={skip}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift_mean", [True, False])
@pytest.mark.parametrize("count_eps,fill,unbiased", [(1e-8, None, True), (0.0, 0.0, True),
                                                      (0.0, None, False)])
@pytest.mark.parametrize("small_tokens", [4096, 0])
def test_masked_whiten(where, dtype, shift_mean, count_eps, fill, unbiased, small_tokens,
                       monkeypatch):
    monkeypatch.setattr(rc._config, "_current",
                        rc.current_tuning().replace(small_tokens=small_tokens))
    device, backend = where
    for i, (B, T) in enumerate(_shapes(backend)[1:]):
        seed = 1000 * i + 17
        r, _, m = _inputs(seed, B, T, dtype, "multi", device, mask_dtype=torch.int64)
        m[0, :2] = 1
        x = (r * 3 + 5)[:, ::2] if T > 2 else r  # strided, nonzero mean
        mm = m[:, ::2] if T > 2 else m
        got = rc.masked_whiten(x, mm, shift_mean=shift_mean, unbiased=unbiased,
                               count_eps=count_eps, fill=fill)
        want = ref.masked_whiten(x, mm, shift_mean=shift_mean, unbiased=unbiased,
                                 count_eps=count_eps, fill=fill)
        _close(got, want, dtype, f"seed={seed} B={B} T={T} {dtype}")


def test_packed_equals_padded(where):
    device, backend = where
    B, T = (3, 30) if backend == "triton" else (9, 500)
    for seed in range(3):
        r, v, m = _inputs(seed, B, T, torch.float64, "multi", device)
        g = torch.Generator().manual_seed(seed)
        lens = torch.randint(0, T + 1, (B,), generator=g)
        lens[0] = T
        keep = torch.arange(T)[None, :] < lens[:, None]
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        cu = cu.to(device)
        kd = keep.to(device)
        for skip in (True, False):
            a, ret = rc.masked_gae(r, v, m & kd, gamma=0.97, lmbda=0.9, skip=skip, time_dim=-1)
            pa, pret = rc.masked_gae(r[kd], v[kd], m[kd], gamma=0.97, lmbda=0.9, skip=skip,
                                     cu_seqlens=cu, time_dim=0)
            torch.testing.assert_close(pa, a[kd], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(pret, ret[kd], rtol=1e-12, atol=1e-12)
            w, _ = rc.masked_gae(r, v, m & kd, gamma=0.97, lmbda=0.9, skip=skip, whiten=True,
                                 time_dim=-1)
            pw, _ = rc.masked_gae(r[kd], v[kd], m[kd], gamma=0.97, lmbda=0.9, skip=skip,
                                  whiten=True, cu_seqlens=cu, time_dim=0)
            torch.testing.assert_close(pw, w[kd], rtol=1e-10, atol=1e-10)
            rr = rc.masked_returns(r, m & kd, gamma=0.9, skip=skip, time_dim=-1)
            prr = rc.masked_returns(r[kd], m[kd], gamma=0.9, skip=skip, cu_seqlens=cu,
                                    time_dim=0)
            torch.testing.assert_close(prr, rr[kd], rtol=1e-12, atol=1e-12)


def test_one_response_equals_itself_in_a_batch(where):
    device, backend = where
    B, T = (3, 20) if backend == "triton" else (6, 700)
    r, v, m = _inputs(5, B, T, torch.float32, "multi", device)
    a, ret = rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, time_dim=-1)
    for i in range(B):
        ai, reti = rc.masked_gae(r[i:i + 1], v[i:i + 1], m[i:i + 1], gamma=0.99, lmbda=0.95,
                                 time_dim=-1)
        torch.testing.assert_close(ai, a[i:i + 1], rtol=0, atol=0)
        torch.testing.assert_close(reti, ret[i:i + 1], rtol=0, atol=0)


def test_time_major_view(where):
    device, backend = where
    r, v, m = _inputs(3, 4, 33, torch.float64, "multi", device)
    a, ret = rc.masked_gae(r.t(), v.t(), m.t(), gamma=0.9, lmbda=0.8, time_dim=0)
    wa, wret = ref.masked_gae(r, v, m, gamma=0.9, lmbda=0.8, time_dim=-1)
    _close(a.t(), wa, torch.float64, "time-major")
    _close(ret.t(), wret, torch.float64, "time-major returns")


def test_mixed_dtypes_and_inputs_unchanged(where):
    device, backend = where
    r, v, m = _inputs(4, 3, 50, torch.float32, "multi", device)
    vb = v.to(torch.bfloat16)
    before = [t.clone() for t in (r, vb, m)]
    a, ret = rc.masked_gae(r, vb, m, gamma=0.99, lmbda=0.95, whiten=True, time_dim=-1)
    assert a.dtype == torch.float32
    wa, _ = ref.masked_gae(r, vb, m, gamma=0.99, lmbda=0.95, whiten=True, time_dim=-1)
    _close(a, wa, torch.float32, "bf16 values, fp32 rewards")
    for b, t in zip(before, (r, vb, m)):
        assert torch.equal(b, t)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # the interpreter's 0/0
def test_empty_and_single_token_masks_give_nan_not_raise(where):
    device, backend = where
    r, v, m = _inputs(6, 2, 9, torch.float32, "right", device)
    a, _ = rc.masked_gae(r, v, torch.zeros_like(m), whiten=True, time_dim=-1)
    assert torch.isnan(a).all()
    one = torch.zeros_like(m)
    one[0, 3] = True
    for ce in (0.0, 1e-8):  # one valid token: NaN everywhere, with or without verl's count_eps
        a, _ = rc.masked_gae(r, v, one, whiten=True, count_eps=ce, time_dim=-1)
        assert torch.isnan(a).all(), (backend, ce)
        w = rc.masked_whiten(r, one, count_eps=ce)
        assert torch.isnan(w).all(), (backend, ce)
    # the biased variance of one token is 0: finite
    a, _ = rc.masked_gae(r, v, one, whiten=True, unbiased=False, count_eps=1e-8, time_dim=-1)
    assert torch.isfinite(a).all()


def test_bad_input():
    r = torch.randn(2, 5)
    m = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(TypeError, match="time_dim"):
        rc.masked_gae(r, r, m)
    with pytest.raises(ValueError, match="mask"):
        rc.masked_gae(r, r, m[:, :4], time_dim=-1)
    with pytest.raises(TypeError, match="rewards"):
        rc.masked_gae(r.long(), r, m, time_dim=-1)
    with pytest.raises(ValueError, match="gamma"):
        rc.masked_gae(r, r, m, gamma=1.5, time_dim=-1)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rc.masked_gae(r, r, m, cu_seqlens=torch.tensor([0, 5]), time_dim=-1)
    with pytest.raises(ValueError, match="cu_seqlens"):
        rc.masked_returns(r[0], m[0], cu_seqlens=torch.tensor([0.0, 5.0]), time_dim=0)
    with pytest.raises(TypeError, match="skip"):
        rc.masked_gae(r, r, m, skip=1, time_dim=-1)
    with pytest.raises(TypeError, match="fill"):
        rc.masked_whiten(r, m, fill="0")
    with pytest.raises(ValueError, match="rewards"):
        rc.masked_gae(r[None], r[None], m[None], time_dim=-1)


@pytest.mark.parametrize("bt,warps,k", [(16, 1, 1), (32, 2, 1), (128, 1, 1), (16, 1, 2),
                                        (32, 1, 4), (64, 2, 4), (128, 1, 2)])
def test_kernel_tiles(where, monkeypatch, bt, warps, k):
    """Several chunks per response, packed responses of different lengths (empty and
    one-token ones too): every chunk length and row length gives the reference."""
    device, backend = where
    if backend == "cpu":
        pytest.skip("the Triton kernel's tiling")
    from rl_triton_core.token import _token_kernel

    monkeypatch.setattr(_token_kernel, "config", lambda n, t: (bt, warps, k))
    monkeypatch.setattr(rc._config, "_current", rc.current_tuning().replace(small_tokens=0))
    B, T = 7, 45
    r, v, m = _inputs(21, B, T, torch.float64, "multi", device)
    m[0, :3] = True
    for skip in (True, False):
        a, ret = rc.masked_gae(r, v, m, gamma=0.9, lmbda=0.7, skip=skip, whiten=True,
                               count_eps=1e-8, time_dim=-1)
        wa, wret = ref.masked_gae(r, v, m, gamma=0.9, lmbda=0.7, skip=skip, whiten=True,
                                  count_eps=1e-8, time_dim=-1)
        _close(a, wa, torch.float64, f"chunk {bt} skip={skip}")
        _close(ret, wret, torch.float64, f"chunk {bt} skip={skip} returns")
        got = rc.masked_returns(r, m, gamma=0.9, skip=skip, time_dim=-1)
        _close(got, ref.masked_returns(r, m, gamma=0.9, skip=skip, time_dim=-1),
               torch.float64, f"chunk {bt} skip={skip} masked_returns")
    _close(rc.masked_whiten(r, m), ref.masked_whiten(r, m), torch.float64, "masked_whiten")
    lens = torch.tensor([45, 0, 3, 17, 1, 40, 16])
    keep = (torch.arange(T)[None, :] < lens[:, None]).to(device)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(device)
    a, _ = rc.masked_gae(r, v, m & keep, gamma=0.9, lmbda=0.7, time_dim=-1)
    pa, _ = rc.masked_gae(r[keep], v[keep], m[keep], gamma=0.9, lmbda=0.7, cu_seqlens=cu,
                          time_dim=0)
    torch.testing.assert_close(pa, a[keep], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", range(6))
def test_one_launch_equals_two(where, case):
    """A small batch that is whitened or filled runs in one launch (Tuning.small_tokens):
    on fresh random inputs (dtype, mask kind, skip, whitening options, strides) it gives
    the two-launch form's result (to rounding: the statistics are summed in another
    order) and the float64 reference's."""
    device, backend = where
    if backend == "cpu":
        pytest.skip("the Triton kernels' launches")
    from rl_triton_core.scan import _dispatch
    from rl_triton_core.token import _token_kernel

    _dispatch._PLANS.clear()  # (a recorded call would not run the kernels' host side)
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[int(torch.randint(len(xs), (), generator=g))]  # noqa: E731
    dtypes = [torch.float32, torch.float64] + ([torch.bfloat16] if device == "cuda" else [])
    dtype = pick(dtypes)
    B, T = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(4, 60, (), generator=g))
    r, v, m = _inputs(seed % 1000, B, T, dtype, pick(["right", "left", "multi"]), device)
    m[0, :4] = True  # at least two valid tokens, also in every second column
    opts = dict(count_eps=pick([0.0, 1e-8]), fill=pick([None, 0.0, -1.5]),
                unbiased=pick([True, False]))
    if case % 2:
        x, mm = (r * 3 + 5)[:, ::2], m[:, ::2]  # strided, nonzero mean
        calls = [lambda: rc.masked_whiten(x, mm, shift_mean=bool(case % 3), **opts),
                 lambda: ref.masked_whiten(x, mm, shift_mean=bool(case % 3), **opts)]
    else:
        skip, whiten = pick([True, False]), pick([True, True, False])
        calls = [lambda f=f: f.masked_gae(r, v, m, gamma=0.97, lmbda=0.9, skip=skip,
                                          whiten=whiten, time_dim=-1, **opts)
                 for f in (rc, ref)]
        if not whiten and opts["fill"] is None:
            opts["fill"] = 2.0
    what = f"seed={seed} case={case} B={B} T={T} {dtype} {opts}"
    ran = []
    real = _token_kernel._run_small
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_token_kernel, "_run_small", lambda *a: ran.append(1) or real(*a))
        one = calls[0]()
        assert ran, "the one-launch kernel did not run " + what
        with rc.tuning(small_tokens=0):
            two = calls[0]()
        assert len(ran) == 1, "the one-launch kernel ran with small_tokens=0 " + what
    want = calls[1]()
    one, two, want = ((t,) if isinstance(t, torch.Tensor) else t for t in (one, two, want))
    for a, b, w in zip(one, two, want):
        _close(a, w, dtype, "one launch " + what)
        _close(b, w, dtype, "two launches " + what)
        _close(a, b, dtype, "one against two " + what)


@pytest.mark.parametrize("skip", [True, False])
def test_nonfinite_rewards_on_masked_tokens_stay_there(where, skip):
    """A NaN or inf reward on a masked token reaches no output (no output depends on it):
    the same advantages and returns as with a finite reward there, every estimator."""
    device, _ = where
    r, v, m = _inputs(31, 5, 37, torch.float32, "multi", device)
    bad = r.clone()
    bad[~m] = float("nan")
    bad[~m & (torch.arange(37, device=device) % 2 == 0)] = float("inf")
    for whiten in (False, True):
        a, ret = rc.masked_gae(r, v, m, gamma=0.9, lmbda=0.8, skip=skip, whiten=whiten,
                               count_eps=1e-8, time_dim=-1)
        ba, bret = rc.masked_gae(bad, v, m, gamma=0.9, lmbda=0.8, skip=skip, whiten=whiten,
                                 count_eps=1e-8, time_dim=-1)
        torch.testing.assert_close(ba, a, rtol=0, atol=0)
        torch.testing.assert_close(bret, ret, rtol=0, atol=0)
    got = rc.masked_returns(bad, m, gamma=0.9, skip=skip, time_dim=-1)
    torch.testing.assert_close(got, rc.masked_returns(r, m, gamma=0.9, skip=skip, time_dim=-1),
                               rtol=0, atol=0)


@pytest.mark.parametrize("skip", [True, False])
def test_whitening_shift(where, monkeypatch, skip):
    """The kernel sums (x - k)^2 with k the first nonzero carry out of a chunk: valid
    tokens summed before k was known (row 0's last chunks, whose advantages are exactly
    0) must be re-shifted to it; values near 1000, float32, many chunks per response."""
    device, backend = where
    if backend == "cpu":
        pytest.skip("the Triton kernel's tiling")
    from rl_triton_core.token import _token_kernel

    monkeypatch.setattr(_token_kernel, "config", lambda n, t: (16, 1, 1))
    monkeypatch.setattr(rc._config, "_current", rc.current_tuning().replace(small_tokens=0))
    g = torch.Generator().manual_seed(5)
    B, T = 3, 1024
    r = torch.randn(B, T, generator=g)
    v = 1000 + torch.randn(B, T, generator=g)
    r[0, 992:] = 0.0
    v[0, 992:] = 0.0  # row 0: two chunks of valid tokens whose advantages are 0
    m = torch.ones(B, T, dtype=torch.bool)
    m[2, 1000:] = False  # row 2: its last chunk is padding
    r, v, m = r.to(device), v.to(device), m.to(device)
    a, _ = rc.masked_gae(r, v, m, gamma=0.9, lmbda=0.7, skip=skip, whiten=True,
                         count_eps=1e-8, time_dim=-1)
    wa, _ = ref.masked_gae(r.double(), v.double(), m, gamma=0.9, lmbda=0.7, skip=skip,
                           whiten=True, count_eps=1e-8, time_dim=-1)
    _close(a, wa, torch.float32, f"skip={skip}")
    x = 1000 + torch.randn(B, T, generator=g).to(device)
    x[0, 992:] = 0.0
    _close(rc.masked_whiten(x, m), ref.masked_whiten(x.double(), m),
           torch.float32, "masked_whiten")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 4096), (1024, 2048)])
def test_bitwise_repeatable_cuda(shape):
    """The same inputs give the same bits, call after call: whitened masked GAE (the
    statistics of every response combined in a fixed order by every whitening program)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    B, T = shape
    r, v, m = _inputs(3, B, T, torch.float32, "multi", "cuda")
    first = rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                          time_dim=-1)
    for _ in range(20):
        again = rc.masked_gae(r, v, m, gamma=1.0, lmbda=0.95, whiten=True, count_eps=1e-8,
                              time_dim=-1)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    wa, _ = ref.masked_gae(r.double(), v.double(), m, gamma=1.0, lmbda=0.95, whiten=True,
                           count_eps=1e-8, time_dim=-1)
    _close(first[0], wa, torch.float32, "whitened advantages")


@pytest.mark.parametrize("small_tokens", [4096, 0])  # one launch; the scan and the pass
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_whitened_half_advantages_round_once(where, dtype, small_tokens, monkeypatch):
    """Whitened half-precision GAE rounds once: every output is within half an ulp (of its
    dtype) of the float64 result of the same inputs, where a second rounding (the
    advantages rounded to the output dtype, read back and whitened) can land a whole ulp
    off. Fresh random inputs each seed; in one launch and in two (the scan's float32
    advantages workspace)."""
    monkeypatch.setattr(rc._config, "_current",
                        rc.current_tuning().replace(small_tokens=small_tokens))
    device, backend = where
    if backend == "triton" and device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter rounds float32 to bfloat16 toward zero (CUDA: to "
                    "nearest even), so its bfloat16 outputs can be a whole ulp off")
    worst = 0.0
    for seed in range(3):
        r, v, m = _inputs(700 + seed, 16, 96, dtype, "multi", device)
        m[0, :5] = True  # at least a few valid tokens
        got, _ = rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.95, skip=True, whiten=True,
                               count_eps=1e-8, time_dim=-1)
        want, _ = ref.masked_gae(r.double().cpu(), v.double().cpu(), m.cpu(), gamma=0.99,
                                 lmbda=0.95, skip=True, whiten=True, count_eps=1e-8,
                                 time_dim=-1)
        g, w = got.double().cpu(), want
        mant = 7 if dtype == torch.bfloat16 else 10
        ulp = torch.exp2(torch.floor(torch.log2(w.abs().clamp_min(1e-3))) - mant)
        worst = max(worst, float(((g - w).abs() / ulp).max()))
    assert worst <= 0.51, f"{dtype}: {worst:.3f} ulp from the float64 result"
