"""Gradients through torch.compile(fullgraph=True): a compiled training step that calls
the estimators must give the eager step's gradients, to every input that takes one.

Under compile the estimators trace to custom ops (``rl_triton_core::<estimator>``); an
op without an autograd formula would make its outputs constants, so the gradients of
rewards / values / next_values / bootstrap_value (alpha, beta, init; x, init) would
silently vanish from the compiled step while its forward numbers stay right.

* ``test_compiled_step_grads_match_eager``: one step that runs every case (each case on
  its own leaf tensors, so a mismatch names the estimator), loss = random weights times
  every output plus ordinary terms, under aot_eager and inductor, float32, two calls on
  fresh data through the same graph.
* ``test_compiled_grads_match_eager``: one case per test under aot_eager, float64, both
  time layouts (batch-major and time-major).
* ``test_vtrace_log_rhos_stay_constant_under_compile``: log_rhos that require grad get no
  gradient (a constant), compiled as in eager.
* ``test_compiled_graph_holds_the_estimator_op``: the traced graph has no break and holds
  a custom op of the ``rl_triton_core`` namespace named after the estimator.
* retrace / retrace_from_actions have no backward today (their eager outputs do not
  require grad): a compiled step that uses them on inputs that require grad compiles and
  gives the eager numbers and the eager gradients (None and zeros count as the same).
* GPU (``-m gpu``): the combined step under inductor on CUDA tensors (Triton kernels),
  and a training step with a value head whose forward + backward is captured in a CUDA
  graph (cudagraph trees via mode="reduce-overhead", and a manual torch.cuda.graph
  capture around the compiled step), replayed on fresh data.
"""

import pytest
import torch

import rl_triton_core as rc

B, T = 3, 23
RTOL = {torch.float32: 1e-5, torch.float64: 1e-9}


def _ftd(td):
    """time_dim of a tensor with one trailing feature axis."""
    return td if td >= 0 else td - 1


def _data(gen, dtype=torch.float32, time_major=False, device="cpu", b=B, t=T):
    """Random (never zero) inputs. Batch-major [B, T] (time_dim=-1) or time-major
    [T, B] (time_dim=0); feature tensors carry one trailing axis of 2."""
    make = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    d = dict(r=make(b, t), v=make(b, t), n=make(b, t), b=make(b),
             lr=0.5 * make(b, t),  # importance ratios on both sides of the clip thresholds
             beta=2 * torch.rand(b, t, generator=gen, dtype=dtype) - 1,
             bb=2 * torch.rand(1, t, generator=gen, dtype=dtype) - 1,  # broadcast over batch
             gb=0.5 + 0.5 * torch.rand(1, t, generator=gen, dtype=dtype),  # per-step gamma
             xf=make(b, t, 2), bf=make(b, 2))
    te = torch.rand(b, t, generator=gen) < 0.15
    tr = torch.rand(b, t, generator=gen) < 0.15
    te[0, -1] = False  # stream 0 bootstraps at the window end: bootstrap_value has a gradient
    if b > 1:
        te[1, -1] = True  # stream 1 does not: the terminated factor of that gradient
    d.update(te=te, tr=tr)
    if time_major:
        for k in ("r", "v", "n", "lr", "beta", "bb", "gb", "xf", "te", "tr"):
            d[k] = d[k].movedim(1, 0).contiguous()
    return {k: x.to(device) for k, x in d.items()}


