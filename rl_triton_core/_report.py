"""What ran: the backend a call takes, and the versions behind it.

    >>> import torch, rl_triton_core as rc
    >>> rc.backend_for(torch.zeros(3))      # CPU tensors: the CPU path
    'numba'
    >>> print(rc.describe(torch.zeros(3)))  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.metadata
import os

import torch

from rl_triton_core._version import __version__
from rl_triton_core.scan import _claunch, _cpu_c, _dispatch, _torchalloc

__all__ = ["backend_for", "describe"]


def backend_for(x) -> str:
    """The backend an estimator call on ``x`` (a tensor, or a device) takes.

    Returns ``"triton"`` (the Triton kernels, compiled for the GPU: CUDA tensors),
    ``"numba"`` (the CPU path: CPU tensors; it runs the C kernels built at install for
    GAE, TD(lambda), discounted returns and the token-level estimators, and numba loops
    for the rest, or for all where the C kernels were not built: [`describe`][] says
    which), or ``"interpreter"`` (the Triton kernels run by Triton's interpreter on CPU
    tensors: ``RL_TRITON_CORE_BACKEND=triton`` with ``TRITON_INTERPRET=1``, for testing
    kernel logic without a GPU, and slow). Reads ``RL_TRITON_CORE_BACKEND`` as a call
    does (ValueError for a bad value).

    Examples:
        >>> import torch, rl_triton_core as rc
        >>> rc.backend_for(torch.zeros(3))
        'numba'
    """
    if isinstance(x, torch.Tensor):
        device = x.device
    else:
        device = torch.device(x)
    if _dispatch.backend_for(device) == "cpu":
        return "numba"
    return "interpreter" if device.type == "cpu" else "triton"


def _version(name: str) -> str | None:
    try:  # without importing the package (Triton may be absent, or slow to import)
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_kernels() -> str:
    """Which kernels the CPU path has: the C ones built at install time, or numba only."""
    import importlib.util

    if os.environ.get("RL_TRITON_CORE_CPU_KERNEL", "c") == "numba":
        return "CPU kernels: numba (RL_TRITON_CORE_CPU_KERNEL=numba)"
    token = importlib.util.find_spec("rl_triton_core.token._ctoken")
    c = (["GAE, TD(lambda), discounted returns"] if _cpu_c.available() else []) + (
        ["the token estimators"] if token else [])
    if not c:
        return "CPU kernels: numba (the C kernels were not built at install)"
    return f"CPU kernels: C for {' and '.join(c)}; numba for the rest"


def _cpu_replay() -> str:
    """How a repeated CPU call reads its tensors and makes its outputs."""
    st = _torchalloc.state
    if st == "loaded":
        how = "torch's C++ API" + (f" (built in {_torchalloc.build_seconds:.1f} s)"
                                   if _torchalloc.build_seconds is not None else "")
    else:
        how = (f"DLPack (torch's C++ API: {st}; the first recorded call loads or builds it, "
               "python -m rl_triton_core.build builds it ahead)")
    return f"CPU replay: a repeated call from C, its tensors read and outputs made through {how}"


def _build_time() -> str:
    """The C kernels' build time at install (setup.py records it), or ''."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cbuild.txt")
    try:
        with open(path) as f:
            parts = [ln.split() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return ""
    return " (built at install in " + ", ".join(
        f"{p[1]} s ({p[0].rsplit('.', 1)[-1]})" for p in parts if len(p) == 2) + ")"


def _gpu_launch() -> str:
    """How a repeated CUDA call starts its kernels: from C, or through Triton's launcher."""
    if os.environ.get("RL_TRITON_CORE_C_LAUNCH", _claunch.DEFAULT) != "1":
        return "GPU launch: Triton's launcher (RL_TRITON_CORE_C_LAUNCH=0)"
    if _claunch.available():
        st = _torchalloc.state
        alloc = (("torch's C++ API" + (f", built in {_torchalloc.build_seconds:.1f} s"
                                       if _torchalloc.build_seconds is not None else ""))
                 if st == "loaded" else
                 f"torch's Python functions (the C++ allocator: {st}; "
                 "python -m rl_triton_core.build)")
        return ("GPU launch: a repeated call from C (cuLaunchKernel on torch's current "
                f"stream; outputs from {alloc})")
    why = ("the C extension was not built" if _cpu_c._cscan is None else
           "torch has no DLPack C exchange table" if _cpu_c.replay is None else
           "the CUDA driver lacks cuFuncGetParamInfo (CUDA 12.4+)")
    return f"GPU launch: Triton's launcher ({why})"


def describe(x=None) -> str:
    """A short report for bug reports and logs: the library's, torch's, Triton's and
    numba's versions, which CPU kernels are built, the GPU, the backend settings and,
    for ``x`` (a tensor or a device), the device and the backend a call on it takes
    ([`backend_for`][]).

    Examples:
        >>> import rl_triton_core as rc
        >>> report = rc.describe("cpu")  # print(report) in a bug report
        >>> report.splitlines()[0] == f"rl_triton_core {rc.__version__}"
        True
        >>> any(line.startswith("CPU kernels: ") for line in report.splitlines())
        True
    """
    lines = [f"rl_triton_core {__version__}", f"torch {torch.__version__}"
             + (f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU build)"),
             f"triton {_version('triton') or 'not installed'}",
             f"numba {_version('numba') or 'not installed'}", _cpu_kernels() + _build_time()]
    if _cpu_c.replay is not None:
        lines.append(_cpu_replay())
    if torch.cuda.is_available():
        lines.append("GPU " + ", ".join(torch.cuda.get_device_name(i)
                                        for i in range(torch.cuda.device_count())))
        lines.append(_gpu_launch())
    else:
        lines.append("GPU none")
    lines.append("RL_TRITON_CORE_BACKEND=" + os.environ.get("RL_TRITON_CORE_BACKEND", "auto")
                 + (" TRITON_INTERPRET=1" if os.environ.get("TRITON_INTERPRET") == "1" else ""))
    if x is not None:
        device = x.device if isinstance(x, torch.Tensor) else torch.device(x)
        path = {"triton": "the Triton kernels",
                "numba": "the CPU path: its C kernels where built, numba for the rest",
                "interpreter": "the Triton kernels in Triton's interpreter (slow)"}
        b = backend_for(device)
        lines.append(f"{device}: backend {b} ({path[b]})")
    return "\n".join(lines)
