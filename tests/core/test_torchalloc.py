"""The C replay's allocation through torch's C++ API (``rl_triton_core.scan._torchalloc``):
it builds with the system compiler against the installed torch, into the cache, and
its tensors are the ones torch's Python functions give (shape, strides, dtype, zeros);
where it cannot be built, nothing breaks and the replay allocates through Python. The
GPU side (the replay's bits, graph capture and streams with either allocation) is in
test_c_launch.py."""

import os
import shutil

import pytest
import torch

from rl_triton_core.scan import _cpu_c, _torchalloc

pytestmark = pytest.mark.skipif(_cpu_c._cscan is None, reason="the C extension is not built")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A state with nothing loaded, an empty cache under tmp_path; restores the
    module's state (and the replay's allocator) afterwards."""
    saved = (_torchalloc.state, _torchalloc.module, _torchalloc.build_seconds,
             _torchalloc._thread)
    monkeypatch.setenv("RL_TRITON_CORE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RL_TRITON_CORE_TORCH_ALLOC", raising=False)
    _torchalloc.state, _torchalloc.module, _torchalloc._thread = "not loaded", None, None
    yield tmp_path
    (_torchalloc.state, _torchalloc.module, _torchalloc.build_seconds,
     _torchalloc._thread) = saved
    _torchalloc.use(True)  # the saved module, or none: Python


def _needs_compiler():
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        pytest.skip("no C++ compiler here")


def _python_alloc():
    """Bind torch's Python functions (gpu_bind keeps them where there is no driver)."""
    _cpu_c._cscan.gpu_bind(torch.empty_strided, torch.zeros)


SPECS = [((64, 32), (32, 1), torch.float32, False), ((5, 7, 3), (1, 15, 5), torch.float64, False),
         ((3, 9), (1, 3), torch.bfloat16, False), ((4, 11), (11, 1), torch.float32, True),
         ((2, 3), (3, 1), torch.int64, True), ((6,), (1,), torch.bool, False),
         ((0, 5), (5, 1), torch.float16, False)]


def _alloc(spec, code):
    size, stride, dtype, zeroed = spec
    return _cpu_c._cscan.alloc_test((size, stride, dtype, zeroed, code), torch.device("cpu"))


def test_builds_caches_and_allocates_as_torch_does(fresh):
    _needs_compiler()
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    assert _torchalloc.state == "loaded" and _torchalloc.build_seconds > 0
    assert os.path.exists(_torchalloc.path()) and _torchalloc.path().startswith(str(fresh))
    _python_alloc()
    for spec in SPECS:
        size, stride, dtype, zeroed = spec
        for code in (_torchalloc.SCALAR[dtype], -1):  # the C++ function, then Python's
            _torchalloc.use(True)
            t = _alloc(spec, code)
            assert type(t) is torch.Tensor and t.device.type == "cpu"
            assert t.shape == size and t.dtype == dtype and not t.requires_grad
            if zeroed:
                assert t.is_contiguous() and not t.any()
            else:
                assert t.stride() == stride
            t.fill_(1)  # its memory is its own and writable
            assert bool(t.all()) or t.numel() == 0
    # the next process loads it from the cache without building
    _torchalloc.state, _torchalloc.module = "not loaded", None
    mtime = os.path.getmtime(_torchalloc.path())
    assert _torchalloc.ensure() and os.path.getmtime(_torchalloc.path()) == mtime


def test_a_build_in_the_background(fresh):
    _needs_compiler()
    assert not _torchalloc.ensure()  # started, not waited for
    assert _torchalloc.state in ("building", "loaded")
    _torchalloc._thread.join()
    assert _torchalloc.state == "loaded"


def test_dtype_numbers_are_torchs(fresh):
    _needs_compiler()
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    # torch 2.10+ keeps the tensor right after the Python object's head: the replay's
    # fast check of requires_grad and the negative bit is there
    assert hasattr(_torchalloc.module, "plain")
    for dtype, code in _torchalloc.SCALAR.items():
        assert _torchalloc.module.scalar_type(dtype) == code
    with pytest.raises(TypeError):
        _torchalloc.module.scalar_type(3)


def test_without_a_compiler_the_python_functions_allocate(fresh, monkeypatch):
    """A build that fails is reported and remembered, and the replay's allocations go
    through torch's Python functions."""
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    _torchalloc.use(False)
    assert not _torchalloc.ensure(wait=True)
    assert _torchalloc.state.startswith("failed") and _torchalloc.module is None
    assert os.path.exists(_torchalloc.path() + ".failed")
    _torchalloc.state = "not loaded"
    assert not _torchalloc.ensure() and _torchalloc.state.startswith("failed")  # not retried
    _python_alloc()
    t = _alloc(SPECS[1], _torchalloc.SCALAR[torch.float64])
    assert t.shape == (5, 7, 3) and t.stride() == (1, 15, 5) and t.dtype == torch.float64


def test_switched_off(fresh, monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_TORCH_ALLOC", "0")
    assert not _torchalloc.ensure(wait=True) and _torchalloc.state == "off"
    assert not os.listdir(fresh)


def test_a_broken_cache_file_is_rebuilt(fresh):
    _needs_compiler()
    os.makedirs(os.path.dirname(_torchalloc.path()), exist_ok=True)
    with open(_torchalloc.path(), "w") as f:
        f.write("not a library")
    assert _torchalloc.ensure(wait=True), _torchalloc.state


def test_bad_specs_are_errors():
    _python_alloc()
    with pytest.raises(ValueError):
        _cpu_c._cscan.alloc_test(((3,), (1,), torch.float32), torch.device("cpu"))


def test_the_replay_checks_tensors_through_it(fresh, monkeypatch):
    """Loaded, the extension's reading of requires_grad and the negative bit is what
    the C replay checks every tensor with (the CPU replay too): a tensor that requires
    grad takes autograd, a negative view its resolved values, a plain one the replay."""
    _needs_compiler()
    from core_testlib import spy_c_replay

    import rl_triton_core as rc
    from rl_triton_core.scan import _dispatch

    if _cpu_c.replay is None:
        pytest.skip("no C replay here")
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    monkeypatch.setattr(_dispatch, "_PLANS", {})
    g = torch.Generator().manual_seed(5)
    r, v = torch.randn(8, 300, generator=g), torch.randn(8, 300, generator=g)
    term = torch.rand(8, 300, generator=g) < 0.05
    rc.gae(r, v, term, time_dim=-1)  # recorded
    replayed = []
    spy_c_replay(monkeypatch, replayed)
    adv, _ = rc.gae(r.clone().requires_grad_(), v, term, time_dim=-1)
    assert adv.grad_fn is not None and not replayed
    got = rc.gae(torch._neg_view(r), v, term, time_dim=-1)
    assert not replayed
    want = rc.gae(-r, v, term, time_dim=-1)
    assert replayed  # (a plain call)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
