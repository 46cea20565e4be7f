"""A real tensor with the negative bit (``z.conj().imag``) holds its values' negatives in
memory. Every path must read its values: the checked full path, a repeated call that
finds a recorded plan of the same layout, the CPU's C replay and the autograd path; and
an ``out=`` tensor with the bit is refused (a kernel would write its memory)."""

import pytest
import torch

import rl_triton_core as rc


def _neg_view(x: torch.Tensor) -> torch.Tensor:
    """A view whose values are ``x`` and whose memory holds ``-x`` (the negative bit)."""
    z = torch.complex(torch.zeros_like(x), -x)
    view = z.conj().imag
    assert view.is_neg() and torch.equal(view, x)
    return view


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_negative_views_read_as_their_values(impl, gen):
    dev = impl.device
    r, v = (torch.randn(3, 40, generator=gen).to(dev) for _ in range(2))
    lr = (0.3 * torch.randn(3, 40, generator=gen)).to(dev)
    d = (torch.rand(3, 40, generator=gen) < 0.1).to(dev)
    calls = {
        "gae": lambda r, v: rc.gae(r, v, d, gamma=0.9, lmbda=0.8, time_dim=-1),
        "lambda_returns": lambda r, v: rc.lambda_returns(r, v, d, gamma=0.9, time_dim=-1),
        "discounted_returns": lambda r, v: rc.discounted_returns(r, d, gamma=0.9,
                                                                 time_dim=-1),
        "vtrace": lambda r, v: rc.vtrace(lr, r, v, d, gamma=0.9, time_dim=-1),
        "eligibility_traces": lambda r, v: rc.eligibility_traces(r, d, gamma=0.9, lmbda=0.8,
                                                                 time_dim=-1),
        "episodic_cumsum": lambda r, v: rc.episodic_cumsum(r, d, time_dim=-1),
    }
    same_strides = getattr(torch, "_neg_view", None)  # the bit on a contiguous view
    with rc.tuning(cpu_plans=True):  # the interpreter records plans too
        for name, call in calls.items():
            want = call(r, v)
            call(r, v)  # a plan of this layout is recorded and replayed
            assert _same(call(_neg_view(r), _neg_view(v)), want), name
            assert _same(call(_neg_view(r), v), want), name  # and again, one of two
            if same_strides is not None:  # the plain call's shapes and strides exactly
                nr, nv = same_strides(-r), same_strides(-v)
                assert nr.is_neg() and nr.stride() == r.stride()
                assert _same(call(nr, nv), want), name
                assert _same(call(nr, nv), want), name


def test_negative_view_with_grad(impl, gen):
    dev = impl.device
    r, v = (torch.randn(3, 40, generator=gen).to(dev) for _ in range(2))
    d = (torch.rand(3, 40, generator=gen) < 0.1).to(dev)
    vg = v.clone().requires_grad_()
    adv, _ = rc.gae(r, vg, d, gamma=0.9, lmbda=0.8, time_dim=-1)
    adv.sum().backward()
    z = torch.complex(torch.zeros_like(v), -v).requires_grad_()
    vn = z.conj().imag  # values v, negative bit, in the graph of z
    adv_n, _ = rc.gae(_neg_view(r), vn, d, gamma=0.9, lmbda=0.8, time_dim=-1)
    assert torch.equal(adv_n, adv.detach())
    adv_n.sum().backward()
    assert torch.equal(-z.grad.imag, vg.grad)  # d vn / d z.imag = -1


def test_negative_out_is_refused(impl, gen):
    dev = impl.device
    r, v = (torch.randn(3, 40, generator=gen).to(dev) for _ in range(2))
    d = (torch.rand(3, 40, generator=gen) < 0.1).to(dev)
    # (filled: uninitialized memory may hold NaN, which _neg_view's equality check rejects)
    outs = (_neg_view(torch.randn(3, 40, generator=gen).to(dev)), torch.empty_like(r))
    with pytest.raises(ValueError, match="negative bit"):
        rc.gae(r, v, d, time_dim=-1, out=outs)
