"""The execution paths a small random test would miss: time split into segments
(a few long streams: the CPU path's threads; the kernel's segmented carry, in three
launches or one look-back launch) and the cached launch that skips validation on
repeated calls (CUDA)."""

import pytest
import torch
from core_testlib import spy_launch_consts

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core import _host, _table
from rl_triton_core.scan import _dispatch, _kernel, _launch


def _inputs(gen, shape, device):
    r = torch.randn(shape, generator=gen)
    v = torch.randn(shape, generator=gen)
    lr = 0.5 * torch.randn(shape, generator=gen)
    nv = torch.randn(shape, generator=gen)
    term = torch.rand(shape, generator=gen) < 0.02
    trunc = torch.rand(shape, generator=gen) < 0.02
    boot = torch.randn(shape[:-1], generator=gen)
    x = [r, v, lr, nv, term, trunc, boot]
    return [t.to(device) for t in x]


CASES = {
    "gae": lambda r, v, lr, nv, te, tr, b: (rc.gae, ref.gae, (r, v, te, tr),
                                            dict(bootstrap_value=b, lmbda=0.9, time_dim=-1)),
    "lambda_returns": lambda r, v, lr, nv, te, tr, b: (
        rc.lambda_returns, ref.lambda_returns, (r, v, te, tr),
        dict(next_values=nv, lmbda=0.8, time_dim=-1)),
    "discounted_returns": lambda r, v, lr, nv, te, tr, b: (
        rc.discounted_returns, ref.discounted_returns, (r, te, tr),
        dict(bootstrap_value=b, time_dim=-1)),
    "vtrace": lambda r, v, lr, nv, te, tr, b: (
        rc.vtrace, ref.vtrace, (lr, r, v, te, tr), dict(bootstrap_value=b, lmbda=0.9,
                                                        rho_bar=1.3, c_bar=0.9, time_dim=-1)),
    "retrace": lambda r, v, lr, nv, te, tr, b: (
        rc.retrace, ref.retrace, (lr, r, v, nv, te, tr), dict(lmbda=0.9, c_bar=1.1, time_dim=-1)),
    "eligibility_traces": lambda r, v, lr, nv, te, tr, b: (
        rc.eligibility_traces, ref.eligibility_traces, (r, te | tr),
        dict(gamma=0.9, init=b, time_dim=-1)),
    "episodic_cumsum": lambda r, v, lr, nv, te, tr, b: (
        rc.episodic_cumsum, ref.episodic_cumsum, (r, te), dict(init=b, time_dim=-1)),
    "linear_recurrence": lambda r, v, lr, nv, te, tr, b: (
        rc.linear_recurrence, ref.linear_recurrence, (r, torch.sigmoid(v)),
        dict(init=b, time_dim=-1)),
    "linear_recurrence_fwd": lambda r, v, lr, nv, te, tr, b: (
        rc.linear_recurrence, ref.linear_recurrence, (r, torch.sigmoid(v)),
        dict(init=b, reverse=False, time_dim=-1)),
}


def _check(got, want, tol):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.numel() > 0
        assert not torch.isnan(g).any()
        err = (g.double().cpu() - w).abs().max().item()
        assert err <= tol * (1 + w.abs().max().item()), err


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_path_splits_long_streams(name, gen, monkeypatch, tuned):
    """Two streams of 12,000 steps: the CPU path splits time into segments per thread."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    tuned(cpu_threads=4)
    fn, rfn, args, kw = CASES[name](*_inputs(gen, (2, 12_000), "cpu"))
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_two_phase_carry(name, gen, monkeypatch, tuned):
    """The kernel's segmented path, forced on a small shape in the interpreter."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (the GPU runs reach this path at long T)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(segment_len=16)
    tuned(look_back=False)  # the three launches
    fn, rfn, args, kw = CASES[name](*_inputs(gen, (3, 77), "cpu"))
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)


