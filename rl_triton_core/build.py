"""Build the optional C++ allocator of the GPU launch path now, into the cache.

    python -m rl_triton_core.build

A repeated CUDA call is launched from C; its outputs are allocated through torch's C++
API where this small extension is built (about 6 s with the system C++ compiler
against the installed torch, once per torch version), else through torch's Python
functions, which cost a few microseconds more per output. Without this command the
first recorded CUDA call of a process builds it in a background thread; run it where
that should not happen at run time (a container image, a cluster's setup step). It
prints where the file is and how long the build took, and exits 1 where it cannot be
built (the GPU path then works as before). The cache is ``$RL_TRITON_CORE_CACHE_DIR``,
else ``$XDG_CACHE_HOME/rl_triton_core``, else ``~/.cache/rl_triton_core``.
"""

from __future__ import annotations

import sys

from rl_triton_core.scan import _torchalloc


def main() -> int:
    if _torchalloc.ensure(wait=True):
        took = (f"built in {_torchalloc.build_seconds:.1f} s"
                if _torchalloc.build_seconds is not None else "already built")
        print(f"rl_triton_core: C++ allocator {took}: {_torchalloc.path()}")
        return 0
    print(f"rl_triton_core: C++ allocator not built ({_torchalloc.state}); "
          "the GPU path allocates through torch's Python functions", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
