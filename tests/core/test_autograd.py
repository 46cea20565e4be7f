"""Gradients of every estimator with a backward pass: gae, lambda_returns and
discounted_returns (w.r.t. rewards, values, next_values, bootstrap_value), vtrace (the
same; log_rhos, flags, gamma and the thresholds are constants), linear_recurrence
(alpha, beta, init, both directions), eligibility_traces and episodic_cumsum (x, init).

Checked by torch.autograd.gradcheck in float64 (full on the CPU path, fast mode under
the interpreter and on CUDA) and against autograd through the float64 reference (a
differentiable torch loop) run on CPU copies of everything, flags included."""

import pytest
import torch

import rl_triton_core as rc
import rl_triton_core.reference as ref


def _full(m, t, like):
    """The reference wants beta at alpha's full shape; the library gets it broadcast."""
    return t.expand(like.shape) if m is ref else t


def _ftd(td):
    """time_dim of x with one trailing feature axis."""
    return td if td >= 0 else td - 1


# name -> (fn(module, inputs, time_dim), the inputs differentiated)
CASES = {
    "gae_shifted": (lambda m, d, td: m.gae(
        d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.9, lmbda=0.8,
        time_dim=td), "r v b"),
    "gae_next_values": (lambda m, d, td: m.gae(
        d["r"], d["v"], d["te"], d["tr"], next_values=d["n"], gamma=0.95, lmbda=0.7,
        time_dim=td), "r v n"),
    "lambda_shifted": (lambda m, d, td: m.lambda_returns(
        d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.9, lmbda=0.6,
        time_dim=td), "r v b"),
    "gae_float_flags": (lambda m, d, td: m.gae(
        d["r"], d["v"], d["te"].double(), d["tr"].to(torch.uint8), bootstrap_value=d["b"],
        gamma=0.9, lmbda=0.8, time_dim=td), "r v b"),
    "lambda_next_values": (lambda m, d, td: m.lambda_returns(
        d["r"], d["v"], d["te"], d["tr"], next_values=d["n"], gamma=0.9, lmbda=0.6,
        time_dim=td), "r n"),
    "lambda_gamma_tensor": (lambda m, d, td: m.lambda_returns(
        d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=d["gb"], lmbda=0.6,
        time_dim=td), "r v b"),
    "discounted": (lambda m, d, td: m.discounted_returns(
        d["r"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.9, time_dim=td), "r b"),
    "vtrace_shifted": (lambda m, d, td: m.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.9,
        lmbda=0.95, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2, time_dim=td), "r v b"),
    "vtrace_shifted_tensor_coefs": (lambda m, d, td: m.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=d["gb"],
        lmbda=0.5 + 0.5 * d["gb"], rho_bar=0.8 + d["gb"], c_bar=0.6 + d["gb"],
        pg_rho_bar=0.9 + d["gb"], time_dim=td), "r v b"),
    "vtrace_float_flags": (lambda m, d, td: m.vtrace(
        d["lr"], d["r"], d["v"], d["te"].double(), d["tr"].to(torch.uint8),
        bootstrap_value=d["b"], gamma=0.9, lmbda=0.9, time_dim=td), "r v b"),
    "vtrace_next_values_gamma_tensor": (lambda m, d, td: m.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], next_values=d["n"], gamma=d["gb"],
        rho_bar=1.1, time_dim=td), "r v n"),
    "linrec_reverse": (lambda m, d, td: m.linear_recurrence(
        d["r"], d["beta"], init=d["b"], reverse=True, time_dim=td), "r beta b"),
    "linrec_forward": (lambda m, d, td: m.linear_recurrence(
        d["r"], d["beta"], init=d["b"], reverse=False, time_dim=td), "r beta b"),
    "linrec_broadcast_beta_reverse": (lambda m, d, td: m.linear_recurrence(
        d["r"], _full(m, d["bb"], d["r"]), init=d["b"], time_dim=td), "r bb b"),
    "linrec_broadcast_beta_forward": (lambda m, d, td: m.linear_recurrence(
        d["r"], _full(m, d["bb"], d["r"]), reverse=False, time_dim=td), "r bb"),
    "traces": (lambda m, d, td: m.eligibility_traces(
        d["r"], d["tr"], gamma=0.9, lmbda=0.8, init=d["b"], time_dim=td), "r b"),
    "traces_features_gamma_tensor": (lambda m, d, td: m.eligibility_traces(
        d["xf"], d["tr"], gamma=d["gb"], lmbda=0.7, init=d["bf"], time_dim=_ftd(td)), "xf bf"),
    "cumsum": (lambda m, d, td: m.episodic_cumsum(
        d["r"], d["tr"], init=d["b"], time_dim=td), "r b"),
    "cumsum_features": (lambda m, d, td: m.episodic_cumsum(
        d["xf"], d["tr"], time_dim=_ftd(td)), "xf"),
}


