"""The one-launch segmented scan (PHASE 4, the look-back over maps) in the interpreter,
in blocks of 2 segments, so the blocks' maps are composed over several windows: forward
and backward passes (the adjoint modes 6, 7, 8), float64
workspaces, time-major thread-per-stream tiles and several stream blocks. The GPU
runs it for real where the plan picks it (``_use_look_back``)."""

import os

import pytest
import test_autograd as ta  # a sibling module (rootdir-relative import, as core_testlib)
import torch
from core_testlib import spy_launch_consts

import rl_triton_core as rc
import rl_triton_core.reference as ref
from rl_triton_core.scan import _launch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="interpreter only (the GPU reaches it at long T)")


@pytest.fixture
def lb(monkeypatch, tuned):
    """Force PHASE 4 in blocks of 2; returns the launches seen: (S, grid, phases)."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(segment_len=16)
    tuned(look_back=True)
    tuned(look_window=2)
    tuned(cached_launch=False)
    seen = []
    real = _launch.launch

    def spy(*a, **k):
        res = real(*a, **k)
        args, launched = res[0], res[3]
        seen.append((args[-2], launched[0][1], [c["PHASE"] for _, _, c in launched]))
        return res

    monkeypatch.setattr(_launch, "launch", spy)
    return seen


BACKWARD = ["gae_shifted", "lambda_shifted", "vtrace_shifted", "vtrace_shifted_tensor_coefs",
            "linrec_reverse", "linrec_forward", "traces", "cumsum"]


# (17, 48): 3 segments (a block of 2 and a partial one) in several stream blocks, the last
# one partial; (20, 80) took 3x as long (the reference's autograd walks T in Python)
@pytest.mark.parametrize("layout", [((3, 160), -1), ((80, 40), 0), ((17, 48), -1)])
@pytest.mark.parametrize("case", BACKWARD)
def test_look_back_forward_and_backward_fp64(case, layout, lb):
    """Outputs and gradients against autograd through the float64 reference
    (``test_autograd._check``)."""
    shape, td = layout
    ta._check(case, shape, td, "cpu", 1234, gradcheck=None)
    # every launch took PHASE 4 with more than one block of segments; at T = 160
    # (10 segments, 5 blocks) the blocks' maps take several windows
    assert lb and all(ph == [4] and S > 2 for S, _, ph in lb), lb
    if shape[1] == 160:
        assert all(S == 10 for S, _, _ in lb), lb
    if td == 0 or shape[0] == 20:
        assert any(grid[0] > S for S, grid, _ in lb), lb  # several stream blocks


@pytest.mark.parametrize("reverse", [False, True])
def test_look_back_non_finite_stays_local(reverse, lb):
    """A NaN at one step reaches only the steps after it in scan order, as in the
    reference and the three launches (found in review: the walk-back's accumulator
    was once built from the segment's own map)."""
    T = 64
    x = torch.randn(2, T, dtype=torch.float64)
    beta = torch.full((2, T), 0.5, dtype=torch.float64)
    bad = 16 if reverse else 31  # the last step, in scan order, of segment 1
    x[0, bad] = float("nan")
    want = ref.linear_recurrence(x, beta, reverse=reverse, time_dim=-1)
    got = rc.linear_recurrence(x, beta, reverse=reverse, time_dim=-1)
    assert lb and lb[0][2] == [4]
    bad_steps = (torch.isnan(got) & ~torch.isnan(want)).nonzero().tolist()
    assert not bad_steps, f"NaN where the reference is finite: {bad_steps}"


@pytest.mark.parametrize("case", ["gae_shifted", "lambda_shifted", "vtrace_shifted", "traces",
                                  "linrec_forward"])
@pytest.mark.parametrize("layout", [((64, 64), 0), ((64, 64), -1)])
def test_look_back_whole_tiles(case, layout, monkeypatch, lb):
    """Time-major: whole stream blocks and chunks (no bounds: EVEN), and reverse scans over
    columns in scan order (FLIP), against the float64 reference; the launch is checked to
    have taken them, so this cannot pass on the bounded tile (batch-major: neither)."""
    seen = spy_launch_consts(monkeypatch)
    shape, td = layout
    fn, _ = ta.CASES[case]
    inputs = ta._inputs(99, shape, td, "cpu")
    inputs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in inputs.items()}
    out = fn(rc, inputs, td)
    want = fn(ref, {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                    for k, v in inputs.items()}, td)
    out = out if isinstance(out, tuple) else (out,)
    want = want if isinstance(want, tuple) else (want,)
    for o, w in zip(out, want):
        torch.testing.assert_close(o.double(), w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))
    assert seen and all(c["PHASE"] == 4 and c["EVEN"] == (td == 0) for c in seen), seen
    assert all(c["FLIP"] == (td == 0 and c["REVERSE"]) for c in seen), seen