@pytest.mark.parametrize("window", [2, 4])
@pytest.mark.parametrize("shape", [(3, 77), (2, 300)])
@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_look_back(name, shape, window, gen, monkeypatch, tuned):
    """The one-launch segmented plan: a chunk per program, the carry from the maps of
    the blocks of ``window`` segments before it and of the segments before it in its
    block; up to 19 segments, so with a window of 2 the blocks' maps are read in
    several windows (forward and reverse in time)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (the GPU runs reach this path at long T)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(segment_len=16)
    tuned(look_back=True)
    tuned(look_window=window)
    tuned(cached_launch=False)
    fn, rfn, args, kw = CASES[name](*_inputs(gen, shape, "cpu"))
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_middle_pass_in_chunks(name, gen, monkeypatch, tuned):
    """The middle pass composes the segment maps BLOCK_S at a time, carrying across
    chunks (forward, and in reverse for the backward-in-time scans): forced here to 2
    maps a chunk over 5 segments, so the last chunk is part-empty."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (the GPU runs reach this path at long T)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(segment_len=16)
    tuned(middle_elems=4)
    tuned(look_back=False)
    tuned(cached_launch=False)
    fn, rfn, args, kw = CASES[name](*_inputs(gen, (3, 77), "cpu"))
    plan = _launch.plan(3, 77, True, torch.device("cpu"))
    assert plan[3] == 5 and 4 // plan[0] < 5  # 5 segments, more than one chunk of maps
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)


def test_plan_rules(monkeypatch, tuned):
    """The plan's choices measured on the H200 (docs/notes.md items 28 and 30), for a
    132-SM GPU: (BLOCK_N, BLOCK_T, SEG_LEN, S, warps, SCALAR_N, STAGES)."""
    monkeypatch.setitem(_host._SM_COUNT, 0, 132)
    dev = torch.device("cuda", 0)

    def plan(N, T, batch_major, mode=_table.MODE_GAE, elem_bytes=4):
        return _launch.plan(N, T, batch_major, dev, mode, elem_bytes)

    assert plan(4096, 128, True) == (8, 128, 128, 1, 8, False, 1)
    assert plan(4096, 128, True, _table.MODE_VTRACE) == (4, 128, 128, 1, 4, False, 1)
    # whole rows of 129-4096 steps, one chunk a program (docs/notes.md item 59): always
    # for the light scans, and for the others up to 512 steps or where the 128-step
    # tiles would leave under 4 programs per SM; 4-8 steps a thread (16: light scans)
    assert plan(1024, 4096, True) == (1, 4096, 4096, 1, 16, False, 1)
    assert plan(256, 1024, True) == (1, 1024, 1024, 1, 8, False, 1)
    assert plan(16384, 512, True, _table.MODE_VTRACE) == (1, 512, 512, 1, 4, False, 1)
    assert plan(65536, 1024, True)[:5] == (8, 128, 1024, 1, 8)  # many rows: chunk tiles
    assert plan(65536, 1024, True, _table.MODE_TRACE)[:5] == (1, 1024, 1024, 1, 2)
    assert plan(256, 1024, True, _table.MODE_TRACE)[:5] == (1, 1024, 1024, 1, 4)
    assert plan(512, 4096, True, _table.MODE_TRACE)[:5] == (1, 4096, 4096, 1, 8)
    assert plan(100, 1024, True)[3] > 1  # fewer rows than SMs: time split
    assert plan(1024, 8192, True)[1] == 256  # beyond 4096 steps: chunks
    # one stream: one row on 8 warps, 1024 float32 steps a chunk (512 float64)
    assert plan(1, 1_000_000, True)[:3] == (1, 1024, 2048) and plan(1, 1_000_000, True)[4] == 8
    assert plan(1, 1_000_000, True, _table.MODE_TRACE)[:2] == (1, 1024)
    assert plan(1, 1_000_000, True, elem_bytes=8)[:2] == (1, 512)
    assert plan(1, 100, True)[:2] == (1, 128)
    # without whole-row tiles (row_tiles=False): two rows a program fill the GPU without
    # splitting time; with too few streams even then, the default tile, time split
    tuned(row_tiles=False)
    assert plan(1024, 4096, True) == (2, 256, 4096, 1, 4, False, 1)
    assert plan(256, 1024, True)[0] == 8 and plan(256, 1024, True)[3] > 1
    # time-major: a thread per stream from 32 streams, for any number of segments
    assert plan(16384, 512, False) == (32, 16, 512, 1, 1, True, 1)
    assert plan(65536, 1024, False)[:5] == (64, 16, 1024, 1, 2)
    p = plan(256, 16384, False)
    assert p[5] and p[3] > 64
    p = plan(16, 131072, False)
    assert not p[5] and p[:2] == (16, 256)
    # up to 8 time-major streams: a stream a lane, 4 lanes or more along time (H100)
    assert plan(8, 16384, False)[:2] + plan(8, 16384, False)[4:6] == (8, 64, 1, True)
    assert plan(2, 65536, False)[:2] == (2, 256) and plan(2, 65536, False)[5]
    # ... where each time segment is one chunk: not 8x131072 (4 chunks a segment)
    assert not plan(8, 131072, False)[5] and not plan(4, 262144, False)[5]
    # time-major traces of up to 8 chunks walk all of T (the other modes split it)
    assert plan(4096, 128, False, _table.MODE_TRACE)[3] == 1
    assert plan(512, 128, False, _table.MODE_TRACE)[3] == 1
    assert plan(4096, 128, False)[3] > 1 and plan(256, 1024, False, _table.MODE_TRACE)[3] > 1
    assert plan(4, 1024, False, _table.MODE_TRACE)[3] > 1  # (the few-stream tile: split)
    # the L2 prefetch two chunks ahead: one-warp time-major programs over more than 8
    # chunks and no time split (16384x512), nowhere else
    t = rc.current_tuning()
    assert _launch._prefetch(t, True, 1, 1, 512, 16) == 2
    assert _launch._prefetch(t, True, 1, 1, 128, 16) == 0  # (8 chunks)
    assert _launch._prefetch(t, True, 4, 1, 4096, 16) == 0  # (time segments)
    assert _launch._prefetch(t, True, 1, 2, 1024, 16) == 0  # (two warps: not measured)
    assert _launch._prefetch(t, False, 1, 8, 4096, 128) == 0  # (batch-major)
    assert _launch._prefetch(t.replace(prefetch=1), True, 4, 1, 4096, 16) == 1
    # segmented plans: one look-back launch up to ~8 programs per SM, else three launches
    tuned(look_back=None)
    for (N, T, bm), want in {(4096, 128, False): True, (512, 128, False): True,
                             (256, 1024, True): True, (16, 131072, False): True,
                             (16, 131072, True): False, (1, 1_000_000, True): False,
                             (1024, 4096, False): False, (256, 16384, False): False,
                             # one stream: the look-back up to 512 one-row chunks
                             (1, 524288, True): True, (1, 524289, True): False}.items():
        p = plan(N, T, bm)
        assert p[3] > 1 and _launch.use_look_back(N, T, p[0], p[1], dev) == want, (N, T)


