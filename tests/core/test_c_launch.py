"""The recorded CUDA launch repeated in C (``rl_triton_core.scan._claunch``, ``_claunch.h``): on
fresh data, with new coefficients, it gives the Python path's bits, for every estimator,
both layouts, float32, float64 and bf16, a segmented plan; under CUDA graph capture; on
a side stream; and it steps aside for a launch hook and where it is switched off. The
record's parameter list is checked here on the CPU against a stand-in compiled kernel."""

import inspect
import os
import struct

import pytest
import torch
from core_testlib import full_path, spy_c_replay
from test_paths import CASES, _inputs

from rl_triton_core.scan import _claunch, _cpu_c, _dispatch, _torchalloc


@pytest.fixture(autouse=True)
def _c_launch_on(monkeypatch):
    """The C launch switched on (the default) for every test here."""
    monkeypatch.setenv("RL_TRITON_CORE_C_LAUNCH", "1")


def _gpu_records():
    return [v for v in _dispatch._PLANS.values()
            if type(v) is tuple and len(v) == 5 and type(v[0]) is bytes and
            type(v[4]) is torch.device]


def _needs_c_launch(alloc="torch"):
    """The C launch available here, its outputs allocated through torch's C++ API
    (``alloc="torch"``, the extension built on the first CUDA record; it must build
    wherever the C launch runs) or through torch's Python functions (``"python"``)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if not _claunch.available():
        pytest.skip("the C launch is not available here (extension, DLPack table or driver)")
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    _torchalloc.use(alloc == "torch")


@pytest.fixture(autouse=True)
def _alloc_restored():
    yield
    _torchalloc.use(True)


def _launch_path(path, monkeypatch):
    """The C replay (``"c"``, the default where it is available; ``"c-python-alloc"``:
    its outputs from torch's Python functions) or Triton's launcher (``"triton"``:
    ``RL_TRITON_CORE_C_LAUNCH=0``)."""
    if path.startswith("c"):
        _needs_c_launch("python" if path == "c-python-alloc" else "torch")
    elif not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    else:
        monkeypatch.setenv("RL_TRITON_CORE_C_LAUNCH", "0")


def _case(name, gen, shape, layout, dtype, gamma):
    """The estimator, its arguments (fresh random data) and keywords."""
    r, v, lr, nv, te, tr, b = _inputs(gen, shape, "cpu")
    fn, _, args, kw = CASES[name](r, v, lr, nv, te, tr, b)

    def conv(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.is_floating_point():
            t = t.to(dtype)
        if layout == "time" and t.dim() == 2:
            t = t.t().contiguous()
        return t.cuda()

    args = tuple(conv(a) for a in args)
    kw = {k: conv(w) for k, w in kw.items()}
    if layout == "time":
        kw["time_dim"] = 0
    if "gamma" in inspect.signature(fn).parameters:
        kw["gamma"] = gamma
    return fn, args, kw


def _poison_cache(nbytes):
    """Leave NaN in the caching allocator's free blocks, where the next outputs land."""
    torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")


def _same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        assert not torch.isnan(w).all()
        assert torch.equal(g.view(torch.uint8) if g.dtype != torch.bool else g,
                           w.view(torch.uint8) if w.dtype != torch.bool else w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["batch", "time"])
@pytest.mark.parametrize("shape", [(5, 77), (3, 70_000)])
@pytest.mark.parametrize("name", list(CASES))
def test_c_replay_gives_the_python_paths_bits(name, shape, layout, dtype, gen, monkeypatch,
                                              alloc="torch"):
    _needs_c_launch(alloc)
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    _dispatch._PLANS.clear()
    fn, args, kw = _case(name, gen, shape, layout, dtype, 0.97)
    fn(*args, **kw)  # recorded
    assert _gpu_records(), "the call was not recorded for the C replay"
    fn, args, kw = _case(name, gen, shape, layout, dtype, 0.93)  # fresh data, new gamma
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    _poison_cache(4 * shape[0] * shape[1] * 8)
    got = fn(*args, **kw)
    assert replayed, "the repeated call did not take the C replay"
    want = full_path(monkeypatch, lambda: fn(*args, **kw))
    _same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 77), (3, 70_000)])