def _inputs(seed, shape, td, device):
    g = torch.Generator().manual_seed(seed)
    make = lambda s: torch.randn(s, generator=g, dtype=torch.float64)  # noqa: E731
    pos = td % len(shape)
    notime = tuple(n for i, n in enumerate(shape) if i != pos)
    per_step = tuple(n if i == pos else 1 for i, n in enumerate(shape))  # broadcast over batch
    d = dict(r=make(shape), v=make(shape), n=make(shape), b=make(notime),
             lr=0.5 * make(shape),  # ratios on both sides of the clip thresholds
             beta=2 * torch.rand(shape, generator=g, dtype=torch.float64) - 1,
             bb=2 * torch.rand(per_step, generator=g, dtype=torch.float64) - 1,
             gb=torch.rand(per_step, generator=g, dtype=torch.float64),
             xf=make(shape + (2,)), bf=make(notime + (2,)))
    te = torch.rand(shape, generator=g) < 0.2
    tr = torch.rand(shape, generator=g) < 0.2
    # stream 0 is not terminated at the window end, so the bootstrap value has a gradient
    last = [0] * len(shape)
    last[pos] = shape[td] - 1
    te[tuple(last)] = False
    # and stream 1 is, so the terminated factor of the bootstrap gradient is exercised
    if len(shape) == 2 and shape[1 - pos] > 1:
        last[1 - pos] = 1
        te[tuple(last)] = True
    d.update(te=te, tr=tr)
    return {k: t.to(device) for k, t in d.items()}


def _check(case, shape, td, device, seed, gradcheck="full", cases=CASES):
    """gradcheck (``full``, ``fast`` or None) and the comparison of one case's outputs and
    gradients (of a random weighting of the outputs) on ``device`` against autograd
    through the float64 reference on CPU copies (``cases``: name -> (fn, the inputs
    differentiated), as ``CASES``)."""
    fn, wrt = cases[case]
    wrt = wrt.split()
    inputs = _inputs(seed, shape, td, device)
    for k in wrt:
        inputs[k].requires_grad_(True)

    def f(lib, *xs):
        dev = xs[0].device  # the reference runs on CPU copies of everything
        named = {k: x.to(dev) for k, x in inputs.items()}
        named.update(zip(wrt, xs))
        return fn(lib, named, td)

    xs = [inputs[k] for k in wrt]
    if gradcheck:
        assert torch.autograd.gradcheck(lambda *a: f(rc, *a), xs, fast_mode=gradcheck == "fast")
    out = f(rc, *xs)
    out = out if isinstance(out, tuple) else (out,)
    ref_xs = [x.detach().cpu().requires_grad_(True) for x in xs]
    want = f(ref, *ref_xs)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(out, want):
        torch.testing.assert_close(o.detach().cpu(), w.detach(), rtol=1e-9, atol=1e-9)
    g = torch.Generator().manual_seed(seed + 1)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in want]
    got_grads = torch.autograd.grad(
        sum((o * w.to(o.device)).sum() for o, w in zip(out, weights)), xs)
    want_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), ref_xs)
    for name, gg, wg in zip(wrt, got_grads, want_grads):
        assert gg.shape == wg.shape, name
        assert gg.dtype == wg.dtype, name
        assert wg.abs().max() > 0, name
        torch.testing.assert_close(gg.cpu(), wg, rtol=1e-9, atol=1e-9, msg=f"d/d{name}")


@pytest.mark.parametrize("layout", [((3, 11), -1), ((11, 2), 0)])
@pytest.mark.parametrize("case", list(CASES))
def test_gradcheck_and_reference_gradients(case, layout, impl, seed):
    shape, td = layout
    # the interpreter is slow: full gradcheck only on the CPU path, fast mode elsewhere
    _check(case, shape, td, impl.device, seed, gradcheck="full" if impl.name == "cpu" else "fast")


@pytest.mark.parametrize("layout", [((2, 4), -1), ((4, 2), 0)])
@pytest.mark.parametrize("case", ["vtrace_shifted", "vtrace_shifted_tensor_coefs",
                                  "linrec_broadcast_beta_reverse",
                                  "linrec_forward", "traces_features_gamma_tensor"])
