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
    from rl_triton_core.scan import _cpu_c

    kernels = "CPU kernels: C for GAE" if _cpu_c.available() else "CPU kernels: numba"
    assert kernels in text
    if _cpu_c.replay is not None:  # how a repeated CPU call reads its tensors
        assert ("CPU replay: a repeated call from C, its tensors read and outputs made "
                "through ") in text
    monkeypatch.setenv("RL_TRITON_CORE_CPU_KERNEL", "numba")
    assert "CPU kernels: numba (RL_TRITON_CORE_CPU_KERNEL=numba)" in rc.describe()


def test_numba_cache_is_not_in_the_source_tree():
    """The CPU path's compiled functions cache under numba's user-wide directory (or
    NUMBA_CACHE_DIR), never in rl_triton_core/__pycache__."""
    from rl_triton_core.scan import _cpu

    if not _cpu._CACHE:
        pytest.skip("RL_TRITON_CORE_NUMBA_CACHE=0")
    from rl_triton_core.token import _token_cpu

    pkg = os.path.dirname(os.path.abspath(rc.__file__))
    fn = _cpu.kernel(1, True, True, True, False, False, True, False, False, False)
    token = [*_token_cpu.SCANS.values(), *_token_cpu.WHITENS.values(), _token_cpu.row_stats]
    for dispatcher in (fn, _cpu._coefficients, *token):
        path = os.path.abspath(dispatcher._cache._cache_path)
        assert not path.startswith(pkg + os.sep), (dispatcher.py_func.__qualname__, path)


TOKEN_CACHE = r"""
import torch
import rl_triton_core as rc
r = torch.rand(4, 9, dtype=torch.float64)
m = torch.ones(4, 9, dtype=torch.bool)
rc.masked_returns(r, m, gamma=0.9, skip=True, time_dim=-1)
"""


def _token_cache_files(folder):
    if not os.path.isdir(folder):
        return {}
    return {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in os.listdir(folder)
            if f.startswith("_token_cpu.")}


def test_token_numba_cache_files_are_not_in_the_source_tree(tmp_path):
    """A token estimator on the numba loops, in a fresh process, writes its numba cache
    where the scan's goes (numba's user-wide cache directory, here under a temporary
    XDG_CACHE_HOME), and nothing into rl_triton_core/__pycache__."""
    import glob
    import subprocess
    import sys

    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), RL_TRITON_CORE_CPU_KERNEL="numba",
               RL_TRITON_CORE_NUMBA_CACHE="1", RL_TRITON_CORE_BACKEND="auto")
    env.pop("NUMBA_CACHE_DIR", None)
    in_tree = os.path.join(os.path.dirname(os.path.abspath(rc.__file__)), "__pycache__")
    before = _token_cache_files(in_tree)
    subprocess.run([sys.executable, "-c", TOKEN_CACHE], env=env, check=True)
    assert _token_cache_files(in_tree) == before
    written = glob.glob(str(tmp_path / "numba" / "*" / "_token_cpu.*.nbi"))
    assert written, sorted(glob.glob(str(tmp_path / "**"), recursive=True))
