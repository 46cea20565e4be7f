"""The float64 reference itself, on small cases worked out by hand from semantics.md.

Each expected number below is derived in the comment next to it, so anyone can re-check
it with pencil and paper. Shared setting unless stated: gamma = lmbda = 0.5,
r = [1, 2, 3], V = [0.5, 1.0, 1.5], bootstrap_value = 2.0.
"""

import math

import pytest
import torch

from rl_triton_core import reference as ref

F64 = torch.float64


def t(*xs):
    return torch.tensor(xs, dtype=F64)


R = t(1.0, 2.0, 3.0)
V = t(0.5, 1.0, 1.5)
NO = t(0.0, 0.0, 0.0)
AT1 = t(0.0, 1.0, 0.0)  # a flag at step 1
BOOT = torch.tensor(2.0, dtype=F64)


def close(got, expected):
    assert got.dtype == F64
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- GAE


def test_gae_three_steps_no_flags():
    # V' = [1.0, 1.5, 2.0]
    # delta = [1 + .5*1 - .5, 2 + .5*1.5 - 1, 3 + .5*2 - 1.5] = [1.0, 1.75, 2.5]
    # A_2 = 2.5; A_1 = 1.75 + .25*2.5 = 2.375; A_0 = 1 + .25*2.375 = 1.59375
    adv, target = ref.gae(R, V, NO, bootstrap_value=BOOT, gamma=0.5, lmbda=0.5, time_dim=-1)
    close(adv, t(1.59375, 2.375, 2.5))
    close(target, t(2.09375, 3.375, 4.0))


def test_gae_truncation_uses_next_value_and_cuts_trace():
    # truncated at step 1, true successor value V'_1 = 4 (not V_2 = 1.5)
    # delta_1 = 2 + .5*4 - 1 = 3; A_2 = 2.5; A_1 = 3 (trace cut); A_0 = 1 + .25*3 = 1.75
    nv = t(1.0, 4.0, 2.0)
    adv, _ = ref.gae(R, V, NO, AT1, next_values=nv, gamma=0.5, lmbda=0.5, time_dim=-1)
    close(adv, t(1.75, 3.0, 2.5))


def test_gae_termination_drops_bootstrap_and_both_flags_count_as_terminated():
    # terminated at step 1: delta_1 = 2 - 1 = 1; A_1 = 1; A_0 = 1 + .25*1 = 1.25
    nv = t(1.0, 4.0, 2.0)
    expected = t(1.25, 1.0, 2.5)
    adv, _ = ref.gae(R, V, AT1, NO, next_values=nv, gamma=0.5, lmbda=0.5, time_dim=-1)
    close(adv, expected)
    adv_both, _ = ref.gae(R, V, AT1, AT1, next_values=nv, gamma=0.5, lmbda=0.5, time_dim=-1)
    close(adv_both, expected)
    adv_bool, _ = ref.gae(R, V, AT1.bool(), AT1.to(torch.uint8), next_values=nv,
                          gamma=0.5, lmbda=0.5, time_dim=-1)
    close(adv_bool, expected)


def test_gae_per_step_gamma():
    # gamma = [1, .5, 0], lmbda = 1, no flags, bootstrap 2: V' = [1, 1.5, 2]
    # delta = [1 + 1 - .5, 2 + .75 - 1, 3 + 0 - 1.5] = [1.5, 1.75, 1.5]
    # A_2 = 1.5; A_1 = 1.75 + .5*1.5 = 2.5; A_0 = 1.5 + 1*2.5 = 4.0
    adv, _ = ref.gae(R, V, NO, bootstrap_value=BOOT, gamma=t(1.0, 0.5, 0.0), lmbda=1.0, time_dim=-1)
    close(adv, t(4.0, 2.5, 1.5))


# -------------------------------------------------------------- lambda / MC returns


