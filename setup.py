"""Optional C kernels of the CPU path, built at install time.

``rl_triton_core._cscan`` (the scan's CPU kernel for GAE and TD(lambda)) and
``rl_triton_core._ctoken`` (the token-level estimators) are plain C against the CPython
API: no numpy headers, no JIT, so a fresh process computes its first call at full
speed. Where no C compiler is found, or a build fails, the install goes on without them
and the CPU path runs on numba, as before (``rl_triton_core.describe()`` says which).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _flags():
    if sys.platform == "win32":
        return ["/O2", "/fp:precise"]
    # IEEE arithmetic in the order the source writes it: no fused multiply-add, so the
    # results are bit for bit numba's (LLVM does not contract either)
    # (-fno-trapping-math only lets selects be vectorised: no result depends on traps)
    return ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-std=c99",
            "-Wall"]


def _libs():
    return [] if sys.platform == "win32" else ["pthread", "dl"]


class OptionalBuildExt(build_ext):
    """Build the C kernels where a compiler works; otherwise warn and go on."""

    def run(self):
        try:
            super().run()
        except Exception as e:  # pragma: no cover - no compiler at all
            print(f"rl-triton-core: C kernels not built ({e}); the CPU path uses numba")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:  # pragma: no cover - a compiler that fails
            print(f"rl-triton-core: {ext.name} not built ({e}); the CPU path uses numba")


_SOURCES = {"rl_triton_core._cscan": "rl_triton_core/_cscan.c",
            "rl_triton_core._ctoken": "rl_triton_core/_ctoken.c"}
ext_modules = [
    Extension(name, [src], extra_compile_args=_flags(), libraries=_libs(),
              depends=["rl_triton_core/_cpool.h", "rl_triton_core/_claunch.h"])
    for name, src in _SOURCES.items()
    if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), src))
]
if os.environ.get("RL_TRITON_CORE_NO_C") == "1":  # build without them (tests the fallback)
    ext_modules = []

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