@pytest.mark.parametrize("name", list(CASES))
def test_c_replay_with_python_allocation(name, shape, dtype, gen, monkeypatch):
    """The outputs allocated by torch's Python functions (where the C++ allocator is not
    built): the same bits."""
    test_c_replay_gives_the_python_paths_bits(name, shape, "batch", dtype, gen, monkeypatch,
                                              alloc="python")


TOKEN_CASES = ["gae", "gae_whiten_fill", "gae_mul", "returns", "whiten", "packed",
               "bf16_whiten"]


def _token_call(case, gen, gamma, lmbda):
    """A token estimator's call on fresh random CUDA data (test_token_replay's cases)."""
    import rl_triton_core as rc

    dtype = torch.bfloat16 if case == "bf16_whiten" else torch.float32
    shape = (300,) if case == "packed" else (6, 300)
    r = torch.randn(shape, generator=gen).to(dtype).cuda()
    v = torch.randn(shape, generator=gen).to(dtype).cuda()
    m = (torch.rand(shape, generator=gen) < 0.8).cuda()
    cu = torch.tensor([0, 50, 50, 170, 300], device="cuda") if case == "packed" else None
    if case == "returns":
        return lambda: rc.masked_returns(r, m, gamma=gamma, time_dim=-1)
    if case == "whiten":
        return lambda: rc.masked_whiten(r, m, fill=0.0, count_eps=1e-8)
    return lambda: rc.masked_gae(r, v, m, gamma=gamma, lmbda=lmbda, time_dim=-1,
                                 skip=case != "gae_mul", cu_seqlens=cu,
                                 whiten=case in ("gae_whiten_fill", "bf16_whiten"),
                                 fill=0.0 if case == "gae_whiten_fill" else None)


@pytest.mark.gpu
@pytest.mark.parametrize("small_tokens", [4096, 0])  # whitening: one launch, or two
@pytest.mark.parametrize("alloc", ["torch", "python"])
@pytest.mark.parametrize("case", TOKEN_CASES)
def test_c_replay_of_the_token_estimators(case, alloc, small_tokens, gen, monkeypatch):
    """A repeated token call (masked GAE, returns, whitening; padded and packed) is
    launched from C, with the full path's bits on fresh data and new coefficients."""
    import rl_triton_core as rc

    monkeypatch.setattr(rc._config, "_current",
                        rc.current_tuning().replace(small_tokens=small_tokens))
    _needs_c_launch(alloc)
    _dispatch._PLANS.clear()
    _token_call(case, gen, 0.9, 0.8)()  # recorded
    assert _gpu_records(), "the token call was not recorded for the C replay"
    call = _token_call(case, gen, 0.97, 0.5)  # fresh data, new numbers
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    _poison_cache(4 * 6 * 300 * 8)
    got = call()
    assert replayed, "the repeated token call did not take the C replay"
    want = full_path(monkeypatch, call)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert [g is None for g in got] == [w is None for w in want]
    _same(tuple(g for g in got if g is not None), tuple(w for w in want if w is not None))


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["gae", "gae_three_launches", "gae_whiten", "whiten",
                                  "gae_whiten_one_launch", "whiten_one_launch"])