def test_lambda_returns_three_steps():
    # G_2 = 3 + .5*2 = 4 (window end bootstraps fully)
    # G_1 = 2 + .5*((1-.5)*1.5 + .5*4) = 3.375
    # G_0 = 1 + .5*((1-.5)*1.0 + .5*3.375) = 2.09375   (= GAE's value targets)
    g = ref.lambda_returns(R, V, NO, bootstrap_value=BOOT, gamma=0.5, lmbda=0.5, time_dim=-1)
    close(g, t(2.09375, 3.375, 4.0))


def test_discounted_returns_bootstrap_and_flags():
    # no flags: G_2 = 3 + .5*2 = 4; G_1 = 2 + .5*4 = 4; G_0 = 1 + .5*4 = 3
    close(ref.discounted_returns(R, NO, bootstrap_value=BOOT, gamma=0.5, time_dim=-1),
          t(3.0, 4.0, 4.0))
    # truncated at 1 without next_values: V'_1 = 0 -> G_1 = 2; G_0 = 1 + .5*2 = 2
    close(ref.discounted_returns(R, NO, AT1, bootstrap_value=BOOT, gamma=0.5, time_dim=-1),
          t(2.0, 2.0, 4.0))
    # truncated at 1 with next_values [9, 4, 2]: G_1 = 2 + .5*4 = 4; G_0 = 1 + .5*4 = 3
    nv = t(9.0, 4.0, 2.0)
    close(ref.discounted_returns(R, NO, AT1, next_values=nv, gamma=0.5, time_dim=-1),
          t(3.0, 4.0, 4.0))
    # terminated at 1: G_1 = 2; G_0 = 2
    close(ref.discounted_returns(R, AT1, next_values=nv, gamma=0.5, time_dim=-1), t(2.0, 2.0, 4.0))
    # no bootstrap at all: G_2 = 3, G_1 = 3.5, G_0 = 2.75
    close(ref.discounted_returns(R, NO, gamma=0.5, time_dim=-1), t(2.75, 3.5, 3.0))


# ---------------------------------------------------------------- V-trace / Retrace


def test_vtrace_on_policy_is_n_step_return():
    # log_rho = 0 (rho = c = 1): delta = [1, 1.75, 2.5]; D = [2.5, 3, 2.5]; vs = [3, 4, 4]
    # vs' = [vs_1, vs_2, V'_2] = [4, 4, 2]; pg = r + .5 vs' - V = [2.5, 3, 2.5]
    vs, pg = ref.vtrace(torch.zeros(3, dtype=F64), R, V, NO, bootstrap_value=BOOT, gamma=0.5,
                        time_dim=-1)
    close(vs, t(3.0, 4.0, 4.0))
    close(pg, t(2.5, 3.0, 2.5))
    # ratio 2 everywhere is clipped to rho_bar = c_bar = 1: same result
    vs2, pg2 = ref.vtrace(torch.full((3,), math.log(2.0), dtype=F64), R, V, NO,
                          bootstrap_value=BOOT, gamma=0.5, time_dim=-1)
    close(vs2, vs)
    close(pg2, pg)


def test_vtrace_off_policy_ratio():
    # ratio .5 at step 1: rho_1 = c_1 = .5
    # delta = [1, .5*1.75, 2.5] = [1, .875, 2.5]
    # D_2 = 2.5; D_1 = .875 + .5*.5*2.5 = 1.5; D_0 = 1 + .5*1*1.5 = 1.75; vs = [2.25, 2.5, 4]
    # vs' = [2.5, 4, 2]; pg = [1 + 1.25 - .5, .5*(2 + 2 - 1), 3 + 1 - 1.5] = [1.75, 1.5, 2.5]
    log_rhos = t(0.0, math.log(0.5), 0.0)
    vs, pg = ref.vtrace(log_rhos, R, V, NO, bootstrap_value=BOOT, gamma=0.5, time_dim=-1)
    close(vs, t(2.25, 2.5, 4.0))
    close(pg, t(1.75, 1.5, 2.5))