@pytest.mark.parametrize("look_back", [False, True])
@pytest.mark.parametrize("case", ["gae_shifted", "vtrace_shifted", "traces", "linrec_forward",
                                  "linrec_reverse"])
def test_one_stream_row_tile(case, look_back, monkeypatch, tuned):
    """One batch-major stream: the plan's one-row tile on 8 warps (512 float64 steps a
    chunk), in segments of two chunks (the last partial), as three launches and as the
    look-back: outputs and gradients against autograd through the float64 reference."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    tuned(segment_len=1024)
    tuned(look_back=look_back)
    tuned(look_window=2)
    tuned(cached_launch=False)
    seen = spy_launch_consts(monkeypatch)
    ta._check(case, (1, 2500), -1, "cpu", 4321, gradcheck=None)
    phases = [4] if look_back else [1, 3, 2]
    scans = [c for c in seen if c["PHASE"] != 3]
    assert scans and all(c["BLOCK_N"] == 1 and c["BLOCK_T"] == 512 for c in scans), seen
    assert [c["PHASE"] for c in seen[:len(phases)]] == phases, seen


# where beta is 0 (an episode ends) within each 16-step segment of 16, in time order: none
# (every program walks all the blocks before it), every segment, and a mix that leaves
# programs whose last window of blocks cuts and others whose does not
CUT_SEGMENTS = {"none": [], "all": list(range(16)), "mixed": [1, 4, 5, 9, 14]}


class _NoCut:
    """``scan_kernel`` with LOOK_CUT forced off (the full walk), for a bit comparison."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getattr__(self, name):
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        run = self.kernel[grid]
        return lambda *a, **c: run(*a, **{**c, "LOOK_CUT": False})


@pytest.mark.parametrize("window", [2, 16])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cuts", sorted(CUT_SEGMENTS))
@pytest.mark.parametrize("layout", [((1, 256), -1), ((3, 256), -1), ((256, 3), 0)])
def test_look_back_cuts(cuts, layout, reverse, window, lb, tuned, monkeypatch):
    """The look-back skips the windows of blocks whose maps a later cut discards (a zero
    beta), where blocks before a program's own exist (16 segments in blocks of 2: up to 4
    windows; in one block of 16: none, and the kernel without that code): the same bits
    as the full walk (LOOK_CUT forced off), NaN and -0.0 inputs included, and against
    the float64 reference (beta near 1, so the earliest windows still count), where
    segments cut for every stream, for some, and for none. A stream without cuts shares
    the stream block where others have them, so a skip is taken only where every stream
    whose carry crosses is cut."""
    tuned(look_window=window)
    seen = spy_launch_consts(monkeypatch)
    shape, td = layout
    g = torch.Generator().manual_seed(77 + len(CUT_SEGMENTS[cuts]))
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    beta = 0.95 + 0.05 * torch.rand(shape, generator=g, dtype=torch.float64)
    bt, xt = (beta, x) if td == -1 else (beta.T, x.T)  # [N, T] views
    for s in CUT_SEGMENTS[cuts]:
        steps = s * 16 + torch.randint(0, 16, (bt.shape[0],), generator=g)
        bt[0, steps[0]] = 0.0
        if bt.shape[0] > 2:
            bt[2, steps[2]] = -0.0  # streams 0 and 2 cut, stream 1 never does
    xt[0, 40] = float("nan")  # reaches only the steps after it before the next cut
    xt[-1, 200] = -0.0
    want = ref.linear_recurrence(x, beta, reverse=reverse, time_dim=td)
    got = rc.linear_recurrence(x, beta, reverse=reverse, time_dim=td)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    assert lb and all(ph == [4] and S == 16 for S, _, ph in lb), lb
    assert seen and all(c["LOOK_CUT"] == (window < 16) for c in seen), seen
    monkeypatch.setattr(_launch, "scan_kernel", _NoCut(_launch.scan_kernel))
    full = rc.linear_recurrence(x, beta, reverse=reverse, time_dim=td)
    assert torch.equal(got.view(torch.int64), full.view(torch.int64))