@pytest.mark.parametrize("name", ["gae", "vtrace", "episodic_cumsum", "linear_recurrence"])
def test_two_row_tile_matches_reference(name, gen, monkeypatch, tuned):
    """The batch-major two-row tile (chosen without whole-row tiles where it avoids
    splitting time: here, on the interpreter's 4 SMs, 24 streams of 300 steps) gives the
    reference's numbers."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(row_tiles=False)
    assert _launch.plan(24, 300, True, torch.device("cpu"))[:5] == (2, 256, 300, 1, 4)
    fn, rfn, args, kw = CASES[name](*_inputs(gen, (24, 300), "cpu"))
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_whole_row_tile_matches_reference(name, wide, gen, monkeypatch, tuned):
    """Whole-row tiles: 5 streams of 300 steps on the interpreter's 4 SMs take one
    program per row and one chunk (ONE: no carry reduction), with int32 offsets unless
    ``wide_index`` forces int64; either gives the reference's numbers."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (the GPU runs take it at 256x1024 and 1024x4096)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(cached_launch=False)
    tuned(wide_index=wide)
    seen = spy_launch_consts(monkeypatch)
    fn, rfn, args, kw = CASES[name](*_inputs(gen, (5, 300), "cpu"))
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)
    assert [(c["BLOCK_N"], c["BLOCK_T"], c["PHASE"], c["ONE"], c["I64"]) for c in seen] == [
        (1, 512, 0, True, wide)]