def test_vtrace_done_uses_next_value_in_pg():
    # truncated at 1, V'_1 = 4: delta = [1, 3, 2.5]; D = [1 + .5*3, 3, 2.5] = [2.5, 3, 2.5]
    # vs = [3, 4, 4]; vs' = [vs_1, V'_1, V'_2] = [4, 4, 2]; pg = [2.5, 3, 2.5]
    vs, pg = ref.vtrace(torch.zeros(3, dtype=F64), R, V, NO, AT1,
                        next_values=t(1.0, 4.0, 2.0), gamma=0.5, time_dim=-1)
    close(vs, t(3.0, 4.0, 4.0))
    close(pg, t(2.5, 3.0, 2.5))


def test_retrace_uses_next_steps_ratio():
    # Q = V, E = [1, 1.5, 2], ratios [1, .5, 1] -> c = [1, .5, 1]
    # delta = [1 + .5 - .5, 2 + .75 - 1, 3 + 1 - 1.5] = [1, 1.75, 2.5]
    # D_2 = 2.5; D_1 = 1.75 + .5*c_2*2.5 = 3; D_0 = 1 + .5*c_1*3 = 1.75
    # (with c_t instead of c_{t+1}: D_1 would be 2.375)
    log_rhos = t(0.0, math.log(0.5), 0.0)
    q = ref.retrace(log_rhos, R, V, t(1.0, 1.5, 2.0), NO, gamma=0.5, time_dim=-1)
    close(q, t(2.25, 4.0, 4.0))


def test_expected_next_q_from_actions():
    probs = torch.tensor([[0.25, 0.75], [1.0, 0.0]], dtype=F64)
    q = torch.tensor([[4.0, 8.0], [3.0, 100.0]], dtype=F64)
    close(ref.expected_next_q_from_actions(probs, q), t(7.0, 3.0))


# --------------------------------------------------------------------- forward scans


def test_eligibility_traces_cut_after_done():
    # decay .5; done at 1: z = [1, 1 + .5*1, 1 + 0, 1 + .5*1] = [1, 1.5, 1, 1.5]
    x = torch.ones(4, dtype=F64)
    done = t(0.0, 1.0, 0.0, 0.0)
    close(ref.eligibility_traces(x, done, gamma=0.5, lmbda=1.0, time_dim=-1), t(1.0, 1.5, 1.0, 1.5))
    # init 2: z_0 = 1 + .5*2 = 2; z_1 = 1 + .5*2 = 2; z_2 = 1; z_3 = 1.5
    close(ref.eligibility_traces(x, done, gamma=0.5, lmbda=1.0, init=torch.tensor(2.0),
                                 time_dim=-1),
          t(2.0, 2.0, 1.0, 1.5))


def test_eligibility_traces_decay_is_the_previous_steps():
    # gamma = [.5, .25, 1, .1] (the last never used), lmbda = 1:
    # z = [1, 1 + .5*1, 1 + .25*1.5, 1 + 1*1.375] = [1, 1.5, 1.375, 2.375]
    x = torch.ones(4, dtype=F64)
    g = t(0.5, 0.25, 1.0, 0.1)
    close(ref.eligibility_traces(x, torch.zeros(4), gamma=g, lmbda=1.0, time_dim=-1),
          t(1.0, 1.5, 1.375, 2.375))