# name -> (fn(inputs, time_dim) -> output or tuple of outputs, the inputs differentiated,
#          the estimator's name: its custom op is rl_triton_core::<name>)
CASES = {
    "gae_shifted": (lambda d, td: rc.gae(
        d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.97, lmbda=0.9,
        time_dim=td), "r v b", "gae"),
    "gae_next_values": (lambda d, td: rc.gae(
        d["r"], d["v"], d["te"], d["tr"], next_values=d["n"], gamma=0.95, lmbda=0.8,
        time_dim=td), "r v n", "gae"),
    "lambda_shifted_gamma_tensor": (lambda d, td: rc.lambda_returns(
        d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=d["gb"], lmbda=0.8,
        time_dim=td), "r v b", "lambda_returns"),
    # the formula never reads V_t: with next_values, values=None (its gradient is zero)
    "lambda_next_values": (lambda d, td: rc.lambda_returns(
        d["r"], None, d["te"], d["tr"], next_values=d["n"], gamma=0.9, lmbda=0.7,
        time_dim=td), "r n", "lambda_returns"),
    "discounted_shifted": (lambda d, td: rc.discounted_returns(
        d["r"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.95, time_dim=td), "r b",
        "discounted_returns"),
    "discounted_next_values": (lambda d, td: rc.discounted_returns(
        d["r"], d["te"], d["tr"], next_values=d["n"], gamma=0.9, time_dim=td), "r n",
        "discounted_returns"),
    "vtrace_shifted": (lambda d, td: rc.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], bootstrap_value=d["b"], gamma=0.95,
        lmbda=0.9, rho_bar=1.0, c_bar=0.9, pg_rho_bar=1.2, time_dim=td), "r v b", "vtrace"),
    "vtrace_next_values": (lambda d, td: rc.vtrace(
        d["lr"], d["r"], d["v"], d["te"], d["tr"], next_values=d["n"], gamma=0.9,
        rho_bar=1.1, time_dim=td), "r v n", "vtrace"),
    "eligibility_traces": (lambda d, td: rc.eligibility_traces(
        d["xf"], d["te"] | d["tr"], gamma=0.9, lmbda=0.8, init=d["bf"], time_dim=_ftd(td)),
        "xf bf", "eligibility_traces"),
    "episodic_cumsum": (lambda d, td: rc.episodic_cumsum(
        d["r"], d["tr"], init=d["b"], time_dim=td), "r b", "episodic_cumsum"),
    "linrec_reverse": (lambda d, td: rc.linear_recurrence(
        d["r"], d["beta"], reverse=True, init=d["b"], time_dim=td), "r beta b",
        "linear_recurrence"),
    "linrec_forward_broadcast_beta_no_init": (lambda d, td: rc.linear_recurrence(
        d["r"], d["bb"], reverse=False, time_dim=td), "r bb", "linear_recurrence"),
}


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _leaves(data, names):
    """Each case on its own leaf tensors (copies of the same data): its gradients are its
    own, so a mismatch names the estimator. -> (flat list, [(case, input name)])."""
    flat, index = [], []
    for case in names:
        for k in CASES[case][1].split():
            flat.append(data[k].detach().clone().requires_grad_(True))
            index.append((case, k))
    return flat, index


def _make_step(names, td):
    """step(leaves, consts, weights) -> (loss, outputs of every case, flattened)."""

    def step(leaves, consts, weights):
        outs, loss, i = [], 0.0, 0
        for case in names:
            fn, wrt, _ = CASES[case]
            d = dict(consts)
            for k in wrt.split():
                d[k] = leaves[i]
                i += 1
            case_outs = _as_tuple(fn(d, td))
            for o in case_outs:
                loss = loss + (weights[len(outs)] * o).sum()
                outs.append(o)
            first = d[wrt.split()[0]]
            loss = loss + (first**2).mean()  # an ordinary op on the same input
        return loss, outs

    return step


def _weights(gen, data, names, td, dtype):
    """Random weights of every output's shape (from an eager no-grad run)."""
    with torch.no_grad():
        shapes = [o.shape for case in names for o in _as_tuple(CASES[case][0](data, td))]
    return [torch.randn(s, generator=gen, dtype=dtype).to(data["r"].device) for s in shapes]


