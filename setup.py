"""Optional C kernels of the CPU path, built at install time.

``rl_triton_core.scan._cscan`` (the scan's CPU kernel for GAE and TD(lambda)) and
``rl_triton_core.token._ctoken`` (the token-level estimators) are plain C against the CPython
API: no numpy headers, no JIT, so a fresh process computes its first call at full
speed. Where no C compiler is found, or a build fails, the install goes on without them
and the CPU path runs on numba, as before (``rl_triton_core.describe()`` says which).
"""

import os
import sys
import time

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
    """Build the C kernels where a compiler works; otherwise warn and go on. Each
    extension's build time goes into rl_triton_core/_cbuild.txt (describe() reports it)."""

    def run(self):
        self._times = {}
        try:
            super().run()
        except Exception as e:  # pragma: no cover - no compiler at all
            print(f"rl-triton-core: C kernels not built ({e}); the CPU path uses numba")
        dirs = {os.path.join(self.build_lib, "rl_triton_core")}
        if self.inplace:  # (the extensions were copied into the source tree)
            dirs.add(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rl_triton_core"))
        for d in dirs:
            if not os.path.isdir(d) or not self._times:
                continue
            path = os.path.join(d, "_cbuild.txt")
            old = {}
            if os.path.exists(path):
                with open(path) as f:
                    old = dict(ln.split(" ", 1) for ln in f.read().splitlines() if " " in ln)
            old.update({name: f"{t:.1f}" for name, t in self._times.items()})
            with open(path, "w") as f:
                f.write("".join(f"{name} {t}\n" for name, t in old.items()))

    def build_extension(self, ext):
        path = self.get_ext_fullpath(ext.name)
        before = os.path.getmtime(path) if os.path.exists(path) else None
        start = time.perf_counter()
        try:
            super().build_extension(ext)
        except Exception as e:  # pragma: no cover - a compiler that fails
            print(f"rl-triton-core: {ext.name} not built ({e}); the CPU path uses numba")
            return
        if not os.path.exists(path) or os.path.getmtime(path) == before:
            return  # up to date: nothing was built, the recorded time stands
        self._times[ext.name] = time.perf_counter() - start
        print(f"rl-triton-core: built {ext.name} in {self._times[ext.name]:.1f} s")


_SOURCES = {"rl_triton_core.scan._cscan": "rl_triton_core/scan/_cscan.c",
            "rl_triton_core.token._ctoken": "rl_triton_core/token/_ctoken.c"}
ext_modules = [
    # _cpool.h and _cblocks.h (the thread pool and the output blocks' offsets both kernels
    # share) sit in rl_triton_core/
    Extension(name, [src], extra_compile_args=_flags(), libraries=_libs(),
              include_dirs=["rl_triton_core"],
              depends=["rl_triton_core/_cpool.h", "rl_triton_core/_cblocks.h",
                       "rl_triton_core/scan/_claunch.h"])
    for name, src in _SOURCES.items()
    if os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), src))
]
if os.environ.get("RL_TRITON_CORE_NO_C") == "1":  # build without them (tests the fallback)
    ext_modules = []

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