def test_int32_offsets_only_where_every_offset_fits():
    """I64 is chosen from a bound on every offset the kernel forms: the padded rows, the
    chunk's overshoot past T, the chunk after the last (which PIPE builds) and V_{t+1}
    included, for every tensor's strides."""
    sizes = (1, 1000, 1000)
    assert _launch._reach({"out": (0, 1000, 1)}, sizes, 8, 128) == 1008 * 1000 + 1257
    big = (1, 2**16, 2**15)  # 2**31 elements, batch-major
    assert _launch._reach({"out": (0, 2**15, 1)}, big, 1, 1) >= 2**31
    small = (1, 2**15, 2**15)
    assert _launch._reach({"out": (0, 2**15, 1)}, small, 1, 2**15) < 2**31
    # a broadcast (stride 0) axis adds nothing; a transposed input counts its own strides
    assert _launch._reach({"x": (0, 0, 1), "v": (0, 1, 2**16)}, small, 1, 16) >= 2**31


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("tile", [(32, 16, 1, True, 3), (64, 16, 2, True, 2),
                                  (32, 128, 8, False)])
@pytest.mark.parametrize("name", ["gae", "vtrace", "episodic_cumsum", "linear_recurrence_fwd"])
def test_time_major_tiles_of_the_sweep(name, tile, device, gen, monkeypatch, tuned):
    """The time-major tiles tile_sweep.py (at 50f9ca7) measured (one thread per stream, the
    chunk loop pipelined STAGES - 1 chunks ahead, the 32 x 128 tile) give the reference's
    numbers: in the interpreter on the CPU, compiled on the GPU."""
    import os

    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only on the CPU")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(tile=tile)
    tuned(cached_launch=False)
    # [N, T] with time-major memory (strides (1, N)): the planner's time-major case
    x = [a.t().contiguous().t() if a.dim() == 2 else a for a in _inputs(gen, (40, 37), device)]
    fn, rfn, args, kw = CASES[name](*x)
    _check(fn(*args, **kw), rfn(*[a.cpu() for a in args],
                                 **{k: v.cpu() if isinstance(v, torch.Tensor) else v
                                    for k, v in kw.items()}), 1e-5)


@pytest.mark.parametrize("seg", [None, 32])
@pytest.mark.parametrize("name", ["lambda_returns", "discounted_returns", "episodic_cumsum",
                                  "eligibility_traces", "gae", "vtrace", "retrace",
                                  "linear_recurrence_fwd"])
