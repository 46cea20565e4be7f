"""CPU outputs of 128 KiB or more come from the block cache (``_host.empty``): the memory
of freed outputs, reused. A reused block holds the last call's values, so every output
element must be written again; the result must be the bits of an ordinary output; and
the tensor must behave as a contiguous tensor whose storage cannot grow."""

import os

import pytest
import torch
from core_testlib import (
    HELD_MAX,
    held_blocks,
    torch_ext,  # noqa: F401 (autouse: every test twice, C++ API and DLPack)
)

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core import _host

pytestmark = pytest.mark.skipif(
    os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
    reason="the CPU path's outputs",
)


T = 40_000  # 160 KB of float32: above POOLED_MIN


def _blocks():
    blocks = _host._BLOCKS if _host._BLOCKS is not None else _host._block_cache()
    if not blocks:
        pytest.skip("no block cache (the C extension _ctoken is not built, or it is off)")
    return blocks


def _case(g, n=2, t=T):
    r, v = torch.randn(n, t, generator=g), torch.randn(n, t, generator=g)
    term = torch.rand(n, t, generator=g) < 0.01
    return r, v, term


def test_reused_blocks_are_written_whole_and_give_the_plain_bits(monkeypatch):
    _blocks()
    g = torch.Generator().manual_seed(0)
    r, v, term = _case(g)
    for call in range(4):  # the first call, then repeats (the replay), each on freed blocks
        adv, ret = rc.gae(r, v, term, gamma=0.97, lmbda=0.9, time_dim=-1)
        assert not adv.untyped_storage().resizable() and adv.is_contiguous()
        want = ref.gae(r, v, term, gamma=0.97, lmbda=0.9, time_dim=-1)
        torch.testing.assert_close(adv.double(), want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret.double(), want[1], rtol=1e-5, atol=1e-5)
        # the same bits as an output allocated by torch (the cache off)
        with monkeypatch.context() as m:
            m.setattr(_host, "_BLOCKS", False)
            plain = rc.gae(r, v, term, gamma=0.97, lmbda=0.9, time_dim=-1, out=(
                torch.empty_like(r), torch.empty_like(r)))
        assert torch.equal(adv, plain[0]) and torch.equal(ret, plain[1]), call
        adv.fill_(float("nan"))  # poison the blocks the next call may reuse
        ret.fill_(float("nan"))
        del adv, ret, plain
        r, v, term = _case(g)


def test_a_cached_output_is_an_ordinary_tensor():
    _blocks()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, T, generator=g)
    done = torch.rand(3, T, generator=g) < 0.02
    out = rc.episodic_cumsum(x, done, time_dim=-1)
    assert out.shape == x.shape and out.stride() == x.stride() and out.dtype == x.dtype
    view = out[1]  # a view keeps the block: a later call must not write into it
    keep = view.clone()
    del out
    for _ in range(3):
        rc.episodic_cumsum(x, done, time_dim=-1)
    assert torch.equal(view, keep)
    with pytest.raises(RuntimeError, match="not resizable"):
        view.untyped_storage().resize_(view.untyped_storage().nbytes() * 2)
    assert torch.equal(view.clone().resize_(5), keep[:5])  # a clone is an ordinary tensor


def test_only_large_outputs_come_from_the_cache():
    _blocks()
    small = _host.empty((2, 100), torch.float32)
    large = _host.empty((2, T), torch.float32)
    assert small.untyped_storage().resizable()  # torch.empty's
    assert not large.untyped_storage().resizable()  # a block's
    assert large.shape == (2, T) and large.is_contiguous() and large.dtype == torch.float32


def test_outputs_start_away_from_where_inputs_start():
    """A cached output starts 2 or 3 KiB (+64 bytes) past a 4 KiB boundary, the two of a
    call at different ones: never at the page offsets where torch's and numpy's large
    tensors start (0, 16, 64; glibc may place one elsewhere inside a freed chunk, so
    the inputs' offsets are not asserted), where a kernel's loads of the inputs would
    alias the stores of the outputs in the low 12 address bits and stall."""
    _blocks()
    g = torch.Generator().manual_seed(1)
    r, v, term = _case(g)
    for _ in range(3):
        adv, ret = rc.gae(r, v, term, time_dim=-1)
        offs = {adv.data_ptr() % 4096, ret.data_ptr() % 4096}
        assert offs == {2048 + 64, 3072 + 64}
        adv, ret = rc.masked_gae(r, v, ~term, time_dim=-1)
        assert {adv.data_ptr() % 4096, ret.data_ptr() % 4096} == {2048 + 64, 3072 + 64}


