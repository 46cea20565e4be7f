"""Fuzzing: random calls of every estimator against the float64 oracle.

Each test runs a chunk of random cases of one estimator (``fuzz_lib.run_chunk``): random
shapes (T = 1, a batch axis of 1, several leading batch axes, trailing axes, feature axes
of the forward scans, empty tensors), the time axis first, last or in the middle (spelled
positive or negative), memory views (contiguous, permuted, sliced with NaN in the skipped
elements, expanded with stride 0), flag dtypes and values (bool, uint8, int64, float;
any nonzero value such as 2.0, -1 or NaN is set), broadcast flags, data dtypes (float32,
float64 and, with a looser tolerance, float16 / bfloat16), gamma / lmbda / thresholds as
numbers or broadcastable tensors of any floating dtype, next_values vs bootstrap_value
(broadcast) vs neither, ``init``, ``out=`` in any view and floating dtype. Every failure
message carries the chunk's seed and the case (rerun one test id with RL_TEST_SEED=<seed>).

* CPU (numba): ``CPU_CASES`` cases per estimator, in ``CPU_CHUNKS`` tests (chunk 0 in the
  main CI tier; the others, each with a profile of its own, in the ``long`` tier).
* CUDA (``gpu``): ``GPU_CASES`` cases per estimator from the same generator.
* Interpreter: ``INTERP_CASES`` tiny cases per estimator on the Triton backend under
  TRITON_INTERPRET=1 (CPU tensors).

RL_FUZZ_SCALE=<float> multiplies every case count (e.g. 0.1 for a quick look, 10 for a
soak run).
"""

import os

import pytest
import torch
from fuzz_lib import ESTIMATORS, run_chunk

SCALE = float(os.environ.get("RL_FUZZ_SCALE", "1"))
CPU_CASES, CPU_CHUNKS, CPU_PROFILES = 2000, 2, 1
GPU_CASES, GPU_CHUNKS, GPU_PROFILES = 10_000, 10, 3
INTERP_CASES = 20


def _n(total, chunks):
    return max(1, round(total * SCALE / chunks))


@pytest.mark.parametrize(
    "chunk", [c if c == 0 else pytest.param(c, marks=pytest.mark.long) for c in range(CPU_CHUNKS)])
@pytest.mark.parametrize("name", ESTIMATORS)
def test_fuzz_cpu(name, chunk, seed, monkeypatch):
    """The numba path: CPU tensors, RL_TRITON_CORE_BACKEND=cpu."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    run_chunk(name, seed, _n(CPU_CASES, CPU_CHUNKS), CPU_PROFILES, "cpu", chunk=chunk)


@pytest.mark.gpu
@pytest.mark.slow  # minutes: `-m "gpu and not slow"` leaves it out
@pytest.mark.parametrize("chunk", range(GPU_CHUNKS))
@pytest.mark.parametrize("name", ESTIMATORS)
def test_fuzz_cuda(name, chunk, seed, monkeypatch):
    """The Triton kernels on CUDA tensors (float32 tolerance grows with T past 128)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    run_chunk(name, seed, _n(GPU_CASES, GPU_CHUNKS), GPU_PROFILES, "cuda", chunk=chunk)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_fuzz_interpreter(name, seed, monkeypatch):
    """The Triton kernels in the interpreter: tiny shapes, a profile per case."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("interpreter only (TRITON_INTERPRET=1, set without CUDA)")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    n = max(1, round(INTERP_CASES * SCALE))
    run_chunk(name, seed, n, n, "cpu", tiny=True, slow_every=1)


def test_retrace_from_actions_empty_time_axis(monkeypatch):
    """Found by the fuzz: T = 0 gives an empty result (torch.narrow(td, 1, -1) raised)."""
    import rl_triton_core as rc

    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    q = torch.zeros(2, 0, 3)
    got = rc.retrace_from_actions(q, q.clone(), torch.zeros(2, 0, dtype=torch.long),
                                  torch.zeros(2, 0), torch.zeros(2, 0),
                                  torch.zeros(2, 0, dtype=torch.bool), time_dim=-1)
    assert got.shape == (2, 0)


def _replay(name, seed, chunk, index, device="cpu"):
    """One case of the GPU fuzz (its sizes), checked on the CPU path (drawn on the CPU) or
    on CUDA."""
    from fuzz_lib import check_case, chunk_cases

    cases = list(chunk_cases(name, seed, index + 1, GPU_PROFILES, "cuda", chunk=chunk,
                             on=device, only=index))
    assert [c[0] for c in cases] == [index]
    i, p, ctx, case = cases[0]
    check_case(case, p, ctx, device, slow_check=True)


def test_fuzz_found_float32_past_its_range(monkeypatch):
    """Found by the GPU fuzz (seed 741678553): a per-stream gamma above 1 over 2,485 steps
    takes the float32 targets past 3.4e38; inf of the right sign is the float32 result (the
    comparison allowed it for float16 / bfloat16 only)."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    _replay("retrace_from_actions", 741678553, 0, 25)


@pytest.mark.gpu
def test_fuzz_found_float32_overflow_inside_the_range_cuda(monkeypatch):
    """Found by the GPU fuzz (seed 741678553), on CUDA: in case 25, 3 targets of about
    -2.9e38, just inside float32's range, came out -inf (an intermediate overflowed
    first); in case 31 (the float64 reference itself passes 1e308), NaN (inf - inf), and
    the fast oracle's inf against the reference's inf was counted as an error. The
    comparison accepts inf and NaN near and past the dtype's range, where the output
    passes it, and equal infinities."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    _replay("retrace_from_actions", 741678553, 0, 25, device="cuda")
    _replay("retrace_from_actions", 741678553, 0, 31, device="cuda")


def test_fuzz_found_retrace_from_actions_bfloat16(monkeypatch):
    """Found by the GPU fuzz (seed 741678553): bfloat16 inputs whose per-action products
    and log ratio, rounded to bfloat16 before the scan, put 19 of 768 targets 30% off;
    they are computed in float32 now."""
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    _replay("retrace_from_actions", 741678553, 2, 583)
