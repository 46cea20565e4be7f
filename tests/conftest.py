"""Test-wide setup: the Triton interpreter on machines without CUDA, and the ``impl`` fixture.

``impl`` runs a test once per implementation:

* ``cpu``    -- RL_TRITON_CORE_BACKEND=cpu, CPU tensors (the numba path);
* ``interp`` -- RL_TRITON_CORE_BACKEND=triton, CPU tensors, the Triton kernels under
  TRITON_INTERPRET=1 (only when the interpreter is on, i.e. without CUDA);
* ``cuda``   -- RL_TRITON_CORE_BACKEND=triton, CUDA tensors; marked ``gpu`` so that
  ``pytest -m gpu`` on the H200 runs exactly these.

A test that takes the ``seed`` fixture gets a fresh random seed (or RL_TEST_SEED) that is
printed with the failure report, so a failing case can be rerun exactly.

``RL_TEST_GPUS=<n>`` with pytest-xdist spreads the workers over n GPUs (worker k sees
GPU k mod n only), so the GPU suite and the fuzz use every GPU of a multi-GPU host.
"""

import os

_GPUS = int(os.environ.get("RL_TEST_GPUS", "0") or 0)
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _GPUS > 1 and _WORKER.startswith("gw"):  # before anything initialises CUDA
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(_WORKER[2:]) % _GPUS)

import torch  # noqa: E402

# Must happen before anything imports triton (rl_triton_core does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import random  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
TRITON_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BACKEND_ENV = "RL_TRITON_CORE_BACKEND"

_BACKEND = {"cpu": "cpu", "interp": "triton", "cuda": "triton"}
_DEVICE = {"cpu": "cpu", "interp": "cpu", "cuda": "cuda"}


@dataclass(frozen=True)
class Impl:
    """One implementation under test: the backend name and where its tensors live."""

    name: str
    backend: str
    device: torch.device

    @property
    def is_interp(self) -> bool:
        return self.name == "interp"


def impl_skip_reason(name: str) -> str | None:
    if name == "interp" and not TRITON_INTERPRET:
        return "TRITON_INTERPRET is not set (CUDA present): the interpreter tests are skipped"
    if name == "cuda" and not HAS_CUDA:
        return "needs CUDA"
    return None


def make_impl(name: str) -> Impl:
    return Impl(name, _BACKEND[name], torch.device(_DEVICE[name]))


IMPL_PARAMS = ["cpu", "interp", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(params=IMPL_PARAMS)
def impl(request, monkeypatch) -> Impl:
    reason = impl_skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv(BACKEND_ENV, _BACKEND[request.param])
    return make_impl(request.param)


@pytest.fixture
def seed(request) -> int:
    """A fresh random seed per test (RL_TEST_SEED=<n> to replay one), shown on failure."""
    value = os.environ.get("RL_TEST_SEED")
    s = int(value) if value else random.SystemRandom().randrange(2**31)
    request.node.rl_test_seed = s
    return s


@pytest.fixture
def gen(seed) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def segments(impl, monkeypatch):
    """``segments(n)``: for the rest of the test, the Triton launches split time into
    segments of n steps (the segmented carry that long streams take), so that small
    shapes reach that path too; a no-op for ``n=None`` and on the CPU path."""

    def force(seg_len):
        if seg_len and impl.backend == "triton":
            _tune(monkeypatch, segment_len=seg_len)

    return force


def _tune(monkeypatch, **changes):
    """Change tuning knobs (rl_triton_core.Tuning) until the end of the test."""
    from rl_triton_core import _config

    monkeypatch.setattr(_config, "_current", _config._current.replace(**changes))


@pytest.fixture
def tuned(monkeypatch):
    """``tuned(segment_len=16, look_back=False, ...)``: tuning knobs for the rest of the
    test (see rl_triton_core.Tuning)."""
    return lambda **changes: _tune(monkeypatch, **changes)


def pytest_collection_modifyitems(config, items):
    """The tiers: a ``-m`` expression that does not name ``slow`` leaves the slow tests out
    (``pytest -m gpu`` is the GPU suite without the 10,000-case fuzz and the huge tensors;
    ``pytest -m "gpu and slow"`` runs those). Without CUDA, everything marked ``gpu`` is
    skipped (not failed)."""
    if "slow" not in (config.getoption("markexpr") or ""):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if "slow" not in item.keywords]
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    s = getattr(item, "rl_test_seed", None)
    if s is not None and report.failed:
        report.sections.append(("random seed", f"rerun with RL_TEST_SEED={s}"))
    return report


