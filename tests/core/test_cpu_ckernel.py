"""The C scan kernel of the CPU path (rl_triton_core.scan._cscan): GAE, TD(lambda) and
discounted returns, bit for bit the numba loop's results on every layout it walks
(time-major columns, batch-major rows, long streams cut into segments and fixed up),
every flag dtype, numbers or tensors for gamma and lambda, with and without next values
and bootstraps; and within tolerance of the float64 reference. Each case draws fresh
random inputs; outputs are poisoned with NaN first (``out=``) where a case writes into
given tensors."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import rl_triton_core as rc
from rl_triton_core import estimators, reference
from rl_triton_core.scan import _cpu_c, _dispatch

pytestmark = [
    pytest.mark.skipif(not _cpu_c.available(), reason="the C kernel is not built"),
    pytest.mark.skipif(os.environ.get("RL_TRITON_CORE_BACKEND", "auto") == "triton",
                       reason="the CPU path only"),
]

SEED = int(os.environ.get("RL_TEST_SEED", np.random.SeedSequence().entropy % 2**31))


def _gen(i):
    return torch.Generator().manual_seed(SEED + 7919 * i)


def _flag(g, shape, p, kind):
    bits = torch.rand(shape, generator=g) < p
    if kind == "bool":
        return bits
    if kind == "uint8":
        return bits.to(torch.uint8) * 3
    if kind == "int64":
        return bits.to(torch.int64) * -2
    # float flags: any nonzero is set, NaN included
    vals = torch.tensor([1.0, 2.0, -1.0, float("nan")])
    pick = vals[torch.randint(0, 4, shape, generator=g)]
    return torch.where(bits, pick, torch.zeros(shape)).to(
        torch.float64 if kind == "float64" else torch.float32)


# (layout name, data shape, time_dim, flag shape builder)
LAYOUTS = [
    ("time-major", (100, 700), 0),  # above the size where the call takes two threads
    ("time-major-features", (64, 40, 3), 0),
    ("batch-major", (37, 130, 1), -2),
    ("batch-major-2d", (70, 257), -1),
    ("flat-long", (9000,), -1),
    ("flat-short", (1500,), -1),
    ("few-long", (3, 5000), -1),
    ("middle-axis", (6, 300, 5), 1),
]


def _inputs(g, layout, dtype, flag_kind, p_done, opts):
    _, shape, td = layout
    r = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    te = _flag(g, shape, p_done, flag_kind)
    tr = _flag(g, shape, p_done, flag_kind)
    kw = dict(time_dim=td)
    if "nv" in opts:
        kw["next_values"] = torch.randn(shape, generator=g).to(dtype)
    if "boot" in opts:
        bshape = tuple(s for i, s in enumerate(shape) if i != td % len(shape))
        kw["bootstrap_value"] = torch.randn(bshape, generator=g).to(dtype)
    if "gamma-tensor" in opts:
        kw["gamma"] = (0.5 + 0.5 * torch.rand(shape, generator=g)).to(dtype)
    else:
        kw["gamma"] = float(0.9 + 0.1 * torch.rand((), generator=g))
    if "lmbda-tensor" in opts:
        kw["lmbda"] = torch.rand(shape, generator=g).to(dtype)
    else:
        kw["lmbda"] = float(0.8 + 0.2 * torch.rand((), generator=g))
    if "strided" in opts:  # every tensor a non-contiguous view
        def strided(t):
            if t is None or not isinstance(t, torch.Tensor) or t.dim() == 0:
                return t
            big = torch.empty(t.shape + (2,), dtype=t.dtype)
            big[..., 0] = t
            big[..., 1] = float("nan") if t.is_floating_point() else 1
            return big[..., 0]
        r, v, te, tr = map(strided, (r, v, te, tr))
        kw = {k: strided(x) for k, x in kw.items()}
    return r, v, te, tr, kw


def _call(name, r, v, te, tr, kw, out=None):
    if name == "gae":
        return rc.gae(r, v, te, tr, **kw, out=out)
    if name == "lambda_returns":
        return rc.lambda_returns(r, v, te, tr, **kw, out=out)
    kw = {k: x for k, x in kw.items() if k != "lmbda"}
    return rc.discounted_returns(r, te, tr, **kw, out=out)


def _ref(name, r, v, te, tr, kw):
    d = {k: (x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
         for k, x in kw.items()}
    if name == "gae":
        return reference.gae(r.double(), v.double(), te, tr, **d)
    if name == "lambda_returns":
        return reference.lambda_returns(r.double(), v.double(), te, tr, **d)
    d.pop("lmbda")
    return reference.discounted_returns(r.double(), te, tr, **d)


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _numba(fn, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
        m.setenv("RL_TRITON_CORE_CPU_FIRST", "0")
        return _as_tuple(fn())


def _bitwise(a, b):
    """Bit for bit (NaN where NaN), in numpy: fast for these sizes."""
    def bits(x):
        x = x.detach().numpy()
        return x.view(np.uint8) if x.dtype == np.bool_ else x
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape
        and np.array_equal(bits(x), bits(y), equal_nan=x.is_floating_point())
        for x, y in zip(a, b))


WALK = {"fast": True}


@pytest.fixture(params=["fast", "vector", "scalar"], autouse=True)
def recurrence(request):
    """Every test with the fast walks (float32 data in float32: within tolerance of the
    reference, not numba's bits) and, with them switched off, with the row walk's vector
    recurrence (where the CPU has AVX-512) and its scalar loop (numba's bits). A recorded
    call keeps its walk: the plans are dropped at each switch."""
    from rl_triton_core.scan import _cscan

    fast = request.param == "fast"
    was = _cscan.use_vector(request.param != "scalar")
    was_fast = _cscan.use_fast(fast)
    WALK["fast"] = fast
    _dispatch._PLANS.clear()
    yield
    _cscan.use_vector(was)
    _cscan.use_fast(was_fast)
    _dispatch._PLANS.clear()


def _fast_walk(dtype, layout, flag_kind, opts):
    """Whether a case takes a fast walk (rows: 16 steps a vector; time-major columns: 16
    streams a vector): float32 data, whatever the flags, strides and coefficients, where
    the CPU has AVX-512 (elsewhere the float64 walks: numba's bits)."""
    from rl_triton_core.scan import _cscan

    was = _cscan.use_vector(True)
    has512 = _cscan.use_vector(was)
    return WALK["fast"] and dtype == torch.float32 and has512


OPTS = [(), ("nv",), ("boot",), ("gamma-tensor", "lmbda-tensor"), ("nv", "strided"),
        ("boot", "gamma-tensor")]


@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
def test_c_kernel_equals_numba_and_reference(name, layout, monkeypatch):
    for i in range(3):
        g = _gen(hash((name, layout[0], i)) % 10_000)
        dtype = (torch.float32, torch.float64)[i % 2]
        flag_kind = ("bool", "float32", "uint8", "int64", "float64")[
            int(torch.randint(0, 5, (), generator=g))]
        opts = OPTS[int(torch.randint(0, len(OPTS), (), generator=g))]
        p_done = (0.0, 0.003, 0.05)[i]
        r, v, te, tr, kw = _inputs(g, layout, dtype, flag_kind, p_done, opts)
        before = [t.clone() for t in (r, v, te, tr)]
        ctx = f"{name} {layout[0]} {dtype} {flag_kind} {opts} p={p_done} seed={SEED}"
        fast = _fast_walk(dtype, layout[0], flag_kind, opts)
        first = None
        for threads in (1, 2):
            with rc.tuning(cpu_threads=threads):
                got = _as_tuple(_call(name, r, v, te, tr, kw))
                again = _as_tuple(_call(name, r, v, te, tr, kw))  # the recorded plan
            if fast:  # the same bits on any number of threads
                first = first or got
                assert _bitwise(got, first), ctx + f" threads={threads}: bits differ"
            else:
                want = _numba(lambda a=(r, v, te, tr, kw): _call(name, *a), monkeypatch)
                assert _bitwise(got, want), ctx + f" threads={threads}: C != numba"
            assert _bitwise(again, got), ctx + ": the replayed call differs"
        expect = _as_tuple(_ref(name, r, v, te, tr, kw))
        tol = 1e-4 if dtype == torch.float32 else 1e-10
        for x, e in zip(got, expect):
            assert x.dtype == dtype and x.shape == r.shape, ctx
            np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=tol, atol=tol, err_msg=ctx)
        for t, b in zip((r, v, te, tr), before):
            assert _bitwise((t,), (b,)), ctx + ": an input was modified"


@pytest.mark.parametrize("layout", ["time-major", "batch-major", "flat-long"])
def test_out_poisoned_with_nan_is_overwritten(layout, monkeypatch):
    lay = next(x for x in LAYOUTS if x[0] == layout)
    g = _gen(11)
    r, v, te, tr, kw = _inputs(g, lay, torch.float32, "bool", 0.01, ())
    out = (torch.full(r.shape, float("nan")), torch.full(r.shape, float("nan")))
    got = _call("gae", r, v, te, tr, kw, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    if _fast_walk(torch.float32, lay[0], "bool", ()):
        want = _call("gae", r, v, te, tr, kw)
    else:
        want = _numba(lambda: _call("gae", r, v, te, tr, kw), monkeypatch)
    assert _bitwise(got, want)
    assert not any(o.isnan().any() for o in out)


@pytest.mark.parametrize("resets", ["none", "sparse", "every-step", "segment-edges"])
def test_segmented_stream_fixup_is_exact(resets, monkeypatch):
    """A long stream is cut into segments each started from 0 and fixed up: whatever the
    done flags (none at all: every segment recomputed whole), one sequential pass's bits."""
    g = _gen(23)
    T = 70_000  # above the size where the call takes two threads
    r, v = torch.randn(T, generator=g), torch.randn(T, generator=g)
    te = torch.zeros(T, dtype=torch.bool)
    if resets == "sparse":
        te[torch.randint(0, T, (5,), generator=g)] = True
    elif resets == "every-step":
        te[:] = True
    elif resets == "segment-edges":  # flags on the first and last step of segments
        for k in range(0, T, 625):
            te[k] = True
            te[max(k - 1, 0)] = True
    r, v = r.double(), v.double()  # float64: the row walk (segments and fix-up)
    for threads in (1, 2):
        with rc.tuning(cpu_threads=threads):
            got = rc.gae(r, v, te, gamma=0.999, lmbda=0.99, time_dim=-1)
        want = _numba(lambda: rc.gae(r, v, te, gamma=0.999, lmbda=0.99, time_dim=-1),
                      monkeypatch)
        assert _bitwise(got, want), f"{resets} threads={threads}"


@pytest.mark.parametrize("resets", ["none", "sparse", "episodes", "every-step", "segment-edges"])
@pytest.mark.parametrize("name", ["gae", "lambda_returns", "discounted_returns"])
def test_fast_walk_avx512_equals_generic(name, resets):
    """The fast row walk's AVX-512 and AVX2 paths (masked rounds, long streams cut into
    segments on two threads and fixed up) give the generic fast walk's bits: flat streams
    and rows, byte and float flags, next values and bootstraps, NaN and inf behind done
    steps."""
    from rl_triton_core.scan import _cscan

    if not WALK["fast"]:
        pytest.skip("compares two fast walks")
    was = _cscan.use_vector(True)
    has512 = _cscan.use_vector(was)
    if not has512:
        pytest.skip("the CPU has no AVX-512 (the fast walks run where it has)")
    g = _gen(hash((name, resets)) % 10_000)
    # lengths off and on the 16-step vectors (a stream's top vector partial or whole)
    for shape, td in (((70_003,), -1), ((70_000,), -1), ((9, 4099), -1), ((9, 4096), -1),
                      ((37, 130, 1), -2), ((37, 128, 1), -2)):
        T = shape[td]
        r, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        te = torch.zeros(shape, dtype=torch.bool)
        tr = torch.zeros(shape, dtype=torch.bool)
        if resets == "sparse":
            te.view(-1)[torch.randint(0, te.numel(), (5,), generator=g)] = True
        elif resets == "episodes":
            te = torch.rand(shape, generator=g) < 0.003
            tr = torch.rand(shape, generator=g) < 0.003
        elif resets == "every-step":
            te[:] = True
        elif resets == "segment-edges":  # done steps around every 16-step and segment edge
            idx = torch.tensor([k + d for k in range(16, T, 2048) for d in (-17, -16, -1, 0, 15)
                                if 0 <= k + d < T])
            te.index_fill_(td % r.dim(), idx, True)
        if resets != "none":  # non-finite values behind done steps: cut, never carried
            r.masked_fill_(te & (torch.rand(shape, generator=g) < 0.5), float("inf"))
        kw = dict(time_dim=td, gamma=0.99, lmbda=0.95)
        if len(shape) == 2:
            kw["bootstrap_value"] = torch.randn(9, generator=g)
            te, tr = te.float(), tr.float() * -2.0
        if len(shape) == 3:
            kw["next_values"] = torch.randn(shape, generator=g)
        got = {}
        for path, on512, on256 in (("avx512", True, True), ("avx2", False, True),
                                   ("generic", False, False)):
            was512, was256 = _cscan.use_512(on512), _cscan.use_256(on256)
            _dispatch._PLANS.clear()
            try:
                for threads in (1, 2):
                    with rc.tuning(cpu_threads=threads):
                        got[path, threads] = _as_tuple(_call(name, r, v, te, tr, kw))
            finally:
                _cscan.use_512(was512)
                _cscan.use_256(was256)
                _dispatch._PLANS.clear()
        ctx = f"{name} {resets} {shape} seed={SEED}"
        for key, x in got.items():
            assert _bitwise(x, got["generic", 1]), f"{ctx} {key}: bits differ"
        expect = _as_tuple(_ref(name, r, v, te, tr, kw))
        for x, e in zip(got["avx512", 2], expect):
            np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-4, atol=1e-4, err_msg=ctx)


def test_without_avx512_float32_takes_the_avx2_or_float64_walks(monkeypatch):
    """Where the CPU has no AVX-512 (``use_vector(False)`` stands in for it), contiguous
    float32 rows with gamma and lambda numbers take the fast row walk's AVX2 path (the
    AVX-512 path's bits); other float32 calls (time-major here), and every call where the
    AVX2 path is off, the float64 walks (numba's bits): the generic fast walks' 16-lane
    vectors, built for AVX2, ran 2.5-7x slower than those."""
    from rl_triton_core.scan import _cscan

    if not WALK["fast"]:
        pytest.skip("the fast walks' switch is off in this run")
    was = _cscan.use_vector(True)
    has512 = _cscan.use_vector(was)
    g = _gen(41)
    for shape, td in (((64, 300), -1), ((300, 64), 0), ((20_000,), -1)):
        r, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
        te = torch.rand(shape, generator=g) < 0.01

        def call(vec, on256, a=(r, v, te, td)):
            was_v, was_256 = _cscan.use_vector(vec), _cscan.use_256(on256)
            _dispatch._PLANS.clear()
            try:
                return rc.gae(*a[:3], gamma=0.99, lmbda=0.95, time_dim=a[3])
            finally:
                _cscan.use_vector(was_v)
                _cscan.use_256(was_256)
                _dispatch._PLANS.clear()

        want = _numba(lambda a=(r, v, te, td): rc.gae(*a[:3], gamma=0.99, lmbda=0.95,
                                                       time_dim=a[3]), monkeypatch)
        assert _bitwise(call(False, False), want), f"{shape}: not the float64 walk's bits"
        avx2 = call(False, True)
        if td == 0:
            assert _bitwise(avx2, want), f"{shape}: not the float64 walk's bits"
        elif has512:
            assert _bitwise(avx2, call(True, True)), f"{shape}: not the AVX-512 path's bits"
            assert not _bitwise(avx2, want), f"{shape}: the AVX2 path did not run"


def test_c_kernel_runs_without_numba():
    """A fresh process computes GAE and TD(lambda) on the C kernel without importing
    numba, and the first calls take no background loading."""
    code = (
        "import sys, torch, rl_triton_core as rc\n"
        "r = torch.randn(128, 64); v = torch.randn(128, 64)\n"
        "d = torch.rand(128, 64) < 0.05\n"
        "a = rc.gae(r, v, d, gamma=0.99, lmbda=0.95, time_dim=0)\n"
        "b = rc.gae(r, v, d, gamma=0.99, lmbda=0.95, time_dim=0)\n"
        "c = rc.lambda_returns(r, v, d, gamma=0.99, lmbda=0.95, time_dim=0)\n"
        "import threading\n"
        "assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])\n"
        "print('numba' in sys.modules, threading.active_count())\n"
    )
    env = dict(os.environ)
    env.pop("RL_TRITON_CORE_CPU_KERNEL", None)
    env.pop("RL_TRITON_CORE_BACKEND", None)
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["False", "1"], out.stdout + out.stderr


def test_forced_numba_and_unhandled_variants_take_numba(monkeypatch):
    """RL_TRITON_CORE_CPU_KERNEL=numba, and variants the C kernel does not compute
    (V-trace, traces), run the numba path; a plan recorded on one kernel is not replayed
    on the other after the switch."""
    calls = []
    real, real_prepared = _cpu_c.run, _cpu_c.run_prepared
    monkeypatch.setattr(_cpu_c, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(_cpu_c, "run_prepared",  # a replay of a recorded call
                        lambda *a, **k: calls.append(1) or real_prepared(*a, **k))
    if estimators._replay is not None:  # the C replay of a recorded call: a hit counts
        real_c = estimators._replay

        def c_replay(*a):
            res = real_c(*a)
            if res is not None:
                calls.append(1)
            return res

        monkeypatch.setattr(estimators, "_replay", c_replay)
    g = _gen(5)
    r, v = torch.randn(50, 8, generator=g), torch.randn(50, 8, generator=g)
    d = torch.rand(50, 8, generator=g) < 0.1
    _dispatch._PLANS.clear()
    a = rc.gae(r, v, d, gamma=0.9, lmbda=0.9, time_dim=0)
    rc.gae(r, v, d, gamma=0.9, lmbda=0.9, time_dim=0)
    assert len(calls) == 2
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
    b = rc.gae(r, v, d, gamma=0.9, lmbda=0.9, time_dim=0)
    assert len(calls) == 2
    if WALK["fast"]:  # float32 in float32 on the C kernel, float64 in numba
        for x, y in zip(a, b):
            np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-5, atol=1e-5)
    else:
        assert _bitwise(a, b)
    monkeypatch.delenv("RL_TRITON_CORE_CPU_KERNEL")
    rc.eligibility_traces(r, d, gamma=0.9, lmbda=0.9, time_dim=0)
    assert len(calls) == 2


def test_unsupported_dtype_falls_back(monkeypatch):
    """Flag dtypes the row and column walks do not read (a float16 flag, which the CPU
    path widens, and an int16 flag) still give numba's result; the fast walks read any
    flag dtype and give the bits of the same flags as bool."""
    g = _gen(9)
    r, v = torch.randn(40, 6, generator=g), torch.randn(40, 6, generator=g)
    for d in ((torch.rand(40, 6, generator=g) < 0.1).to(torch.int16),
              (torch.rand(40, 6, generator=g) < 0.1).to(torch.float16)):
        got = rc.gae(r, v, d, gamma=0.9, lmbda=0.9, time_dim=0)
        if WALK["fast"]:
            want = rc.gae(r, v, d.bool(), gamma=0.9, lmbda=0.9, time_dim=0)
        else:
            want = _numba(lambda d=d: rc.gae(r, v, d, gamma=0.9, lmbda=0.9, time_dim=0),
                          monkeypatch)
        assert _bitwise(got, want)


@pytest.mark.parametrize("layout", ["flat", "time-major", "batch-major"])
def test_two_threads_equal_numba(layout, monkeypatch):
    """Calls large enough for the second thread (2M elements and up): the threads' shares
    and, for a few long streams, the segments' fix-up give one sequential pass's bits."""
    g = _gen(31)
    shape, td = {"flat": ((2_200_000,), -1), "time-major": ((1100, 2048), 0),
                 "batch-major": ((2048, 1100, 1), -2)}[layout]
    r, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    te = torch.rand(shape, generator=g) < 0.002
    tr = (torch.rand(shape, generator=g) < 0.002).float()
    from rl_triton_core.scan import _cscan

    with rc.tuning(cpu_threads=2):
        got = rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=td)
        was = _cscan.use_gomp(not _cscan.use_gomp(True))  # the other pool
        _dispatch._PLANS.clear()
        try:
            other = rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=td)
        finally:
            _cscan.use_gomp(was)
            _dispatch._PLANS.clear()
    assert _bitwise(got, other), "torch's OpenMP team and threads of our own differ"
    want = _numba(lambda: rc.gae(r, v, te, tr, gamma=0.99, lmbda=0.95, time_dim=td),
                  monkeypatch)
    if WALK["fast"]:  # float32 in float32: within tolerance of numba's float64 loop
        for x, e in zip(got, want):
            np.testing.assert_allclose(x.numpy(), e.numpy(), rtol=1e-4, atol=1e-4)
    else:
        assert _bitwise(got, want)


def test_floor_passes_agree():
    """The benchmark's two C floors (blocks, fused; the fused one's AVX-512 loop where the
    CPU has it) write the same outputs, from every input kind (two byte flags), at
    lengths off the vectors' and blocks' multiples and past the streamed stores'
    threshold."""
    cs = pytest.importorskip("rl_triton_core.scan._cscan")
    rng = np.random.default_rng(4)
    for n in (1, 15, 16, 2049, 100_003, (1 << 21) + 5):
        ins = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
        ins += [(rng.random(n) < 0.3).astype(np.uint8), (rng.random(n) < 0.4).astype(np.uint8),
                (rng.random(n) < 0.5).astype(np.int64)]
        want0 = ins[0] + ins[1] + (ins[2] ^ ins[3] ^ (ins[4] != 0)).astype(np.float32)
        for fn in (cs.floor, cs.floor_fused):
            for threads in (1, 2):
                o0, o1 = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
                fn(o0, o1, threads, *ins)
                assert np.array_equal(o0, want0), (fn, n, threads)
                assert np.array_equal(o1, np.float32(0.5) * want0), (fn, n, threads)
