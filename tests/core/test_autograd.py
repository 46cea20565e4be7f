"""Gradients of gae, lambda_returns and discounted_returns w.r.t. rewards, values,
next_values and bootstrap_value: torch.autograd.gradcheck in float64, and the same
gradients as autograd through the float64 reference (a differentiable torch loop)."""

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref

CASES = {
    "gae_shifted": (lambda m, r, v, nv, b, te, tr, td: m.gae(
        r, v, te, tr, bootstrap_value=b, gamma=0.9, lmbda=0.8, time_dim=td), "rvb"),
    "gae_next_values": (lambda m, r, v, nv, b, te, tr, td: m.gae(
        r, v, te, tr, next_values=nv, gamma=0.95, lmbda=0.7, time_dim=td), "rvn"),
    "lambda_shifted": (lambda m, r, v, nv, b, te, tr, td: m.lambda_returns(
        r, v, te, tr, bootstrap_value=b, gamma=0.9, lmbda=0.6, time_dim=td), "rvb"),
    "lambda_next_values": (lambda m, r, v, nv, b, te, tr, td: m.lambda_returns(
        r, v, te, tr, next_values=nv, gamma=0.9, lmbda=0.6, time_dim=td), "rn"),
    "discounted": (lambda m, r, v, nv, b, te, tr, td: m.discounted_returns(
        r, te, tr, bootstrap_value=b, gamma=0.9, time_dim=td), "rb"),
}


def _inputs(seed, shape, td, device):
    g = torch.Generator().manual_seed(seed)
    make = lambda s: torch.randn(s, generator=g, dtype=torch.float64)  # noqa: E731
    r, v, nv = make(shape), make(shape), make(shape)
    notime = tuple(n for i, n in enumerate(shape) if i != td % len(shape))
    b = make(notime)
    te = torch.rand(shape, generator=g) < 0.2
    tr = torch.rand(shape, generator=g) < 0.2
    # stream 0 is not terminated at the window end, so the bootstrap value has a gradient
    last = [0] * len(shape)
    last[td % len(shape)] = shape[td] - 1
    te[tuple(last)] = False
    return [t.to(device) for t in (r, v, nv, b, te, tr)]


@pytest.mark.parametrize("layout", [((3, 11), -1), ((11, 2), 0)])
@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck_and_reference_gradients(case, layout, impl, seed):
    shape, td = layout
    fn, wrt = CASES[case]
    r, v, nv, b, te, tr = _inputs(seed, shape, td, impl.device)
    leaves = {"r": r, "v": v, "n": nv, "b": b}
    for k in wrt:
        leaves[k].requires_grad_(True)

    def f(lib, *xs):
        named = {k: x.to(xs[0].device) for k, x in leaves.items()}
        named.update(zip(wrt, xs))
        dev = xs[0].device  # the reference runs on CPU copies of everything
        return fn(lib, named["r"], named["v"], named["n"], named["b"], te.to(dev), tr.to(dev),
                  td)

    xs = [leaves[k] for k in wrt]
    if not impl.is_interp:  # the interpreter is slow: reference comparison only
        assert torch.autograd.gradcheck(lambda *a: f(rc, *a), xs)
    out = f(rc, *xs)
    out = out if isinstance(out, tuple) else (out,)
    ref_xs = [x.detach().cpu().requires_grad_(True) for x in xs]
    want = f(ref, *ref_xs)
    want = want if isinstance(want, tuple) else (want,)
    g = torch.Generator().manual_seed(seed + 1)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    got_grads = torch.autograd.grad(
        sum((o * w.to(o.device)).sum() for o, w in zip(out, weights)), xs)
    want_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), ref_xs)
    for name, gg, wg in zip(wrt, got_grads, want_grads):
        assert gg.shape == wg.shape, name
        assert wg.abs().max() > 0, name
        torch.testing.assert_close(gg.cpu(), wg, rtol=1e-9, atol=1e-9, msg=f"d/d{name}")


def test_no_grad_needed_means_no_graph(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    r, v = torch.randn(2, 5), torch.randn(2, 5)
    adv, target = rc.gae(r, v, torch.zeros(2, 5, dtype=torch.bool))
    assert adv.grad_fn is None and not adv.requires_grad