# the interpreter's full gradchecks (10-20 s each on 2 cores) are in the long tier; the
# main tier has them in fast mode (test_gradcheck_and_reference_gradients)
@pytest.mark.parametrize("impl", ["cpu", pytest.param("interp", marks=pytest.mark.long),
                                  pytest.param("cuda", marks=pytest.mark.gpu)], indirect=True)
def test_full_gradcheck_small(case, layout, impl, seed):
    """Full gradcheck on the kernels too, at shapes small enough for the interpreter."""
    shape, td = layout
    _check(case, shape, td, impl.device, seed, gradcheck="full")


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("case", ["gae_shifted", "gae_next_values", "vtrace_shifted"])
def test_only_one_output_used(case, which, impl, seed):
    """A loss on one of the two outputs: the other's gradient arrives as None."""
    fn, wrt = CASES[case]
    wrt = wrt.split()
    shape, td = (3, 11), -1
    inputs = _inputs(seed, shape, td, impl.device)
    xs = [inputs[k].requires_grad_(True) for k in wrt]
    ref_xs = [x.detach().cpu().requires_grad_(True) for x in xs]
    cpu = {k: x.cpu() for k, x in inputs.items()}
    cpu.update(zip(wrt, ref_xs))
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = torch.autograd.grad((fn(rc, inputs, td)[which] * w.to(impl.device)).sum(), xs)
    want = torch.autograd.grad((fn(ref, cpu, td)[which] * w).sum(), ref_xs)
    for name, gg, wg in zip(wrt, got, want):
        torch.testing.assert_close(gg.cpu(), wg, rtol=1e-9, atol=1e-9, msg=f"d/d{name}")


@pytest.mark.parametrize("case", ["gae_shifted", "vtrace_shifted", "vtrace_shifted_tensor_coefs",
                                  "linrec_reverse", "linrec_forward", "traces"])
def test_reference_gradients_segmented(case, impl, seed, segments):
    """The backward scans through the segmented kernel path: 40 steps in
    segments of 16."""
    segments(16)
    # the tensor-threshold case: enough streams x segment starts (6 x 4) that a ratio
    # above a threshold meets a segment start on every seed
    shape = (6, 80) if case == "vtrace_shifted_tensor_coefs" else (2, 40)
    _check(case, shape, -1, impl.device, seed, gradcheck=None)


def test_gradients_flow_through_the_library_scan(monkeypatch):
    """Each backward runs the library's own scan (never the reference loop, never the
    public API): on the CPU path, one launch of the primitive's scan per backward."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    from rl_triton_core import _table, estimators
    from rl_triton_core.scan import _autograd

    calls = []
    real = _autograd._scan

    def spy(*a, **k):
        calls.append(k.get("reverse"))
        return real(*a, **k)

    for name in ref.__all__:
        monkeypatch.setattr(ref, name, None)  # the reference is never reached
    monkeypatch.setattr(estimators, "linear_recurrence", None)  # nor the public primitive
    monkeypatch.setattr(_autograd, "_scan", spy)
    d = _inputs(0, (2, 6), -1, "cpu")
    for case, (fn, wrt) in CASES.items():
        xs = [d[k].clone().requires_grad_(True) for k in wrt.split()]
        named = dict(d, **dict(zip(wrt.split(), xs)))
        out = fn(rc, named, -1)
        out = out if isinstance(out, tuple) else (out,)
        assert type(out[0].grad_fn).__name__.startswith("_"), case  # one of _autograd's
        n = len(calls)
        torch.autograd.grad(sum(o.sum() for o in out), xs)
        assert len(calls) == n + 1, case  # exactly one scan per backward
    spec = _table.TABLE["linear_recurrence"]
    x = torch.zeros(3, requires_grad=True)
    assert _autograd.wants_grad(spec, (x, torch.ones(3), None, True, None, None))
    assert not _autograd.wants_grad(spec, (x.detach(), torch.ones(3), None, True, None, None))


@pytest.mark.parametrize("case", list(CASES))
def test_no_grad_needed_means_no_graph(case, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    fn, wrt = CASES[case]
    d = _inputs(0, (2, 5), -1, "cpu")
    outs = [fn(rc, d, -1)]
    with torch.no_grad():  # inputs that require grad, but grad mode off
        outs.append(fn(rc, dict(d, **{k: d[k].clone().requires_grad_(True)
                                      for k in wrt.split()}), -1))
    # the constants require grad: still no graph (they get no gradient)
    const = {k: d[k].clone().requires_grad_(True) for k in ("lr", "gb")}
    outs.append(fn(rc, dict(d, **const), -1))
    for out in outs:
        for o in out if isinstance(out, tuple) else (out,):
            assert o.grad_fn is None and not o.requires_grad, case


@pytest.mark.parametrize("case", ["gae_shifted", "lambda_shifted", "vtrace_shifted",
                                  "linrec_reverse", "linrec_forward", "traces", "cumsum"])
def test_empty_time_axis_backward(case, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    fn, wrt = CASES[case]
    d = _inputs(0, (2, 3), -1, "cpu")
    d = {k: v.narrow(1, 0, 0).contiguous() if v.dim() > 1 and v.shape[1] == 3 else v
         for k, v in d.items()}
    xs = [d[k].requires_grad_(True) for k in wrt.split()]
    out = fn(rc, d, -1)
    out = out if isinstance(out, tuple) else (out,)
    grads = torch.autograd.grad(sum(o.sum() for o in out), xs, allow_unused=True)
    for k, x, g in zip(wrt.split(), xs, grads):
        assert g is None or (g.shape == x.shape and not g.any()), k


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_gradients(dtype, monkeypatch):
    """Gradients come back in the input's dtype, close to the float64 ones."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    d = _inputs(3, (4, 64), -1, "cpu")
    for case in ("vtrace_shifted", "linrec_forward", "gae_shifted", "traces"):
        fn, wrt = CASES[case]
        grads = []
        for dt in (torch.float64, dtype):
            xs = [d[k].to(dt).requires_grad_(True) for k in wrt.split()]
            named = {k: (v.to(dt) if v.is_floating_point() else v) for k, v in d.items()}
            named.update(zip(wrt.split(), xs))
            out = fn(rc, named, -1)
            out = out if isinstance(out, tuple) else (out,)
            grads.append(torch.autograd.grad(sum(o.float().sum() for o in out), xs))
        for k, g64, g in zip(wrt.split(), *grads):
            assert g.dtype == dtype, (case, k)
            tol = 1e-4 if dtype == torch.float32 else 5e-2
            torch.testing.assert_close(g.double(), g64, rtol=tol, atol=tol * g64.abs().max())