def _compare(compiled, eager, names, data, gen, td, dtype):
    """Run both steps on fresh leaves; return the problems (empty when they agree)."""
    consts = dict(data)
    weights = _weights(gen, data, names, td, dtype)
    problems = []
    results = []
    for fn in (compiled, eager):
        leaves, index = _leaves(data, names)
        loss, outs = fn(leaves, consts, weights)
        grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        results.append((loss, outs, grads))
    (c_loss, c_outs, c_grads), (e_loss, e_outs, e_grads) = results
    out_case = [case for case in names for _ in _as_tuple(CASES[case][0](data, td))]
    tol = RTOL[dtype]
    try:
        torch.testing.assert_close(c_loss, e_loss, rtol=tol, atol=tol)
    except AssertionError as err:
        problems.append(f"the loss differs from eager: {str(err).splitlines()[0]}")
    for j, (case, co, eo) in enumerate(zip(out_case, c_outs, e_outs)):
        try:
            torch.testing.assert_close(co, eo, rtol=tol, atol=tol)
        except AssertionError as err:
            problems.append(f"{case}: output {j} differs from eager: "
                            f"{str(err).splitlines()[0]}")
        assert eo.requires_grad, f"{case}: the eager output does not require grad (test bug)"
        if not co.requires_grad:
            problems.append(f"{case}: compiled output {j} does not require grad")
    for (case, k), cg, eg in zip(index, c_grads, e_grads):
        assert eg is not None and eg.abs().max() > 0, f"{case} d/d{k}: eager gradient is 0"
        if cg is None:
            problems.append(f"{case} d/d{k}: no gradient reached the input in the compiled "
                            f"step (eager max |grad| {eg.abs().max().item():.3g})")
            continue
        if not cg.abs().max() > 0:
            problems.append(f"{case} d/d{k}: the compiled gradient is all zeros")
        try:
            torch.testing.assert_close(cg, eg, rtol=tol, atol=tol)
        except AssertionError as err:
            diff = (cg - eg).abs().max().item()
            problems.append(f"{case} d/d{k}: compiled gradient differs from eager "
                            f"(max abs diff {diff:.3g}): {str(err).splitlines()[0]}")
    return problems


@pytest.fixture
def cpu_backend(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_step_grads_match_eager(backend, cpu_backend, gen):
    """Every differentiable case in one compiled step (one compile per backend)."""
    names = list(CASES)
    td = -1
    data = _data(gen)
    step = _make_step(names, td)
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for call in range(2):  # the second call, on fresh data, reuses the graph
        if call:
            data = _data(gen)
        problems = _compare(compiled, step, names, data, gen, td, torch.float32)
        assert not problems, f"call {call}, backend {backend}:\n" + "\n".join(problems)


@pytest.mark.parametrize("time_major", [False, True], ids=["batch_major", "time_major"])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_grads_match_eager(case, time_major, cpu_backend, gen):
    """One case per compile under aot_eager in float64 (reference-level tolerance)."""
    td = 0 if time_major else -1
    data = _data(gen, torch.float64, time_major)
    step = _make_step([case], td)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    problems = _compare(compiled, step, [case], data, gen, td, torch.float64)
    assert not problems, "\n".join(problems)


def test_vtrace_log_rhos_stay_constant_under_compile(cpu_backend, gen):
    """log_rhos that require grad get no gradient, compiled as in eager (None or zeros),
    while rewards still get theirs."""
    data = _data(gen)
    lr = data["lr"].clone().requires_grad_(True)
    r = data["r"].clone().requires_grad_(True)

    def f(lr, r):
        vs, pg = rc.vtrace(lr, r, data["v"], data["te"], data["tr"],
                           bootstrap_value=data["b"], gamma=0.9, time_dim=-1)
        return (vs * 1.5).sum() + (pg * 0.5).sum() + (r**2).mean()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(lr, r), (lr, r), allow_unused=True)
    want = torch.autograd.grad(f(lr, r), (lr, r), allow_unused=True)
    assert want[0] is None or not want[0].abs().max() > 0
    assert got[0] is None or not got[0].abs().max() > 0, "log_rhos got a gradient"
    assert got[1] is not None, "no gradient reached rewards through the compiled vtrace"
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the traced graph


