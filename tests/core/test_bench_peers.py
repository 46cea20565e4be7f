"""The benchmark's rl-triton and PufferLib peers (``rl_triton_core/bench/ext_peers.py``)
compute our numbers on the benchmark's cases.

They need a checkout of rl-triton (github.com/simonsays1980/rl-triton, tag v0.1.3) named
by ``$RL_TRITON_SRC``; without one these tests skip (CI). On a machine without CUDA,
rl-triton runs in the Triton interpreter: run with ``TRITON_INTERPRET=1`` (set before
triton is imported). PufferLib's extension is JIT-built (on the CPU its pufferlib.cpp
path; the first build takes about a minute, then torch caches it)::

    RL_TRITON_SRC=.peers/rl-triton TRITON_INTERPRET=1 \
        python -m pytest tests/core/test_bench_peers.py
"""

from __future__ import annotations

import os
import types

import pytest
import torch

from rl_triton_core.bench import ext_peers as X
from rl_triton_core.bench import harness as H
from rl_triton_core.bench import peers as P

SRC = os.environ.get(X.ENV)
HAS_CUDA = torch.cuda.is_available()
INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if HAS_CUDA else "cpu"

needs_src = pytest.mark.skipif(
    not SRC, reason=f"${X.ENV} is not set (the root of a checkout of rl-triton v0.1.3)")
needs_triton = pytest.mark.skipif(
    not HAS_CUDA and not INTERP,
    reason="rl-triton needs CUDA or the Triton interpreter (TRITON_INTERPRET=1)")


def _opts(**kw):
    return types.SimpleNamespace(rl_triton_src=SRC, all_peers=True, **kw)


@pytest.fixture
def dense_flags(monkeypatch):
    """Many terminations and truncations (some steps both) in a small case."""
    monkeypatch.setattr(H, "P_TERMINATED", 0.2)
    monkeypatch.setattr(H, "P_TRUNCATED", 0.2)


def _check(peer, estimator, layout, trunc, nv_mode, N=3, T=19, seed=0):
    """max abs error of the peer on one case against the float64 reference (as the
    harness checks every row), or pytest.skip with the peer's reason."""
    data = H.Data(N, T, DEVICE, seed, actions=5)
    if trunc == "flags":
        assert data.batch("truncated").any() and \
            (data.batch("truncated") & data.batch("terminated")).any()
    spec = H.SPECS[estimator]
    refs, _ = H.reference(spec, data, trunc, nv_mode)
    d = H.View(data, layout, trunc, nv_mode)
    try:
        fn, graphable, info = P.make_peer(peer, estimator, d, _opts())
    except P.Skip as e:
        pytest.skip(f"{peer} {estimator}: {e}")
    assert graphable == (HAS_CUDA and peer == "rl_triton")
    assert info["peer_version"]
    err, tol, ok = H.compare(fn(), refs, layout, d.shape)
    assert ok, (peer, estimator, layout, trunc, nv_mode, err, tol)
    return err


def test_without_a_checkout_the_rows_say_how_to_get_one(monkeypatch):
    monkeypatch.delenv(X.ENV, raising=False)
    data = H.Data(2, 5, "cpu", 0)
    d = H.View(data, "batch", "flags", "shifted")
    for peer in ("rl_triton", "pufferlib"):
        with pytest.raises(P.Skip, match="--rl-triton-src"):
            P.make_peer(peer, "gae", d, types.SimpleNamespace(rl_triton_src=None))
    assert X.rl_triton_version(types.SimpleNamespace(rl_triton_src=None)) is None
    with pytest.raises(P.Skip, match="src/rl_triton"):
        P.make_peer("rl_triton", "gae", d, types.SimpleNamespace(rl_triton_src="/nonexistent"))


RL_TRITON_CASES = [e for e in X.RL_TRITON_ESTIMATORS if e != "retrace"]


@needs_src
@needs_triton
@pytest.mark.parametrize("nv_mode", ["shifted", "explicit"])
@pytest.mark.parametrize("trunc", ["none", "flags"])
@pytest.mark.parametrize("layout", ["batch", "time"])
@pytest.mark.parametrize("estimator", RL_TRITON_CASES)
def test_rl_triton_matches_ours(dense_flags, estimator, layout, trunc, nv_mode):
    spec = H.SPECS[estimator]
    if spec.truncs == ("-",):
        if trunc == "flags":
            pytest.skip("no truncation flags for this estimator")
        trunc = "-"
    if spec.next_values is None and nv_mode == "explicit":
        pytest.skip("the estimator reads no V'")
    if nv_mode == "explicit" and estimator in ("gae", "vtrace"):
        with pytest.raises(P.Skip, match="next_values is not expressible"):
            P.make_peer("rl_triton", estimator, H.View(H.Data(2, 5, DEVICE, 0), layout,
                                                       trunc, nv_mode), _opts())
        return
    _check("rl_triton", estimator, layout, trunc, nv_mode)


@needs_src
@needs_triton
def test_rl_triton_longer_rows_and_the_retrace_skip(dense_flags):
    # a T that is not a power of 2, past rl-triton's smallest block sizes
    for est in ("gae", "vtrace", "retrace_from_actions"):
        _check("rl_triton", est, "batch", "flags", "shifted", N=2, T=300, seed=3)
    d = H.View(H.Data(2, 5, DEVICE, 0), "batch", "flags", "shifted")
    with pytest.raises(P.Skip, match="per-action tensors only"):
        P.make_peer("rl_triton", "retrace", d, _opts())


@needs_src
@pytest.mark.parametrize("nv_mode", ["shifted", "explicit"])
@pytest.mark.parametrize("trunc", ["none", "flags"])
@pytest.mark.parametrize("layout", ["batch", "time"])
def test_pufferlib_matches_ours(dense_flags, layout, trunc, nv_mode):
    if nv_mode == "explicit":
        d = H.View(H.Data(2, 5, DEVICE, 0), layout, trunc, nv_mode)
        with pytest.raises(P.Skip, match="not expressible"):
            P.make_peer("pufferlib", "gae", d, _opts())
        return
    _check("pufferlib", "gae", layout, trunc, nv_mode)
    with pytest.raises(P.Skip, match="GAE only"):
        P.make_peer("pufferlib", "vtrace", H.View(H.Data(2, 5, DEVICE, 0), layout, trunc,
                                                  nv_mode), _opts())


@needs_src
@needs_triton
def test_harness_rows_record_the_peer(monkeypatch):
    if INTERP:
        monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    opts = H.Options(estimators=["gae"], shapes=[(3, 9)], truncs=["flags"],
                     peers=["rl_triton"], floor=False, device=DEVICE, target_ms=0.3,
                     compile_backend="none", progress=False, commit="test", rl_triton_src=SRC)
    result = H.run(opts)
    assert result["header"]["rl_triton"].startswith("rl-triton 0.1.3")
    rows = [r for r in result["records"] if r["impl"] == "rl_triton"]
    assert len(rows) == 2
    for r in rows:
        assert r["ok"] is True, r["note"]
        assert r["peer_version"] == "rl-triton 0.1.3" and r["full_us"] > 0