def test_time_major_loops_build_the_next_chunk_first(name, seg, gen, monkeypatch, tuned):
    """PIPE (the next chunk's coefficients built before this chunk's scan and stores, in
    the time-major loops over chunks; with FLIP in the reverse scans) gives the
    reference's numbers, in one pass and in segments (PHASE 1 and 2), where the plan
    takes it and where forced; the launches are checked to have taken it."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only on the CPU")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    if name in ("retrace", "linear_recurrence_fwd"):
        tuned(pipe=True)  # not the plan's choice for these modes
    tuned(cached_launch=False)
    tuned(segment_len=seg)
    tuned(look_back=False)
    seen = spy_launch_consts(monkeypatch)
    # [N, T] = [40, 70] with time-major memory: 5 chunks of 16 steps, the last partial
    x = [a.t().contiguous().t() if a.dim() == 2 else a for a in _inputs(gen, (40, 70), "cpu")]
    fn, rfn, args, kw = CASES[name](*x)
    _check(fn(*args, **kw), rfn(*args, **kw), 1e-5)
    loops = [c for c in seen if c["PHASE"] in (0, 1, 2)]
    assert loops and all(c["PIPE"] and c["SCALAR_N"] for c in loops), seen
    # the reverse scans' chunks loaded latest step first (one warp a program)
    assert all(c["FLIP"] == c["REVERSE"] for c in loops), seen
    assert any(c["FLIP"] for c in loops) == (name not in (
        "episodic_cumsum", "eligibility_traces", "linear_recurrence_fwd")), seen
    if seg is not None:
        assert {c["PHASE"] for c in seen} == {1, 2, 3}, seen


def _misaligned(a):
    buf = torch.empty(a.numel() * a.element_size() + 16, dtype=torch.uint8, device=a.device)
    out = buf[a.element_size():a.element_size() * (a.numel() + 1)].view(a.dtype).view(a.shape)
    out.copy_(a)
    assert out.data_ptr() % 16 != 0
    return out


_NEW_SCALARS = {"gamma": 0.93, "lmbda": 0.71, "rho_bar": 0.8, "c_bar": 1.7}


@pytest.mark.parametrize("name", list(CASES))
def test_cached_plan_rebuilds_the_full_paths_arguments(name, gen, monkeypatch,
                                                       captured_launches, tuned):
    """The cached launch hands the kernel the same arguments as the full path, also
    after the scalar coefficients change (float32 hi/lo pairs). Checked on the CPU
    with the launch captured; the GPU tests run it for real."""
    full_args, plan_args = captured_launches.full, captured_launches.replayed
    fn, _, args, kw = CASES[name](*_inputs(gen, (3, 40), "cpu"))
    fn(*args, **kw)  # the full path records the plan
    assert len(full_args) == 1 and len(_dispatch._PLANS) == 1
    fn2, _, args2, kw2 = CASES[name](*_inputs(gen, (3, 40), "cpu"))
    kw2 = {k: _NEW_SCALARS.get(k, w) for k, w in kw.items()}
    kw2["gamma"] = _NEW_SCALARS["gamma"]
    if "gamma" not in kw and name in ("episodic_cumsum", "linear_recurrence",
                                      "linear_recurrence_fwd"):
        del kw2["gamma"]
    fn2(*args2, **kw2)  # replayed from the plan (launch captured)
    assert len(plan_args) == 1 and len(full_args) == 1
    tuned(cached_launch=False)
    fn2(*args2, **kw2)  # the same call through the full path
    assert len(full_args) == 2
    want, got = full_args[1], plan_args[0]
    assert len(want) == len(got)
    user = {a.data_ptr() for a in args2} | {w.data_ptr() for w in kw2.values()
                                           if isinstance(w, torch.Tensor)}
    for pos, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), pos
            if w.data_ptr() in user:
                assert g.data_ptr() == w.data_ptr(), pos
            else:  # an output, the workspace or a stand-in: a fresh buffer of the same kind
                assert g.data_ptr() not in user and g.dtype == w.dtype, pos
        else:
            assert type(g) is type(w) and g == w, (pos, g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(5, 77), (3, 70_000)])
@pytest.mark.parametrize("name", list(CASES))
def test_cuda_cached_launch(name, shape, gen, monkeypatch):
    """Repeated calls (the cached launch) on fresh data, also at another pointer alignment."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    _dispatch._PLANS.clear()
    for trial in range(3):
        fn, rfn, args, kw = CASES[name](*_inputs(gen, shape, "cuda"))
        if trial == 2:  # same shapes and strides, pointers 4 bytes off 16-byte alignment
            args = tuple(_misaligned(a) for a in args)
        got = fn(*args, **kw)
        cpu_args = [a.cpu() for a in args]
        cpu_kw = {k: (w.cpu() if isinstance(w, torch.Tensor) else w) for k, w in kw.items()}
        _check(got, rfn(*cpu_args, **cpu_kw), 1e-4)
    assert _dispatch._replay_ok
    assert len(_dispatch._PLANS) >= 1


def test_float64_exp_in_kernel_is_float64_accurate():
    """V-trace/Retrace exponentiate log-ratios; in float64 the kernel uses its own exp
    (tl.exp of a float64 is float32-accurate on CUDA). Checked wherever Triton runs."""
    import os

    import triton
    import triton.language as tl

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs the interpreter or CUDA")

    @triton.jit
    def _k(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(o_ptr + i, _kernel._exp(tl.load(x_ptr + i, mask=i < n), True), mask=i < n)

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.cat([torch.linspace(-700, 700, 2001, dtype=torch.float64),
                   torch.randn(500, dtype=torch.float64) * 3,
                   torch.tensor([0.0, -0.0, 1e-300, float("inf"), -float("inf"), float("nan")],
                                dtype=torch.float64)]).to(dev)
    out = torch.full_like(x, -1.0)
    _k[(1,)](x, out, x.numel(), BLOCK=4096)
    want = torch.exp(x)
    finite = torch.isfinite(want) & (want > 1e-300)
    rel = ((out - want).abs() / want.abs())[finite]
    assert rel.max().item() < 1e-14
    assert out[-1].isnan() and out[-3] > 1e300 and out[-2] < 1e-300
