"""Flags: nonzero means set, exactly as ``flag.bool()`` reads it (2.0, 7, -1 and NaN are
set), on every path: the kernels, the CPU path, the reference and the backward passes."""

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref


def _flags(gen, shape, kind):
    """A flag tensor of ``kind`` with values other than 0/1, and its bool reading."""
    pick = torch.randint(0, 6, shape, generator=gen)
    if kind == "float":
        table = torch.tensor([0.0, -0.0, 0.0, 2.0, -1.0, float("nan")])  # -0.0 is not set
        f = table[pick]
    else:  # uint8
        f = torch.tensor([0, 0, 0, 2, 7, 255], dtype=torch.uint8)[pick]
    return f, f.bool()


def _cases(r, v, nv, lr, b, x, init):
    return {
        "gae": lambda te, tr: rc.gae(r, v, te, tr, bootstrap_value=b, gamma=0.9, lmbda=0.8,
                                     time_dim=-1),
        "gae_next": lambda te, tr: rc.gae(r, v, te, tr, next_values=nv, gamma=0.9, lmbda=0.8,
                                          time_dim=-1),
        "lambda_returns": lambda te, tr: rc.lambda_returns(r, v, te, tr, bootstrap_value=b,
                                                           gamma=0.9, lmbda=0.7, time_dim=-1),
        "discounted_returns": lambda te, tr: rc.discounted_returns(r, te, tr, next_values=nv,
                                                                   gamma=0.9, time_dim=-1),
        "vtrace": lambda te, tr: rc.vtrace(lr, r, v, te, tr, bootstrap_value=b, gamma=0.9,
                                           time_dim=-1),
        "retrace": lambda te, tr: rc.retrace(lr, r, v, nv, te, tr, gamma=0.9, lmbda=0.9,
                                             time_dim=-1),
        "eligibility_traces": lambda te, tr: rc.eligibility_traces(x, te, gamma=0.9, lmbda=0.8,
                                                                   init=init, time_dim=-1),
        "episodic_cumsum": lambda te, tr: rc.episodic_cumsum(x, tr, init=init, time_dim=-1),
    }


@pytest.mark.parametrize("kind", ["float", "uint8"])
def test_nonzero_flags_read_as_set(kind, impl, gen):
    shape = (3, 37)
    dev = impl.device
    r, v, nv, lr, x = (torch.randn(shape, generator=gen).to(dev) for _ in range(5))
    b, init = (torch.randn(shape[0], generator=gen).to(dev) for _ in range(2))
    te, te_bool = (t.to(dev) for t in _flags(gen, shape, kind))
    tr, tr_bool = (t.to(dev) for t in _flags(gen, shape, kind))
    assert te_bool.any() and (te != 1).logical_and(te != 0).any()  # not just 0/1
    for name, call in _cases(r, v, nv, lr, b, x, init).items():
        got, want = call(te, tr), call(te_bool, tr_bool)
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            assert torch.isfinite(g).all(), name
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("kind", ["float", "uint8"])
def test_sparse_flags_read_as_set(kind, impl, gen):
    """Long streams with few flags (most 16-step vectors have none, where the CPU's fast
    walk tests a vector's flags on their bits), unset ones written -0.0 in float."""
    shape = (2, 1000)
    dev = impl.device
    r, v, nv = (torch.randn(shape, generator=gen).to(dev) for _ in range(3))
    b = torch.randn(shape[0], generator=gen).to(dev)
    pick = torch.rand(shape, generator=gen) < 0.004
    if kind == "float":
        te = torch.where(pick, torch.tensor(float("nan")), torch.tensor(-0.0))
        te[:, ::97] = -0.0
        tr = torch.where(torch.rand(shape, generator=gen) < 0.004, torch.tensor(-3.0),
                         torch.tensor(0.0))
    else:
        te = torch.where(pick, torch.tensor(9, dtype=torch.uint8), torch.tensor(0,
                         dtype=torch.uint8))
        tr = (torch.rand(shape, generator=gen) < 0.004).to(torch.uint8) * 200
    te, tr = te.to(dev), tr.to(dev)
    for name, call in _cases(r, v, nv, r, b, r, b).items():
        if name in ("vtrace", "retrace", "eligibility_traces", "episodic_cumsum"):
            continue
        got, want = call(te, tr), call(te.bool(), tr.bool())
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0, msg=name)


def test_reference_reads_flags_as_bool(gen):
    shape = (2, 25)
    r, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    te, te_bool = _flags(gen, shape, "float")
    got = ref.gae(r, v, te, gamma=0.9, lmbda=0.8, time_dim=-1)
    want = ref.gae(r, v, te_bool, gamma=0.9, lmbda=0.8, time_dim=-1)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_issue_example_terminated_two():
    """terminated = 2.0 at the last step, gamma 0.9, lambda 1: Monte-Carlo advantages."""
    r = torch.ones(3)
    v = torch.zeros(3)
    te = torch.tensor([0.0, 0.0, 2.0])
    adv, _ = rc.gae(r, v, te, gamma=0.9, lmbda=1.0, time_dim=-1)
    torch.testing.assert_close(adv, torch.tensor([2.71, 1.9, 1.0]))


@pytest.mark.parametrize("kind", ["float", "uint8"])
def test_nonzero_flags_in_the_backward_passes(kind, impl, gen):
    shape = (2, 30)
    dev = impl.device
    te, te_bool = (t.to(dev) for t in _flags(gen, shape, kind))
    tr, tr_bool = (t.to(dev) for t in _flags(gen, shape, kind))
    base = [torch.randn(shape, generator=gen, dtype=torch.float64).to(dev) for _ in range(3)]
    boot = torch.randn(shape[0], generator=gen, dtype=torch.float64).to(dev)

    def grads(flag_t, flag_d):
        r, v, x = (t.clone().requires_grad_(True) for t in base)
        bb = boot.clone().requires_grad_(True)
        adv, tgt = rc.gae(r, v, flag_t, flag_d, bootstrap_value=bb, gamma=0.9, lmbda=0.8,
                          time_dim=-1)
        vs, pg = rc.vtrace(base[2], r, v, flag_t, flag_d, bootstrap_value=bb, gamma=0.95,
                           time_dim=-1)
        z = rc.eligibility_traces(x, flag_d, gamma=0.9, lmbda=0.7, time_dim=-1)
        loss = (adv * 1.3).sum() + tgt.pow(2).sum() + vs.sum() + (pg * 0.7).sum() + z.pow(2).sum()
        return torch.autograd.grad(loss, (r, v, x, bb))

    for g, w in zip(grads(te, tr), grads(te_bool, tr_bool)):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