def test_c_replay_outputs_and_scratch_are_torchs(case, gen, monkeypatch):
    """The C++ allocation's outputs (the caching allocator's block in a CUDA tensor made
    without the dispatcher) are torch.empty_strided's in device, dtype, shape, strides,
    storage size and resizability, with the full path's bits; the scratch blocks a call
    takes without a tensor (a three-launch plan's workspace, the whitening's statistics)
    go back to the allocator: after many calls the memory in use is where it was."""
    import rl_triton_core as rc

    _needs_c_launch("torch")
    _dispatch._PLANS.clear()
    # (6, 700): the whitening's two launches and their workspace; (6, 300): one launch
    wide = (6, 300) if case.endswith("one_launch") else (6, 700)
    if case.startswith("gae"):
        shape = (3, 70_000) if case == "gae_three_launches" else wide
        r, v = (torch.randn(shape, generator=gen).cuda() for _ in range(2))
        m = (torch.rand(shape, generator=gen) < 0.8).cuda()
        if case.startswith("gae_whiten"):
            def call():
                return rc.masked_gae(r, v, m, gamma=0.99, lmbda=0.9, whiten=True, time_dim=-1)
        else:
            def call():
                with rc.tuning(look_back=False):  # (70,000 steps: a segmented plan)
                    return rc.gae(r, v, ~m, bootstrap_value=v[:, 0], time_dim=-1)
    else:
        x = torch.randn(wide, generator=gen).cuda()
        m = (torch.rand(wide, generator=gen) < 0.8).cuda()

        def call():
            return rc.masked_whiten(x, m)
    call()  # recorded
    assert _gpu_records()
    want = full_path(monkeypatch, call)
    want = want if isinstance(want, tuple) else (want,)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    got = call()
    assert replayed, "the repeated call did not take the C replay"
    got = got if isinstance(got, tuple) else (got,)
    _same(got, want)
    for g, w in zip(got, want):
        assert g.device == w.device and g.storage_offset() == w.storage_offset() == 0
        assert torch._C._dispatch_keys(g) == torch._C._dispatch_keys(w)
        assert g.untyped_storage().nbytes() == w.untyped_storage().nbytes()
        assert g.untyped_storage().resizable() == w.untyped_storage().resizable()
        assert g.is_contiguous() and not g.requires_grad and g.grad_fn is None
    g = got[0]
    (g + 1).sum().item()  # usable as any tensor
    del got, g
    replayed.clear()  # (the spy's list holds what it saw: emptied after each call)
    taken = 0
    for _ in range(50):
        call()
        taken += len(replayed)
        replayed.clear()
    assert taken == 50
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == base


@pytest.mark.gpu
@pytest.mark.parametrize("alloc", ["torch", "python"])
def test_c_replay_steps_aside_for_grad_and_negative_views(alloc, gen, monkeypatch):
    """A tensor that requires grad (the autograd path) or is a negative view (its memory
    is not its values) is never replayed, whichever way the tensors are checked."""
    _needs_c_launch(alloc)
    _dispatch._PLANS.clear()
    fn, args, kw = _case("gae", gen, (8, 64), "batch", torch.float32, 0.95)
    fn(*args, **kw)  # recorded
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    x = args[0].clone().requires_grad_()
    adv, _ = fn(x, *args[1:], **kw)
    assert adv.grad_fn is not None and not replayed
    neg = torch._neg_view(args[0])
    got = fn(neg, *args[1:], **kw)
    assert not replayed
    _same(got, full_path(monkeypatch, lambda: fn(neg.resolve_neg(), *args[1:], **kw)))
    fn(*args, **kw)
    assert replayed  # the plain call still is


@pytest.mark.gpu
@pytest.mark.parametrize("alloc", ["torch", "python"])
def test_the_allocation_that_runs(alloc, gen, monkeypatch):
    """With the C++ allocator, a replayed call calls no torch function from Python (a
    torch function mode sees none); without it, it calls torch.empty_strided per output."""
    _needs_c_launch(alloc)
    _dispatch._PLANS.clear()
    fn, args, kw = _case("gae", gen, (8, 64), "batch", torch.float32, 0.95)
    fn(*args, **kw)  # recorded
    seen, replayed = [], []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    spy_c_replay(monkeypatch, replayed)
    with Spy():
        fn(*args, **kw)
    assert replayed, "the repeated call did not take the C replay"
    assert seen.count("empty_strided") == (0 if alloc == "torch" else 2), seen


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["c", "c-python-alloc", "triton"])
@pytest.mark.parametrize("name", ["gae", "vtrace", "episodic_cumsum"])
def test_c_replay_under_graph_capture(name, path, gen, monkeypatch):
    """A repeated call captured in a CUDA graph, on both launch paths: its outputs come
    from the graph's pool and its kernel runs at each replay of the graph, on the data
    copied in."""
    _launch_path(path, monkeypatch)
    _dispatch._PLANS.clear()
    fn, args, kw = _case(name, gen, (64, 200), "batch", torch.float32, 0.95)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*args, **kw)  # recorded
        fn(*args, **kw)
    torch.cuda.current_stream().wait_stream(side)
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args, **kw)
    assert bool(replayed) == path.startswith("c"), "the captured call took the other launch path"
    _, fresh, _ = _case(name, gen, (64, 200), "batch", torch.float32, 0.95)
    for a, f in zip(args, fresh):
        if isinstance(a, torch.Tensor):
            a.copy_(f)
    graph.replay()
    torch.cuda.synchronize()
    want = full_path(monkeypatch, lambda: fn(*args, **kw))
    _same(tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["c", "c-python-alloc", "triton"])
