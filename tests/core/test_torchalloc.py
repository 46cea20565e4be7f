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


def _random_views(g, n, device="cpu"):
    """n tensors on ``device`` of random dtype, shape, strides, offset and flags."""
    out = []
    for i in range(n):
        dtype = list(_torchalloc.SCALAR)[int(torch.randint(len(_torchalloc.SCALAR), (),
                                                           generator=g))]
        nd = int(torch.randint(0, 5, (), generator=g))
        shape = [int(torch.randint(0, 6, (), generator=g)) for _ in range(nd)]
        base = torch.randn([2 * s + 1 for s in shape] or [3], generator=g).to(device, dtype)
        t = base[tuple(slice(1, None, 2) for _ in shape)] if nd else base[1]
        if nd >= 2 and i % 3 == 0:
            t = t.transpose(0, nd - 1)
        if i % 5 == 0 and dtype.is_floating_point:
            t = t.clone().requires_grad_(True) if i % 2 else t.detach()
        out.append(t)
    return out


def _views_are_dlpacks(device):
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    views = _cpu_c._cscan.views
    for t in _random_views(g, 60, device) + _torchalloc._view_samples(device):
        ext, dl = views(t, True), views(t, False)
        assert ext is not None and dl is not None, (t.shape, t.dtype, seed)
        assert ext[:-1] == dl[:-1], (t.shape, t.stride(), t.dtype, seed)
        assert ext[-1] == int(not t.requires_grad and not t.is_neg()) and dl[-1] == -1
    assert _torchalloc._views_agree(device)


def test_the_replays_reading_of_a_tensor_is_dlpacks(fresh):
    """The extension's view of a CPU tensor (the replay's key and addresses) is DLPack's
    field for field, on random dtypes, shapes, strides and offsets; it says a tensor is
    plain where it needs no autograd and has no negative bit. Where the two ever
    differ, use() leaves the replay on DLPack."""
    _needs_compiler()
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    _views_are_dlpacks(torch.device("cpu"))
    # CUDA tensors are read through it only once cuda_views() has checked them
    assert _torchalloc._cuda_views is None
    if not torch.cuda.is_initialized():
        assert not _torchalloc.cuda_views() and _torchalloc._cuda_views is None
    views = _cpu_c._cscan.views
    import warnings

    with warnings.catch_warnings():  # (the strided nested layout is a prototype)
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    sparse = torch.eye(3).to_sparse()
    for t in (nested, sparse, torch.ones(2, device="meta")):
        assert views(t, True) is None  # not described: DLPack's reading (or the Python path)
    _torchalloc.use(False)
    assert views(torch.ones(2), True) is None  # off: DLPack only
    _torchalloc.use(True)


@pytest.mark.gpu
def test_the_replays_reading_of_a_cuda_tensor_is_dlpacks(fresh):
    """As above for CUDA tensors (device and index included), which the replay then
    reads through the extension: cuda_views() turns it on, use() off until checked."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _needs_compiler()
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=dev)  # (CUDA initialised)
    _views_are_dlpacks(dev)
    assert _torchalloc.cuda_views() and _cpu_c._cscan.gpu_views(True)
    _torchalloc.use(True)
    assert _torchalloc._cuda_views is None and not _cpu_c._cscan.gpu_views(False)


def test_replay_outputs_made_over_blocks_are_torchs_tensors(fresh):
    """A replayed call's outputs made by the extension over the block cache's memory:
    contiguous float tensors of the call's shape whose storage cannot grow, freed from
    any thread back into the cache, and the same bits as the Python path's."""
    _needs_compiler()
    import threading

    from core_testlib import HELD_MAX, held_blocks

    import rl_triton_core as rc
    from rl_triton_core import _host

    blocks = _host._BLOCKS if _host._BLOCKS is not None else _host._block_cache()
    if not blocks or _cpu_c.replay is None or not hasattr(blocks, "blocks_api"):
        pytest.skip("no block cache or no C replay")
    assert _torchalloc.ensure(wait=True), _torchalloc.state
    g = torch.Generator().manual_seed(7)
    for dtype in (torch.float32, torch.float64):
        r, v = (torch.randn(3, 30_000, generator=g, dtype=dtype) for _ in range(2))
        done = torch.rand(3, 30_000, generator=g) < 0.01
        first = rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
        for _ in range(3):
            held = held_blocks(blocks)
            adv, ret = rc.gae(r, v, done, gamma=0.9, lmbda=0.8, time_dim=-1)
            assert adv.untyped_storage().data_ptr() != first[0].untyped_storage().data_ptr()
            assert adv.dtype == dtype and adv.shape == r.shape and adv.is_contiguous()
            assert not adv.untyped_storage().resizable() and adv._base is None
            assert torch.equal(adv, first[0]) and torch.equal(ret, first[1])
            taken = held_blocks(blocks)
            assert taken <= held
            adv.add_(1.0)
            box = [adv, ret]
            del adv, ret
            th = threading.Thread(target=box.clear)  # the last references dropped there
            th.start()
            th.join()
            assert held_blocks(blocks) == min(taken + 2, HELD_MAX)  # (beyond: the oldest go)


def test_a_caller_that_exits_mid_build_leaves_a_finished_file(fresh):
    """The background build is a process of its own: a caller that exits right after
    starting it (a short script) leaves no half-written file, and the next process finds
    the finished extension in the cache."""
    _needs_compiler()
    import subprocess
    import sys
    import time

    code = ("from rl_triton_core.scan import _torchalloc as t; "
            "assert not t.ensure() and t.state == 'building', t.state")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    dest = _torchalloc.path()
    deadline = time.monotonic() + 120
    while not os.path.exists(dest + ".seconds") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert os.path.exists(dest), os.listdir(fresh)
    leftovers = [n for n in os.listdir(os.path.dirname(dest))
                 if not n.startswith(os.path.basename(dest))]
    assert not leftovers  # no temporary file of a compiler that lost its caller
    assert _torchalloc.ensure() and _torchalloc.state == "loaded"


def test_concurrent_builds_compile_once(fresh):
    """Processes starting the build together (RLlib's env runners, pytest's workers):
    one compiles, the others leave at once (exit code 3) and go on without it."""
    _needs_compiler()
    procs = [_torchalloc._start_build(wait=False) for _ in range(3)]
    codes = sorted(p.wait() for p in procs)
    assert codes[0] == 0 and set(codes) <= {0, 3}, codes
    assert os.path.exists(_torchalloc.path())
    assert _torchalloc.ensure() and _torchalloc.state == "loaded"