def test_eligibility_traces_feature_axes():
    # x [B=2, T=3, F=2], done [2, 3], time_dim=-2; stream 1 is done at step 0
    x = torch.ones(2, 3, 2, dtype=F64)
    x[:, :, 1] = 2.0
    done = torch.tensor([[0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    z = ref.eligibility_traces(x, done, gamma=0.5, lmbda=1.0, time_dim=-2)
    assert z.shape == (2, 3, 2)
    close(z[0, :, 0], t(1.0, 1.5, 1.75))
    close(z[0, :, 1], t(2.0, 3.0, 3.5))
    close(z[1, :, 0], t(1.0, 1.0, 1.5))
    close(z[1, :, 1], t(2.0, 2.0, 3.0))


def test_episodic_cumsum():
    # done at 1, init 10: C = [11, 13, 3, 7]
    x = t(1.0, 2.0, 3.0, 4.0)
    done = t(0.0, 1.0, 0.0, 0.0)
    close(ref.episodic_cumsum(x, done, init=torch.tensor(10.0, dtype=F64), time_dim=-1),
          t(11.0, 13.0, 3.0, 7.0))
    # time-major [T, B] with time_dim=0
    xb = torch.stack([x, 2 * x], dim=1)
    db = torch.stack([done, torch.zeros(4)], dim=1)
    out = ref.episodic_cumsum(xb, db, time_dim=0)
    close(out[:, 0], t(1.0, 3.0, 3.0, 7.0))
    close(out[:, 1], t(2.0, 6.0, 12.0, 20.0))


def test_linear_recurrence():
    a = t(1.0, 2.0, 3.0)
    b = t(0.5, 0.5, 0.5)
    # backward: h = [1 + .5*3.5, 2 + .5*3, 3] = [2.75, 3.5, 3]; init 4: [3.25, 4.5, 5]
    close(ref.linear_recurrence(a, b, time_dim=-1), t(2.75, 3.5, 3.0))
    close(ref.linear_recurrence(a, b, init=torch.tensor(4.0), time_dim=-1), t(3.25, 4.5, 5.0))
    # forward: h = [1, 2.5, 4.25]; init 4: [3, 3.5, 4.75]
    close(ref.linear_recurrence(a, b, reverse=False, time_dim=-1), t(1.0, 2.5, 4.25))
    close(ref.linear_recurrence(a, b, reverse=False, init=torch.tensor(4.0), time_dim=-1),
          t(3.0, 3.5, 4.75))


# ---------------------------------------------------------------- layout handling


@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns"])
def test_reference_layout_is_per_stream(name):
    """Batch of streams in [B, T], [T, B] and [B, T, 1] equals each stream on its own."""
    gen = torch.Generator().manual_seed(0)
    B, T = 3, 6
    r = torch.randn(B, T, generator=gen, dtype=F64)
    v = torch.randn(B, T, generator=gen, dtype=F64)
    term = torch.rand(B, T, generator=gen) < 0.3
    trunc = torch.rand(B, T, generator=gen) < 0.3
    boot = torch.randn(B, generator=gen, dtype=F64)
    fn = getattr(ref, name)

    def call(r, v, term, trunc, boot, time_dim):
        kw = dict(bootstrap_value=boot, gamma=0.9, time_dim=time_dim)
        if name == "discounted_returns":
            out = fn(r, term, trunc, **kw)
        else:
            out = fn(r, v, term, trunc, lmbda=0.8, **kw)
        return out[0] if name == "gae" else out

    rows = torch.stack([call(r[b], v[b], term[b], trunc[b], boot[b], -1) for b in range(B)])
    close(call(r, v, term, trunc, boot, -1), rows)
    close(call(r.T, v.T, term.T, trunc.T, boot, 0), rows.T)
    bt1 = call(r[..., None], v[..., None], term[..., None], trunc[..., None], boot[:, None], -2)
    close(bt1, rows[..., None])


def test_reference_empty_time_axis():
    e = torch.zeros(3, 0, dtype=F64)
    adv, target = ref.gae(e, e, e.bool(), time_dim=-1)
    assert adv.shape == (3, 0) and target.shape == (3, 0)
    assert ref.lambda_returns(e, e, e, time_dim=-1).shape == (3, 0)
    assert ref.discounted_returns(e, e, bootstrap_value=torch.zeros(3), time_dim=-1).shape == (3, 0)
    assert ref.eligibility_traces(e, e, time_dim=-1).shape == (3, 0)
    assert ref.episodic_cumsum(e, e, time_dim=-1).shape == (3, 0)
    assert ref.linear_recurrence(e, e, time_dim=-1).shape == (3, 0)


def test_reference_rejects_both_next_values_and_bootstrap():
    with pytest.raises(ValueError, match="bootstrap_value"):
        ref.gae(R, V, NO, next_values=V, bootstrap_value=BOOT, time_dim=-1)