def _recording_backend(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the captured graph as is

    return backend


def _library_ops(graphs):
    """Names (``namespace::name``) of the rl_triton_core ops called in the graphs."""
    names = set()
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            ns = getattr(target, "namespace", None)
            if ns is None:  # an OpOverloadPacket or anything else: go by its name
                text = str(target)
                if "rl_triton_core" in text:
                    names.add(text)
                continue
            if ns == "rl_triton_core":
                name = target.name() if callable(getattr(target, "name", None)) else str(target)
                names.add(name)
    return names


def _retrace_case(d, td):
    return rc.retrace(d["lr"], d["r"], d["v"], d["n"], d["te"], d["tr"], gamma=0.9,
                      lmbda=0.95, c_bar=1.0, time_dim=td)


GRAPH_CASES = {}  # one per estimator: name -> fn(inputs, time_dim), its first case
for _fn, _, _estimator in CASES.values():
    GRAPH_CASES.setdefault(_estimator, _fn)
GRAPH_CASES["retrace"] = _retrace_case


@pytest.mark.parametrize("estimator", list(GRAPH_CASES))
def test_compiled_graph_holds_the_estimator_op(estimator, cpu_backend, gen):
    """fullgraph=True raises on a graph break; the one graph calls a custom op of the
    rl_triton_core namespace whose name contains the estimator's."""
    data = _data(gen)
    leaves = {k: data[k].clone().requires_grad_(True) for k in ("r", "v", "n", "b", "xf",
                                                                 "bf", "beta")}
    fn = GRAPH_CASES[estimator]
    graphs = []

    def step(leaves):
        d = dict(data)
        d.update(leaves)
        return _as_tuple(fn(d, -1))

    got = torch.compile(step, fullgraph=True, backend=_recording_backend(graphs))(leaves)
    want = step(leaves)
    assert len(graphs) == 1, f"{len(graphs)} graphs"
    ops = _library_ops(graphs)
    assert ops, "no rl_triton_core op in the traced graph"
    assert any(estimator in op.split("::")[-1] for op in ops), \
        f"no rl_triton_core op named after {estimator!r} in the graph: {sorted(ops)}"
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


# ------------------------------------------------ retrace: forward (and grads, if any)


def _retrace_from_actions(d, q, p, a, logmu):
    return rc.retrace_from_actions(q, p, a, logmu, d["r"], d["te"], d["tr"], gamma=0.9,
                                   lmbda=0.95, c_bar=1.0, time_dim=-1)


def _assert_same_grad(got, want, what):
    """Gradients equal, None counting as zeros (an input the loss does not reach)."""
    if want is None or got is None:
        other = got if want is None else want
        assert other is None or not other.abs().max() > 0, \
            f"{what}: compiled {'None' if got is None else 'a gradient'}, " \
            f"eager {'None' if want is None else 'a gradient'}"
        return
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=what)


