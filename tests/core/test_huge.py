"""Tensors past 2^31 elements on the GPU: every estimator and every fused backward pass,
batch-major ``[2^20, 2049]`` and time-major ``[2049, 2^20]`` (2^31 + 2^20 elements: the
last row, or the last time step, lies past int32's reach), float32.

Only a subset of the streams is checked, against the float64 reference on those
streams (each stream's outputs depend on that stream alone): the first, the last and a
few random ones. Gradients likewise: autograd through the reference on the subset, with
the same upstream gradient. Tensors are freed between cases; the largest case (a
backward pass) holds about 10 tensors of 8.6 GB. Needs ~120 GB of GPU memory (the H200).
"""

import gc

import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import reference as ref

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

N, T = 2**20, 2049
NEED_BYTES = 120 * 2**30
assert N * T > 2**31


def _needs_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if torch.cuda.get_device_properties(0).total_memory < NEED_BYTES:
        pytest.skip("needs ~120 GB of GPU memory")


@pytest.fixture(autouse=True)
def _free():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _streams(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    rest = torch.randint(1, n - 1, (4,), generator=g).tolist()
    return torch.tensor(sorted({0, n - 1, *rest}))


class Data:
    """Random inputs of the layout's shape, made on the GPU one at a time."""

    def __init__(self, layout, n=N):
        self.layout, self.n = layout, n
        self.shape = (n, T) if layout == "batch" else (T, n)
        self.td = -1 if layout == "batch" else 0
        self.idx = _streams(n)
        self.gen = torch.Generator(device="cuda").manual_seed(1)

    def randn(self, scale=1.0):
        return torch.randn(self.shape, device="cuda", generator=self.gen).mul_(scale)

    def flags(self, one_in=50):
        u = torch.randint(0, one_in, self.shape, device="cuda", generator=self.gen,
                          dtype=torch.uint8)
        return u == 0

    def notime(self):
        return torch.randn(self.n, device="cuda", generator=self.gen)

    def sub(self, t):
        """The checked streams of a data tensor (or a per-stream one), float64 on CPU."""
        i = self.idx.to(t.device)
        if t.dim() == 1:
            return t[i].double().cpu()
        return (t[i] if self.layout == "batch" else t[:, i]).double().cpu()

    def sub_flag(self, t):
        i = self.idx.to(t.device)
        return (t[i] if self.layout == "batch" else t[:, i]).cpu()


def _check(got, want, name, tol=2e-5):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        err = (g - w).abs().max().item()
        scale = max(1.0, w.abs().max().item())
        assert err <= tol * scale, f"{name} output {k}: max err {err:.3g} (scale {scale:.3g})"


LAYOUTS = ["batch", "time"]


def _forward_case(name, d):
    """(library call, reference call on the subset) of ``name`` on fresh inputs."""
    td, S, F = d.td, d.sub, d.sub_flag
    r, te = d.randn(), d.flags()
    kw = dict(gamma=0.99, time_dim=td)
    if name in ("gae", "lambda_returns", "vtrace", "retrace"):
        v = d.randn()
    if name == "gae":
        tr, b = d.flags(100), d.notime()
        return (lambda: rc.gae(r, v, te, tr, bootstrap_value=b, lmbda=0.95, **kw),
                lambda: ref.gae(S(r), S(v), F(te), F(tr), bootstrap_value=S(b), lmbda=0.95,
                                **kw))
    if name == "lambda_returns":
        b = d.notime()
        return (lambda: rc.lambda_returns(r, v, te, bootstrap_value=b, lmbda=0.9, **kw),
                lambda: ref.lambda_returns(S(r), S(v), F(te), bootstrap_value=S(b), lmbda=0.9,
                                           **kw))
    if name == "discounted_returns":
        tr, b = d.flags(100), d.notime()
        return (lambda: rc.discounted_returns(r, te, tr, bootstrap_value=b, **kw),
                lambda: ref.discounted_returns(S(r), F(te), F(tr), bootstrap_value=S(b), **kw))
    if name == "vtrace":
        lr, b = d.randn(0.3), d.notime()
        return (lambda: rc.vtrace(lr, r, v, te, bootstrap_value=b, lmbda=0.95, c_bar=0.9, **kw),
                lambda: ref.vtrace(S(lr), S(r), S(v), F(te), bootstrap_value=S(b), lmbda=0.95,
                                   c_bar=0.9, **kw))
    if name == "retrace":
        lr, e = d.randn(0.3), d.randn()
        return (lambda: rc.retrace(lr, r, v, e, te, lmbda=0.95, **kw),
                lambda: ref.retrace(S(lr), S(r), S(v), S(e), F(te), lmbda=0.95, **kw))
    if name == "eligibility_traces":
        return (lambda: rc.eligibility_traces(r, te, lmbda=0.9, **kw),
                lambda: ref.eligibility_traces(S(r), F(te), lmbda=0.9, **kw))
    if name == "episodic_cumsum":
        return (lambda: rc.episodic_cumsum(r, te, time_dim=td),
                lambda: ref.episodic_cumsum(S(r), F(te), time_dim=td))
    if name == "linear_recurrence":
        del te
        beta = torch.sigmoid_(d.randn())
        return (lambda: rc.linear_recurrence(r, beta, time_dim=td),
                lambda: ref.linear_recurrence(S(r), S(beta), time_dim=td))
    raise AssertionError(name)


FORWARD = ["gae", "lambda_returns", "discounted_returns", "vtrace", "retrace",
           "eligibility_traces", "episodic_cumsum", "linear_recurrence"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", FORWARD)
def test_huge_forward(name, layout):
    _needs_gpu()
    d = Data(layout)
    call, want = _forward_case(name, d)
    got = call()
    got = got if isinstance(got, tuple) else (got,)
    assert all(g.shape == d.shape and g.dtype == torch.float32 for g in got)
    sub = tuple(d.sub(g) for g in got)
    del got, call
    _check(sub, want(), f"{name} {layout}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_huge_retrace_from_actions(layout):
    """The per-action form: [2^19, 2049, 2] (or [2049, 2^19, 2]) per-action inputs, past
    2^31 elements (the gathers and the expected-Q sum; the scan's 2^30 are below)."""
    _needs_gpu()
    d = Data(layout, n=2**19)
    g = d.gen
    q = torch.randn(d.shape + (2,), device="cuda", generator=g)
    p = torch.rand(d.shape + (2,), device="cuda", generator=g).mul_(0.8).add_(0.1)
    a = torch.randint(0, 2, d.shape, device="cuda", generator=g, dtype=torch.uint8)
    mu = torch.rand(d.shape, device="cuda", generator=g).mul_(0.8).add_(0.1).log_()
    r, te = d.randn(), d.flags()
    got = d.sub(rc.retrace_from_actions(q, p, a, mu, r, te, gamma=0.99, lmbda=0.95,
                                        time_dim=d.td))
    i = d.idx.cuda()
    pick = (lambda t: t[i]) if layout == "batch" else (lambda t: t[:, i])
    qs, ps, as_, ms = (pick(t).double().cpu() if t.is_floating_point() else pick(t).cpu()
                       for t in (q, p, a, mu))
    idx = as_.long().unsqueeze(-1)
    log_rhos = ps.gather(-1, idx).squeeze(-1).log() - ms
    own = (ps * qs).sum(-1)
    td = d.td % 2
    e = torch.cat([own.narrow(td, 1, T - 1), torch.zeros_like(own.narrow(td, 0, 1))], td)
    want = ref.retrace(log_rhos, d.sub(r), qs.gather(-1, idx).squeeze(-1), e, d.sub_flag(te),
                       gamma=0.99, lmbda=0.95, time_dim=d.td)
    _check(got, want, f"retrace_from_actions {layout}")


# the fused backward passes (one adjoint scan each): (name, inputs taking gradients)
BACKWARD = {"gae": ("r", "v"), "lambda_returns": ("r", "v"), "discounted_returns": ("r",),
            "vtrace": ("r", "v"), "eligibility_traces": ("x",), "episodic_cumsum": ("x",)}


def _backward_fn(lib, name, te, td, lr=None):
    kw = dict(time_dim=td)
    if name == "gae":
        return lambda r, v: lib.gae(r, v, te, gamma=0.99, lmbda=0.95, **kw)
    if name == "lambda_returns":
        return lambda r, v: lib.lambda_returns(r, v, te, gamma=0.99, lmbda=0.9, **kw)
    if name == "discounted_returns":
        return lambda r: lib.discounted_returns(r, te, gamma=0.99, **kw)
    if name == "vtrace":
        return lambda r, v: lib.vtrace(lr, r, v, te, gamma=0.99, lmbda=0.95, **kw)
    if name == "eligibility_traces":
        return lambda x: lib.eligibility_traces(x, te, gamma=0.99, lmbda=0.9, **kw)
    return lambda x: lib.episodic_cumsum(x, te, **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(BACKWARD))
def test_huge_backward(name, layout):
    _needs_gpu()
    d = Data(layout)
    te = d.flags()
    lr = d.randn(0.3) if name == "vtrace" else None
    xs = [d.randn().requires_grad_(True) for _ in BACKWARD[name]]
    out = _backward_fn(rc, name, te, d.td, lr)(*xs)
    out = out if isinstance(out, tuple) else (out,)
    gos = [d.randn() for _ in out]
    grads = torch.autograd.grad(out, xs, gos)
    del out
    got = tuple(d.sub(g) for g in grads)
    del grads
    sub_xs = [d.sub(x.detach()).requires_grad_(True) for x in xs]
    sub_lr = None if lr is None else d.sub(lr)
    want_out = _backward_fn(ref, name, d.sub_flag(te), d.td, sub_lr)(*sub_xs)
    want_out = want_out if isinstance(want_out, tuple) else (want_out,)
    want = torch.autograd.grad(want_out, sub_xs, [d.sub(g) for g in gos])
    _check(got, want, f"{name} backward {layout}")