def test_c_replay_runs_on_the_current_stream(path, gen, monkeypatch):
    """On a side stream, after a long kernel that precedes the write of the inputs on that
    stream, on both launch paths: a launch on any other stream would read the inputs
    before the write."""
    _launch_path(path, monkeypatch)
    _dispatch._PLANS.clear()
    fn, args, kw = _case("gae", gen, (256, 512), "batch", torch.float32, 0.95)
    fn(*args, **kw)  # recorded
    _, fresh, _ = _case("gae", gen, (256, 512), "batch", torch.float32, 0.95)
    want = full_path(monkeypatch, lambda: fn(*fresh, **kw))
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        for a, f in zip(args, fresh):
            if isinstance(a, torch.Tensor):
                a.copy_(f)
        got = fn(*args, **kw)
    torch.cuda.synchronize()
    assert bool(replayed) == path.startswith("c")
    _same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["assigned", "added"])
def test_c_replay_steps_aside_for_a_launch_hook(how, gen, monkeypatch):
    """Triton's launch hooks (a profiler's) are called by its launcher: with one set
    (assigned, or added to Triton's chain of them), a repeated call takes the Python
    path, which calls it; with the chain empty again, the C replay."""
    _needs_c_launch()
    from triton import knobs

    _dispatch._PLANS.clear()
    fn, args, kw = _case("gae", gen, (8, 64), "batch", torch.float32, 0.95)
    fn(*args, **kw)
    calls, replayed = [], []
    spy_c_replay(monkeypatch, replayed)
    hook = lambda *a: calls.append(1)  # noqa: E731
    chain = knobs.runtime.launch_enter_hook
    if how == "assigned":
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    elif not hasattr(chain, "add"):
        pytest.skip("this Triton has no chain of launch hooks")
    else:
        chain.add(hook)
    try:
        fn(*args, **kw)
    finally:
        if how == "added":
            chain.remove(hook)
    assert calls and not replayed
    if how == "added":
        fn(*args, **kw)
        assert replayed and len(calls) == 1


@pytest.mark.gpu
def test_c_launch_switched_off(gen, monkeypatch):
    """RL_TRITON_CORE_C_LAUNCH=0 (as where it is not set): nothing is recorded for the C
    replay, and the repeated call takes Triton's launcher (the Python plan)."""
    _needs_c_launch()
    monkeypatch.setenv("RL_TRITON_CORE_C_LAUNCH", "0")
    _dispatch._PLANS.clear()
    fn, args, kw = _case("gae", gen, (8, 64), "batch", torch.float32, 0.95)
    want = fn(*args, **kw)
    assert not _gpu_records() and _dispatch._PLANS
    _same(fn(*args, **kw), want)


# --------------------------------------------------------- the record, on the CPU


class _Meta:
    num_warps, shared, num_ctas = 4, 96, 1
    global_scratch_size = profile_scratch_size = 0


class _Kernel:
    """A stand-in compiled kernel: a pointer, a scalar, a tuple of ints (one a
    compile-time constant), a constexpr and a float pair."""

    class src:
        class fn:
            arg_names = ["out", "x", "g", "st", "lo", "B"]

        signature = {"out": "*fp32", "x": "*fp32", "g": "fp32", "st": ("i32", "constexpr", "i64"),
                     "lo": ("fp32", "fp32"), "B": "constexpr"}

    metadata = _Meta()
    function = 0x1234