def test_the_replay_makes_its_outputs_in_c(monkeypatch):
    """A repeated call (the C replay) takes its outputs from the block cache itself,
    through DLPack or torch's C++ API, without _host.empty's Python calls: no
    torch.frombuffer; the blocks colored as _host.empty colors them, returned to the
    cache (or kept by the replay) when freed, and the values those of the first (Python)
    call. With the cache swapped out (``_host._BLOCKS``) the
    replay uses the recorded allocator again."""
    from rl_triton_core.scan import _cpu_c

    blocks = _blocks()
    if _cpu_c.replay is None or not hasattr(blocks, "blocks_api"):
        pytest.skip("no C replay, or a _ctoken without blocks_api")
    g = torch.Generator().manual_seed(2)
    r, v, term = _case(g)
    first = rc.gae(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)  # recorded (Python)
    made = []
    real = torch.frombuffer
    monkeypatch.setattr(torch, "frombuffer", lambda *a, **k: made.append(1) or real(*a, **k))
    for _ in range(3):
        held = held_blocks(blocks)
        adv, ret = rc.gae(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)
        assert not made
        assert torch.equal(adv, first[0]) and torch.equal(ret, first[1])
        assert {adv.data_ptr() % 4096, ret.data_ptr() % 4096} == {2048 + 64, 3072 + 64}
        assert adv.shape == r.shape and adv.is_contiguous() and not adv.requires_grad
        assert not adv.untyped_storage().resizable()
        adv.fill_(float("nan"))
        taken = held_blocks(blocks)
        del adv, ret
        assert held_blocks(blocks) == min(taken + 2, HELD_MAX) and taken <= held
    with monkeypatch.context() as m:
        m.setattr(_host, "_BLOCKS", False)
        adv, ret = rc.gae(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)
    assert torch.equal(adv, first[0]) and adv.untyped_storage().resizable()  # torch.empty's


def test_a_replay_that_declines_after_its_scan_started(monkeypatch):
    """The replay starts the scan into its outputs' blocks before the calling thread
    reads the tensors' flags; a call it then hands to the Python path (a tensor that
    requires grad, a view with the negative bit) must give that path's result, and the
    blocks it had taken must go back to the cache. One-output estimators too."""
    from rl_triton_core.scan import _cpu_c

    blocks = _blocks()
    if _cpu_c.replay is None or not hasattr(blocks, "blocks_api"):
        pytest.skip("no C replay, or a _ctoken without blocks_api")
    g = torch.Generator().manual_seed(4)
    r, v, term = _case(g)
    first = rc.gae(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)  # recorded
    lam = rc.lambda_returns(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)
    for _ in range(2):
        assert torch.equal(rc.lambda_returns(r, v, term, gamma=0.95, lmbda=0.9,
                                             time_dim=-1), lam)
    vg = v.clone().requires_grad_()
    adv, ret = rc.gae(r, vg, term, gamma=0.95, lmbda=0.9, time_dim=-1)
    assert adv.requires_grad and torch.equal(adv.detach(), first[0])
    adv.sum().backward()
    assert vg.grad is not None and torch.isfinite(vg.grad).all()
    del adv, ret, vg
    z = torch.complex(torch.randn(r.shape, generator=g), -r)
    neg = z.conj().imag  # the values r, stored as -r with the negative bit
    assert neg.is_neg() and torch.equal(neg, r)
    for _ in range(2):
        held = held_blocks(blocks)
        got = rc.gae(neg, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])
        during = held_blocks(blocks)  # the replay's blocks back; the Python path's taken
        assert during <= held
        del got
        assert held_blocks(blocks) == min(during + 2, HELD_MAX)  # ... and those back too
    again = rc.gae(r, v, term, gamma=0.95, lmbda=0.9, time_dim=-1)  # the replay again
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
