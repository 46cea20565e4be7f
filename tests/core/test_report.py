"""What ran: rl_triton_core.backend_for and describe, and where numba keeps its cache."""

import os

import pytest
import torch

import rl_triton_core as rc


def test_backend_for_cpu_tensors_is_numba(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "auto")
    assert rc.backend_for(torch.zeros(3)) == "numba"
    assert rc.backend_for("cpu") == "numba"
    assert rc.backend_for(torch.device("cpu")) == "numba"
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "cpu")
    assert rc.backend_for(torch.zeros(3)) == "numba"


def test_backend_for_follows_the_override(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert rc.backend_for(torch.zeros(3)) == "interpreter"
    else:
        with pytest.raises(ValueError, match="TRITON_INTERPRET"):
            rc.backend_for(torch.zeros(3))
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "gpu")
    with pytest.raises(ValueError, match="RL_TRITON_CORE_BACKEND"):
        rc.backend_for(torch.zeros(3))


@pytest.mark.gpu
def test_backend_for_cuda_tensors_is_triton(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "auto")
    assert rc.backend_for(torch.zeros(3, device="cuda")) == "triton"
    assert "backend triton" in rc.describe(torch.zeros(3, device="cuda"))


def test_describe_names_versions_and_the_path(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORE_BACKEND", "auto")
    text = rc.describe(torch.zeros(3))
    assert f"rl_triton_core {rc.__version__}" in text
    assert f"torch {torch.__version__}" in text
    assert "numba " in text and "triton " in text
    assert "cpu: backend numba (the CPU path: its C kernels where built" in text
    assert "backend" not in rc.describe()  # without a tensor: versions only
    from rl_triton_core import _cpu_c

    kernels = "CPU kernels: C for GAE" if _cpu_c.available() else "CPU kernels: numba"
    assert kernels in text
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
    assert "CPU kernels: numba (RL_TRITON_CORE_CPU_KERNEL=numba)" in rc.describe()


def test_numba_cache_is_not_in_the_source_tree():
    """The CPU path's compiled functions cache under numba's user-wide directory (or
    NUMBA_CACHE_DIR), never in rl_triton_core/__pycache__."""
    from rl_triton_core import _cpu

    if not _cpu._CACHE:
        pytest.skip("RL_TRITON_CORE_NUMBA_CACHE=0")
    pkg = os.path.dirname(os.path.abspath(rc.__file__))
    fn = _cpu.kernel(1, True, True, True, False, False, True, False, False, False)
    for dispatcher in (fn, _cpu._coefficients):
        path = os.path.abspath(dispatcher._cache._cache_path)
        assert not path.startswith(pkg + os.sep), path