def test_record_lists_tritons_parameters_in_order(monkeypatch):
    class Fake:
        @staticmethod
        def param_sizes(fn):
            assert fn == 0x1234
            return [8, 8, 4, 4, 8, 4, 4, 8, 8]  # + the two scratch pointers

    monkeypatch.setattr(_cpu_c, "_cscan", Fake)
    out, x = object(), object()
    full = (out, x, 0.5, (7, 1, 2**40), (0.25, -1.5), 64)
    sources = {(0,): (_claunch.P_ALLOC, 0), (1,): (_claunch.P_ARG, 3), (2,): (_claunch.P_HI, 5),
               (4, 0): (_claunch.P_LO, 5)}
    fn, grid, threads, shared, params = _claunch._launch_of(_Kernel, (3, 2), full, sources.get)
    assert (fn, grid, threads, shared) == (0x1234, (3, 2, 1), 128, 96)
    bits = lambda fmt, v: int.from_bytes(struct.pack(fmt, v).ljust(8, b"\0"), "little")
    assert params == (
        (_claunch.P_ALLOC, 0, 8, 0), (_claunch.P_ARG, 3, 8, 0), (_claunch.P_HI, 5, 4, 0),
        (_claunch.P_CONST, 0, 4, bits("<i", 7)), (_claunch.P_CONST, 0, 8, bits("<q", 2**40)),
        (_claunch.P_LO, 5, 4, 0), (_claunch.P_CONST, 0, 4, bits("<f", -1.5)),
        (_claunch.P_CONST, 0, 8, 0), (_claunch.P_CONST, 0, 8, 0))


@pytest.mark.parametrize("sizes", [None, [8, 8, 4, 4, 8, 4], [8, 8, 4, 8, 8, 4, 4],
                                   [8, 8, 4, 4, 8, 4, 4, 8, 8, 8]])
def test_record_refuses_what_the_driver_does_not_confirm(sizes, monkeypatch):
    """Too few or too many parameters, or a size that is not the signature's: no record
    (the Python path keeps the call)."""
    class Fake:
        @staticmethod
        def param_sizes(fn):
            return sizes

    monkeypatch.setattr(_cpu_c, "_cscan", Fake)
    full = (object(), object(), 0.5, (7, 1, 2**40), (0.25, -1.5), 64)
    src = {(0,): (_claunch.P_ALLOC, 0), (1,): (_claunch.P_ARG, 3)}.get
    with pytest.raises(_claunch._NotRecordable):
        _claunch._launch_of(_Kernel, (3, 2), full, src)


def test_record_refuses_a_pointer_not_of_the_call(monkeypatch):
    class Fake:
        @staticmethod
        def param_sizes(fn):
            return [8, 8, 4, 4, 8, 4, 4]

    monkeypatch.setattr(_cpu_c, "_cscan", Fake)
    full = (object(), object(), 0.5, (7, 1, 2**40), (0.25, -1.5), 64)
    with pytest.raises(_claunch._NotRecordable):  # x: a copy the call made
        _claunch._launch_of(_Kernel, (3, 2), full, {(0,): (_claunch.P_ALLOC, 0)}.get)


def test_grecord_checks_its_indices():
    cs = _cpu_c._cscan
    if cs is None:
        pytest.skip("the C extension is not built")
    ok = ((_claunch.P_ALLOC, 0),)
    none3 = (None, None, None)

    def rec(params, checks=none3, returns=ok):
        return cs.grecord(3, 1, checks, ((0x1234, (1, 1, 1), 32, 0, params),), returns,
                          (0, 0, 0))

    assert isinstance(rec(((_claunch.P_ARG, 2, 8, 0),)), bytes)
    with pytest.raises(ValueError):  # argument 3 of 3
        rec(((_claunch.P_ARG, 3, 8, 0),))
    with pytest.raises(ValueError):  # a number parameter from an argument with no check
        rec(((_claunch.P_F32, 1, 4, 0),))
    with pytest.raises(ValueError):  # a size the kernel cannot read
        rec(((_claunch.P_F32, 1, 2, 0),), checks=(None, (0.0, 1.0), None))
    with pytest.raises(ValueError):  # allocation 1 of 1
        rec(((_claunch.P_ALLOC, 1, 8, 0),))
    with pytest.raises(ValueError):  # a result that is neither an allocation nor an argument
        rec(((_claunch.P_ARG, 2, 8, 0),), returns=((_claunch.P_F32, 0),))
    assert rec(((_claunch.P_ARG, 2, 8, 0),), returns=()) is None  # no result: no record


def test_no_c_launch_without_cuda():
    """Where CUDA is not available nothing is bound: CPU calls keep their own replay."""
    if torch.cuda.is_available():
        pytest.skip("a CPU-only check")
    assert not _claunch.available() and not _claunch.enabled()


