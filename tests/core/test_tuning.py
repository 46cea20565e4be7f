"""rl_triton_core.tuning: an immutable Tuning in effect for a block, restored after it,
part of the cached launch's key; results under any tuning match the float64 reference."""

import dataclasses

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref


def test_tuning_is_scoped_and_restored():
    before = rc.current_tuning()
    with rc.tuning(look_back=False, segment_len=32) as t:
        assert rc.current_tuning() is t
        assert t.look_back is False and t.segment_len == 32
        assert t.programs_per_sm == before.programs_per_sm  # the rest unchanged
    assert rc.current_tuning() is before
    with pytest.raises(RuntimeError), rc.tuning(cpu_threads=1):
        raise RuntimeError  # restored on an exception too
    assert rc.current_tuning() is before


def test_tuning_blocks_nest_decorate_and_restore():
    base = rc.current_tuning()
    with rc.tuning(cpu_threads=1) as one:
        with rc.tuning(cpu_threads=2, segment_len=32) as two:
            assert rc.current_tuning() is two and two.cpu_threads == 2
        with pytest.raises(RuntimeError), rc.tuning(cpu_threads=3):
            raise RuntimeError
        assert rc.current_tuning() is one
        with rc.tuning(cpu_threads=2, segment_len=32) as again:  # a block seen before
            assert again is two
    assert rc.current_tuning() is base

    @rc.tuning(cpu_threads=3)
    def nested(depth):  # a decorated function entered again inside itself
        assert rc.current_tuning().cpu_threads == 3
        return nested(depth - 1) if depth else rc.current_tuning()

    assert nested(2).cpu_threads == 3 and rc.current_tuning() is base
    with pytest.raises(ValueError, match="look_window"), rc.tuning(look_window=3):
        pass
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="prefetch"), rc.tuning(prefetch=bad):
            pass
    # tile sizes the kernel takes as aranges: powers of two (24 steps would not compile)
    for name, bad in (("tm_steps", 24), ("tm_steps", 8), ("segment_len", 48),
                      ("segment_len", 8), ("middle_elems", 3000), ("programs_per_sm", -1)):
        with pytest.raises(ValueError, match=name), rc.tuning(**{name: bad}):
            pass
    with rc.tuning(segment_len=None, tm_steps=32, middle_elems=4096, programs_per_sm=0):
        pass
    assert rc.current_tuning() is base


def test_tuning_is_immutable_and_checked():
    t = rc.current_tuning()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.look_back = True
    with pytest.raises(TypeError):
        with rc.tuning(no_such_knob=1):
            pass
    assert hash(rc.Tuning()) == hash(rc.Tuning()) and rc.Tuning() == rc.Tuning()
    assert rc.Tuning().replace(look_back=True) != rc.Tuning(look_back=False)


@pytest.mark.parametrize("knobs", [{"cpu_threads": 1}, {"segment_len": 16, "look_back": False},
                                   {"segment_len": 16, "look_back": True},
                                   {"cached_launch": False}])
def test_results_under_a_tuning_match_the_reference(knobs, impl, gen):
    shape = (3, 70)
    r, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(2))
    te = torch.rand(shape, generator=gen) < 0.1
    b = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    want = ref.gae(r, v, te, bootstrap_value=b, gamma=0.97, lmbda=0.9, time_dim=-1)
    dev = impl.device
    with rc.tuning(**knobs):
        got = rc.gae(r.to(dev), v.to(dev), te.to(dev), bootstrap_value=b.to(dev), gamma=0.97,
                     lmbda=0.9, time_dim=-1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-10, atol=1e-10)


def test_tuning_is_part_of_the_cache_key(gen, captured_launches):
    """A plan recorded under one tuning is not replayed under another."""
    r, v = torch.randn(3, 40, generator=gen), torch.randn(3, 40, generator=gen)
    te = torch.rand(3, 40, generator=gen) < 0.1
    rc.gae(r, v, te, time_dim=-1)
    rc.gae(r, v, te, time_dim=-1)
    assert len(captured_launches.full) == 1 and len(captured_launches.replayed) == 1
    with rc.tuning(segment_len=16):
        rc.gae(r, v, te, time_dim=-1)
    assert len(captured_launches.full) == 2 and len(captured_launches.replayed) == 1


def test_a_block_entered_again_repeats_its_recorded_calls(monkeypatch):
    """rc.tuning(...) with the same knobs gives the same object every time: the C replay
    finds a call recorded in an earlier block by the tuning's identity."""
    from core_testlib import spy_c_replay

    from rl_triton_core import _config, estimators
    from rl_triton_core.scan import _dispatch

    # the values other tests set in this process left out (the table is bounded)
    monkeypatch.setattr(_config, "_INTERNED", {rc.current_tuning(): rc.current_tuning()})
    monkeypatch.setattr(_config, "_CHANGED", {})
    with rc.tuning(cpu_threads=1) as a:
        pass
    with rc.tuning(cpu_threads=1) as b:
        assert b is a
    assert rc.current_tuning() is not a
    if estimators._replay is None or _dispatch.backend_for(torch.device("cpu")) != "cpu":
        pytest.skip("no C replay of CPU calls here (not built, or the Triton backend)")
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    hits = []
    spy_c_replay(monkeypatch, hits)
    r, v = torch.randn(3, 50), torch.randn(3, 50)
    d = torch.rand(3, 50) < 0.1
    with rc.tuning(cpu_threads=1):
        first = rc.gae(r, v, d, time_dim=-1)
    with rc.tuning(cpu_threads=1):
        again = rc.gae(r, v, d, time_dim=-1)
    assert len(hits) == 1, "the second block's call was not replayed"
    assert all(torch.equal(x, y) for x, y in zip(first, again))