def test_compiled_retrace_matches_eager(cpu_backend, gen):
    """retrace and retrace_from_actions have no backward today (their eager outputs do
    not require grad). A compiled training step that uses them, with inputs that require
    grad, must compile, give the eager numbers and the eager gradients: those of the
    ordinary terms only, as long as retrace has no backward (None and zeros count as
    the same), and retrace's own once it has one in eager."""
    data = _data(gen)
    A = 4
    q = torch.randn(B, T, A, generator=gen)
    p = torch.softmax(torch.randn(B, T, A, generator=gen), -1)
    a = torch.randint(0, A, (B, T), generator=gen)
    logmu = torch.log(0.1 + 0.8 * torch.rand(B, T, generator=gen))
    w1, w2 = torch.randn(B, T, generator=gen), torch.randn(B, T, generator=gen)
    leaves = dict(r=data["r"], v=data["v"], n=data["n"], q=q, p=p)
    leaves = {k: x.clone().requires_grad_(True) for k, x in leaves.items()}

    def step(leaves):
        d = dict(data)
        d.update(leaves)
        q_ret = _retrace_case(d, -1)
        q_act = _retrace_from_actions(d, d["q"], d["p"], a, logmu)
        loss = (w1 * q_ret).sum() + (w2 * q_act).sum() + (d["r"] ** 2).mean() \
            + (d["q"] ** 2).mean()
        return loss, q_ret, q_act

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = compiled(leaves), step(leaves)
    for name, g, w in zip(("loss", "retrace", "retrace_from_actions"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)
    xs = list(leaves.values())
    got_grads = torch.autograd.grad(got[0], xs, allow_unused=True)
    want_grads = torch.autograd.grad(want[0], xs, allow_unused=True)
    for k, gg, wg in zip(leaves, got_grads, want_grads):
        _assert_same_grad(gg, wg, f"d/d{k}")


# ----------------------------------------------------------------------------- GPU


def _cuda_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.gpu
def test_compiled_step_grads_match_eager_on_cuda(gen, monkeypatch):
    """The combined step under inductor on CUDA tensors (the Triton kernels)."""
    _cuda_or_skip()
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    torch._dynamo.reset()
    names = list(CASES)
    data = _data(gen, device="cuda")
    step = _make_step(names, -1)
    compiled = torch.compile(step, fullgraph=True)
    for call in range(2):
        if call:
            data = _data(gen, device="cuda")
        problems = _compare(compiled, step, names, data, gen, -1, torch.float32)
        assert not problems, f"call {call}:\n" + "\n".join(problems)


OBS = 5


def _rollout(gen, device, b=4, t=32):
    d = _data(gen, b=b, t=t)
    d["obs"] = torch.randn(b, t, OBS, generator=gen)
    d["last_obs"] = torch.randn(b, OBS, generator=gen)
    d["w_adv"] = torch.randn(b, t, generator=gen)
    d["w_pg"] = torch.randn(b, t, generator=gen)
    keys = ("obs", "last_obs", "r", "te", "tr", "lr", "w_adv", "w_pg")
    return [d[k].to(device) for k in keys]


def _value_head(device):
    torch.manual_seed(0)
    return torch.nn.Linear(OBS, 1).to(device)


def _loss_fn(head):
    """A training step's loss: values from a value head, through gae and vtrace, so the
    head's gradients flow through both estimators' backward (values, bootstrap)."""

    def loss_fn(obs, last_obs, r, te, tr, lr, w_adv, w_pg):
        v = head(obs).squeeze(-1)
        boot = head(last_obs).squeeze(-1)
        adv, target = rc.gae(r, v, te, tr, bootstrap_value=boot, gamma=0.97, lmbda=0.9,
                             time_dim=-1)
        vs, pg = rc.vtrace(lr, r, v, te, tr, bootstrap_value=boot, gamma=0.97, rho_bar=1.2,
                           time_dim=-1)
        return ((w_adv * adv).sum() + 0.5 * target.square().mean() + (w_pg * pg).sum()
                + (vs - v).square().mean())

    return loss_fn


def _eager_grads(head, batch):
    loss = _loss_fn(head)(*batch)
    return torch.autograd.grad(loss, list(head.parameters()))


@pytest.mark.gpu
def test_reduce_overhead_training_step_grads_match_eager(gen, monkeypatch):
    """mode="reduce-overhead": cudagraph trees capture the forward and the backward;
    replays on fresh data give the eager gradients of the value head."""
    _cuda_or_skip()
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    torch._dynamo.reset()
    head = _value_head("cuda")
    compiled = torch.compile(_loss_fn(head), fullgraph=True, mode="reduce-overhead")
    params = list(head.parameters())
    for _ in range(4):  # warm-up and recording runs, then replays
        batch = _rollout(gen, "cuda")
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(*batch)
        assert loss.requires_grad
        got = [g.clone() for g in torch.autograd.grad(loss, params)]
        want = _eager_grads(head, batch)
        for g, w in zip(got, want):
            assert w.abs().max() > 0
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_cuda_graph_capture_of_compiled_forward_backward(gen, monkeypatch):
    """A manual torch.cuda.graph capture around the compiled step's forward + backward
    (warmed up on a side stream first); replays on fresh data copied into the static
    inputs give the eager gradients."""
    _cuda_or_skip()
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    torch._dynamo.reset()
    head = _value_head("cuda")
    params = list(head.parameters())
    compiled = torch.compile(_loss_fn(head), fullgraph=True)

    def train_step(batch):
        loss = compiled(*batch)
        return torch.autograd.grad(loss, params)

    static = _rollout(gen, "cuda")
    train_step(static)  # compiles the forward and the backward
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            train_step(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_grads = train_step(static)
    for _ in range(2):
        fresh = _rollout(gen, "cuda")
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        want = _eager_grads(head, fresh)
        for g, w in zip(static_grads, want):
            assert w.abs().max() > 0
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