def test_c_launch_is_on_by_default(monkeypatch):
    monkeypatch.delenv("RL_TRITON_CORE_C_LAUNCH", raising=False)
    monkeypatch.setattr(_claunch, "_bound", True)  # as if it were available
    assert _claunch.enabled()
    monkeypatch.setenv("RL_TRITON_CORE_C_LAUNCH", "0")
    assert not _claunch.enabled()
    monkeypatch.setattr(_claunch, "_bound", False)  # not built, or no driver: Triton's launcher
    monkeypatch.delenv("RL_TRITON_CORE_C_LAUNCH")
    assert not _claunch.enabled()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 32), (7, 300)])
def test_c_replay_of_retrace_from_actions(shape, gen, monkeypatch):
    """The fused pass over the actions, repeated in C: the Python path's bits on fresh
    data and new coefficients."""
    _needs_c_launch()
    import rl_triton_core as rc

    def case(gamma):
        n, t = shape
        q = torch.randn(n, t, 6, generator=gen).cuda()
        p = torch.softmax(torch.randn(n, t, 6, generator=gen), -1).cuda()
        a = torch.randint(0, 6, (n, t), generator=gen).cuda()
        mu = (0.1 + torch.rand(n, t, generator=gen)).log().cuda()
        r = torch.randn(n, t, generator=gen).cuda()
        te = (torch.rand(n, t, generator=gen) < 0.05).cuda()
        return (q, p, a, mu, r, te), dict(gamma=gamma, lmbda=0.9, c_bar=1.1, time_dim=-1)

    _dispatch._PLANS.clear()
    args, kw = case(0.97)
    rc.retrace_from_actions(*args, **kw)
    assert _gpu_records(), "the call was not recorded for the C replay"
    args, kw = case(0.9)
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    _poison_cache(4 * shape[0] * shape[1] * 8)
    got = rc.retrace_from_actions(*args, **kw)
    assert replayed, "the repeated call did not take the C replay"
    _same(got, full_path(monkeypatch, lambda: rc.retrace_from_actions(*args, **kw)))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gae", "vtrace", "discounted_returns"])
def test_c_replay_with_out(name, gen, monkeypatch):
    """out= calls repeated in C write into the caller's tensors (the same objects come
    back) with the Python path's bits; an out= tensor that overlaps an input still
    raises the Python path's ValueError."""
    _needs_c_launch()
    _dispatch._PLANS.clear()
    fn, args, kw = _case(name, gen, (16, 96), "batch", torch.float32, 0.97)
    two = name in ("gae", "vtrace")

    def outs():
        o = tuple(torch.full_like(args[0], float("nan")) for _ in range(2 if two else 1))
        return o if two else o[0]

    fn(*args, **kw, out=outs())  # recorded
    fn, args, kw = _case(name, gen, (16, 96), "batch", torch.float32, 0.9)
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    out = outs()
    got = fn(*args, **kw, out=out)
    assert replayed, "the repeated out= call did not take the C replay"
    if two:
        assert type(got) is tuple and got[0] is out[0] and got[1] is out[1]
    else:
        assert got is out
    _same(got, full_path(monkeypatch, lambda: fn(*args, **kw)))
    bad = (args[0], out[1]) if two else args[0]  # the first input as an output
    with pytest.raises(ValueError):
        fn(*args, **kw, out=bad)


def test_scratch_bytes_are_the_storage_torch_would_allocate():
    """A workspace the replay takes as a block has the bytes of the storage
    torch.empty_strided gives the same spec (empty ones and unnumbered dtypes: 0, a
    tensor)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool):
        for _ in range(20):
            nd = int(torch.randint(1, 4, (), generator=g))
            shape = tuple(int(x) for x in torch.randint(1, 7, (nd,), generator=g))
            stride = tuple(int(x) for x in torch.randint(0, 40, (len(shape),), generator=g))
            want = torch.empty_strided(shape, stride, dtype=dtype).untyped_storage().nbytes()
            assert _claunch._scratch_bytes(shape, stride, dtype) == want, (shape, stride, dtype)
    assert _claunch._scratch_bytes((0, 5), (5, 1), torch.float32) == 0
    assert _claunch._scratch_bytes((4,), (1,), torch.complex64) == 0