@pytest.fixture
def captured_launches(monkeypatch):
    """The cached launch on CPU tensors, in the interpreter: plans are recorded as on
    CUDA and replayed with the kernel launch captured instead of run. ``full``: the
    argument lists the full path launched with; ``modes``: their MODEs; ``replayed``:
    the argument lists the plans handed to the launcher."""
    import types

    if not TRITON_INTERPRET:
        pytest.skip("interpreter only (the GPU tests run the cached launch for real)")
    from rl_triton_core import _tl
    from rl_triton_core.scan import _dispatch, _launch

    monkeypatch.setenv(BACKEND_ENV, "triton")
    _tune(monkeypatch, cpu_plans=True)
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    cap = types.SimpleNamespace(full=[], modes=[], replayed=[])
    real = _launch.launch

    def spy(*a, **k):
        res = real(*a, **k)
        cap.full.append(list(res[0]))
        cap.modes.append(a[0])
        return res

    monkeypatch.setattr(_launch, "launch", spy)
    real_replay = _tl.Replay.__call__

    def replay(self, args):  # the scan's replays captured; the others' run
        if self.jit_fn is not _launch.scan_kernel:
            return real_replay(self, args)
        cap.replayed.append(list(args))
        return True

    monkeypatch.setattr(_tl.Replay, "__call__", replay)
    return cap


def pytest_runtest_logreport(report):
    """``RL_TEST_FAIL_LOG=<file>``: append each failure's report as it happens (a run cut
    off by a time limit still leaves them; with xdist, the controller writes them).
    ``RL_TEST_TIME_LOG=<file>``: a line per test as it ends (its time and outcome)."""
    timing = os.environ.get("RL_TEST_TIME_LOG")  # "<seconds> <outcome> <test>" per phase
    if timing and not hasattr(report, "node") and (report.when == "call" or report.failed):
        with open(timing, "a") as f:
            f.write(f"{report.duration:8.2f} {report.outcome} {report.nodeid} {report.when}\n")
    path = os.environ.get("RL_TEST_FAIL_LOG")
    if path and report.failed and not hasattr(report, "node"):
        with open(path, "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
            for name, text in report.sections:
                f.write(f"--- {name}\n{text[-4000:]}\n")


def pytest_sessionfinish(session):
    """In an xdist worker: one full garbage collection, then ``gc.freeze()``, before the
    worker reports that it has finished (this hook runs inside xdist's wrapper, which
    sends "workerfinished" after it).

    Why: after "workerfinished" the controller ends the worker's gateway, and execnet
    gives the worker 5 s to return before it sends the worker a SIGINT. What the worker
    still does then is mostly garbage collection (pytest collects at unconfigure and
    again at cleanup), and a full collection of a worker's heap after the suite (torch,
    Ray, RLlib, numba, the interpreter: millions of objects) takes seconds on two busy
    cores. The SIGINT then lands in a gc callback -- hypothesis's ``gc_callback``, which
    accounts GC time -- where the KeyboardInterrupt cannot propagate, and pytest prints
    it as a PytestUnraisableExceptionWarning with its traceback. Collected here, while
    pytest's unraisable hook still attributes what the finalizers raise, and frozen, the
    later collections only walk what teardown creates."""
    import gc

    if not _WORKER:
        return
    gc.collect()
    gc.freeze()
