"""The forward scans (eligibility traces, episodic sums) with a broadcast ``done``: gamma
and lmbda broadcast to done's full shape (x's shape without the feature axes), not to
the broadcast done's own shape, and the reference takes the same broadcast done.

Found by the fuzz: ``done [1, T]`` with ``gamma [B, T]`` raised in the library
("gamma ... does not broadcast to the data's shape") and every broadcast ``done`` raised
in the reference."""

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref

GAMMAS = {
    "done_full": lambda g: torch.rand(3, 7, generator=g, dtype=torch.float64),
    "per_step": lambda g: torch.rand(7, generator=g, dtype=torch.float64),
    "x_full": lambda g: torch.rand(3, 7, 2, generator=g, dtype=torch.float64),
    "number": lambda g: 0.9,
}


@pytest.mark.parametrize("done_shape", [(1, 7), (3, 7)])
@pytest.mark.parametrize("gamma", list(GAMMAS))
def test_traces_broadcast_done(gamma, done_shape, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 7, 2, generator=g, dtype=torch.float64)
    done = torch.rand(done_shape, generator=g) < 0.3
    gm = GAMMAS[gamma](g)
    got = rc.eligibility_traces(x, done, gamma=gm, lmbda=0.8, time_dim=1)
    want = ref.eligibility_traces(x, done, gamma=gm, lmbda=0.8, time_dim=1)
    full = ref.eligibility_traces(x, done.expand(3, 7), gamma=gm, lmbda=0.8, time_dim=1)
    torch.testing.assert_close(want, full, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", ["eligibility_traces", "episodic_cumsum"])
def test_reference_rejects_done_that_does_not_broadcast(fn):
    x = torch.randn(3, 7, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="done"):
        getattr(ref, fn)(x, torch.zeros(2, 7, dtype=torch.bool), time_dim=1)