def test_double_backward_linear_recurrence(monkeypatch):
    """The backward is built from differentiable ops and the scan itself."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    d = _inputs(1, (2, 6), -1, "cpu")
    xs = [d[k].requires_grad_(True) for k in ("r", "beta", "b")]
    assert torch.autograd.gradgradcheck(
        lambda a, b, i: rc.linear_recurrence(a, b, init=i, reverse=False, time_dim=-1), xs)


@pytest.mark.parametrize("case", ["gae_shifted", "gae_next_values", "lambda_shifted",
                                  "discounted", "vtrace_shifted", "vtrace_shifted_tensor_coefs",
                                  "traces", "traces_features_gamma_tensor", "cumsum_features"])
def test_fused_backward_replays_a_cached_launch(case, seed, captured_launches):
    """The Triton backward records a plan on its first call and replays it with the
    full path's arguments (CPU: the launch captured; the GPU tests run it for real)."""
    cap = captured_launches
    fn, wrt = CASES[case]
    d = _inputs(seed, (3, 20), -1, "cpu")
    weights = None
    for _ in range(3):  # the first call of each launch records its plan, the others replay
        xs = [d[k].clone().requires_grad_(True) for k in wrt.split()]
        out = fn(rc, dict(d, **dict(zip(wrt.split(), xs))), -1)
        out = out if isinstance(out, tuple) else (out,)
        if weights is None:
            weights = [torch.randn_like(o) for o in out]
        torch.autograd.grad(out, xs, weights, allow_unused=True)
    assert len(cap.full) == 2  # forward and backward, once each
    assert len(cap.replayed) == 4  # 2 forwards + 2 backwards
    want, got = cap.full[1], cap.replayed[-1]  # the backward's full launch and last replay
    assert len(want) == len(got)
    for pos, (w, g) in enumerate(zip(want, got)):
        if not isinstance(w, torch.Tensor):
            assert type(g) is type(w) and g == w, (pos, g, w)


def test_every_row_names_its_checks_and_backward():
    """The table carries behaviour: each row names the validation it takes and its
    backward pass, and both exist; a row takes gradients exactly when it names a
    backward (nothing is chosen by which inputs a row has)."""
    from rl_triton_core import _table
    from rl_triton_core.scan import _autograd, _call

    for name, spec in _table.TABLE.items():
        assert spec.checks in _call.CHECKS, name
        assert (spec.backward is None) == (not spec.grads), name
        assert spec.backward is None or spec.backward in _autograd.BACKWARDS, name
        assert set(spec.grads) <= set(spec.inputs), name
    # V-trace's backward is V-trace's because its row says so, and only that row's
    assert [n for n, e in _table.TABLE.items() if e.backward == "vtrace"] == ["vtrace"]
