"""retrace_from_actions: bad inputs give clear errors; documented behaviour at the edges."""

import math

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref


def _inputs(B=2, T=5, A=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, A, generator=g, dtype=torch.float64)
    p = torch.softmax(torch.randn(B, T, A, generator=g, dtype=torch.float64), -1)
    a = torch.randint(0, A, (B, T), generator=g)
    logmu = torch.log(torch.rand(B, T, generator=g, dtype=torch.float64) * 0.8 + 0.1)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    term = torch.rand(B, T, generator=g) < 0.2
    return q, p, a, logmu, r, term


@pytest.mark.parametrize("bad, match, exc", [
    (lambda q, p, a, m, r, t: (q[..., :2], p, a, m, r, t), "target_probs", ValueError),
    (lambda q, p, a, m, r, t: (q, p, a + 3, m, r, t), r"actions must lie in \[0, 3\)", ValueError),
    (lambda q, p, a, m, r, t: (q, p, a - 1, m, r, t), "actions must lie", ValueError),
    (lambda q, p, a, m, r, t: (q, p, a.double(), m, r, t), "actions must be an integer", TypeError),
    (lambda q, p, a, m, r, t: (q, p, a[:, :4], m, r, t), "actions", ValueError),
    (lambda q, p, a, m, r, t: (q, p, a, m[:, :4], r, t), "behaviour_log_probs", ValueError),
    (lambda q, p, a, m, r, t: (q[:, :4], p[:, :4], a, m, r, t), "q_values", ValueError),
    (lambda q, p, a, m, r, t: (q, p, a, m, r, "x"), "terminated", TypeError),
])
def test_bad_inputs_name_the_argument(bad, match, exc, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    args = bad(*_inputs())
    with pytest.raises(exc, match=match):
        rc.retrace_from_actions(*args, time_dim=-1)


def test_next_tensors_go_together(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    q, p, a, m, r, t = _inputs()
    with pytest.raises(ValueError, match="next_q_values and next_target_probs"):
        rc.retrace_from_actions(q, p, a, m, r, t, next_q_values=q, time_dim=-1)


def test_zero_behaviour_probability_clips_the_trace(monkeypatch):
    """mu(a_t|s_t) = 0 gives log rho = +inf: the trace coefficient is lmbda * c_bar (finite)."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    q, p, a, m, r, t = _inputs()
    m = m.clone()
    m[:, 2] = -math.inf
    got = rc.retrace_from_actions(q, p, a, m, r, t, gamma=0.9, lmbda=0.8, c_bar=1.0, time_dim=-1)
    assert torch.isfinite(got).all()
    idx = a.unsqueeze(-1)
    log_rhos = p.gather(-1, idx).squeeze(-1).log() - m
    e = torch.cat([(p[:, 1:] * q[:, 1:]).sum(-1), torch.zeros(2, 1, dtype=q.dtype)], 1)
    want = ref.retrace(log_rhos, r, q.gather(-1, idx).squeeze(-1), e, t, gamma=0.9, lmbda=0.8,
                       c_bar=1.0, time_dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_truncation_hand_checked(monkeypatch):
    """Two steps, truncated after step 0 with the true final state's E given; on-policy,
    lmbda = 1: Q_ret_0 = r_0 + gamma E_0 (the trace is cut), Q_ret_1 = r_1 + gamma E_1."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    log_rhos = torch.zeros(2, dtype=torch.float64)
    r = torch.tensor([1.0, 2.0], dtype=torch.float64)
    q = torch.tensor([0.5, 0.25], dtype=torch.float64)
    e = torch.tensor([3.0, 4.0], dtype=torch.float64)
    term = torch.tensor([False, False])
    trunc = torch.tensor([True, False])
    got = rc.retrace(log_rhos, r, q, e, term, trunc, gamma=0.5, lmbda=1.0, time_dim=-1)
    torch.testing.assert_close(got, torch.tensor([1.0 + 0.5 * 3.0, 2.0 + 0.5 * 4.0],
                                                 dtype=torch.float64))
