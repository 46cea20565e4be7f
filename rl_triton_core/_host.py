"""What the scan's and the token estimators' kernels share on the host: a float as the
float32 pair a kernel rebuilds a float64 number from, the GPU's SM count (how many
programs fill it), the CPU path's thread pool and its numba cache, and the registry of
numba warm-up threads that a foreground numba call must wait for.

The two sub-packages (``rl_triton_core.scan``, ``rl_triton_core.token``) import this,
never each other; their device-side helpers (loads, flags, numbers) are in ``_tl``.
Nothing here imports Triton or numba at import time: the CPU path runs without Triton,
and a fresh process's first CPU call does not wait for numba.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import struct
import tempfile
import threading

import torch

try:
    import fcntl
except ImportError:  # Windows: the compile lock is between threads only
    fcntl = None

_F32_MAX = 3.4e38  # float32 max, with room so the rounded hi stays finite


@functools.lru_cache(maxsize=256)  # a training loop passes the same few coefficients
def split(value: float):
    """A float as two float32s (hi, lo) with hi + lo == value to ~48 bits: the kernels
    take float32 scalars and rebuild float64 ones from the pair (``_tl.number``)."""
    if not abs(value) < _F32_MAX:  # inf (an unclipped threshold), beyond float32, NaN
        return (value if value != value else math.copysign(math.inf, value)), 0.0
    hi = struct.unpack("f", struct.pack("f", value))[0]
    return hi, struct.unpack("f", struct.pack("f", value - hi))[0]


_SM_COUNT: dict = {}


def sm_count(device) -> int:
    """The number of SMs of a CUDA device (4 for CPU tensors under Triton's interpreter:
    small, so the tests reach the plans for few streams)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else 0
    sms = _SM_COUNT.get(idx)
    if sms is None:
        sms = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return sms


# ------------------------------------------------------------------ the CPU path

# numba's on-disk cache (per variant); RL_TRITON_CORE_NUMBA_CACHE=0 compiles afresh in
# every process
NUMBA_CACHE = os.environ.get("RL_TRITON_CORE_NUMBA_CACHE", "1") == "1"
THREADS = max(1, min(os.cpu_count() or 1, 8))
MIN_WORK = 1 << 16  # elements below which one thread is faster than handing out work
_POOL = None


def pool():
    """The CPU path's thread pool (numba's kernels release the GIL)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max(THREADS, 8), thread_name_prefix="rl_triton_core")
    return _POOL


def cache_outside_the_source_tree(module_file: str) -> None:
    """numba's cache of ``module_file``'s functions goes to numba's user-wide cache
    directory (e.g. ~/.cache/numba), not next to the source in a ``__pycache__`` of the
    package, where an editable install would collect about a thousand files;
    NUMBA_CACHE_DIR, when set, still decides. Other modules' numba functions are not
    affected. Call it before the module's ``cache=True`` functions are decorated (numba
    picks a function's cache location then)."""
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba's layout changed: its default applies
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    user_wide = getattr(caching, "UserWideCacheLocator", None) or getattr(
        caching, "_UserWideCacheLocator", None)
    if impl is None or user_wide is None:  # pragma: no cover
        return
    classes = impl._locator_classes
    locator = next((c for c in classes if getattr(c, "rl_triton_core", False)), None)
    if locator is None:

        class _Locator(user_wide):
            rl_triton_core = True
            files: set = set()  # the absolute paths of the modules it places

            @classmethod
            def from_function(cls, py_func, py_file):
                if os.path.abspath(py_file) not in cls.files:
                    return None
                return super().from_function(py_func, py_file)

        locator = _Locator
        classes.insert(1, locator)  # after NUMBA_CACHE_DIR's locator, before __pycache__'s
    locator.files.add(os.path.abspath(module_file))


# One numba compile at a time, across the threads and the processes of this user: numba's
# on-disk cache takes no lock of its own, and two processes saving variants of one function
# at once can both take the same next data file, leaving an index entry that points at the
# other's code. Such a variant then fails on every call, in every later process, with
# "can't unbox array from PyObject into native value" (seen in this project's test runs:
# two pytest workers and a third process compiling at once). The lock wraps a dispatcher's
# compile (a cache load, or a compile and its save), so a process that waits finds the
# other's entry and loads it instead of compiling the same variant again.
_COMPILE_LOCK = threading.RLock()
_compile_depth = 0
_lock_fd = None


def _lock_path() -> str:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"rl_triton_core-numba-{uid}.lock")


@contextlib.contextmanager
def compile_lock():
    """Hold the numba compile lock (re-entrant within a thread; a file lock between
    processes where ``fcntl`` exists, else between threads only)."""
    global _compile_depth, _lock_fd
    with _COMPILE_LOCK:
        _compile_depth += 1
        locked = False
        try:
            if _compile_depth == 1 and fcntl is not None:
                if _lock_fd is None:
                    try:
                        _lock_fd = os.open(_lock_path(), os.O_RDWR | os.O_CREAT, 0o600)
                    except OSError:  # no writable temp directory: threads only
                        _lock_fd = -1
                if _lock_fd >= 0:
                    fcntl.flock(_lock_fd, fcntl.LOCK_EX)
                    locked = True
            yield
        finally:
            if locked:
                fcntl.flock(_lock_fd, fcntl.LOCK_UN)
            _compile_depth -= 1


def locked_compiles(dispatcher):
    """``dispatcher`` (a numba function the CPU path calls from Python) with its compiles
    under :func:`compile_lock`; the functions it calls compile inside its compile. A no-op
    where the on-disk cache is off (``RL_TRITON_CORE_NUMBA_CACHE=0``)."""
    if NUMBA_CACHE:
        compile_ = dispatcher.compile

        def compile(sig):
            with compile_lock():
                return compile_(sig)

        dispatcher.compile = compile
    return dispatcher


WARMING: dict = {}  # a numba kernel's key -> the thread loading it in the background


def settle() -> None:
    """Wait for every warm-up thread: a foreground numba call never runs while one is
    still compiling or loading (two threads in numba's dispatch at once failed: "can't
    unbox array from PyObject" once in CI)."""
    if WARMING:
        for thread in list(WARMING.values()):
            thread.join()


# ------------------------------------------------------------------ CPU outputs

POOLED_MIN = 1 << 17  # output bytes from which CPU outputs come from the block cache
_BLOCKS = None  # the block cache (``token._ctoken``) once set up; False: not built, or off


def _block_cache():
    global _BLOCKS
    try:
        from rl_triton_core.token import _ctoken  # the C extension that keeps the blocks
    except ImportError:
        _BLOCKS = False
        return _BLOCKS
    mb = os.environ.get("RL_TRITON_CORE_CPU_CACHE_MB", "512")
    try:
        limit = max(int(mb), 0) << 20
    except ValueError:
        raise ValueError("RL_TRITON_CORE_CPU_CACHE_MB must be a whole number of MiB, "
                         f"got {mb!r}") from None
    _ctoken.set_cache_limit(limit)
    _BLOCKS = _ctoken if limit > 0 else False
    return _BLOCKS


def empty(shape, dtype) -> torch.Tensor:
    """A new contiguous CPU tensor for an output of the CPU path (the scan's, its C
    replay's, the token estimators').

    From 128 KiB (``POOLED_MIN``) its memory comes from the C kernels' cache of freed
    output blocks (``RL_TRITON_CORE_CPU_CACHE_MB``, default 512, read once; 0: off): the
    memory of an earlier call's outputs, already faulted in. A fresh buffer pays its page
    faults when the kernel first writes it, because glibc gives freed large blocks back to
    the system: on a 2-core VM two fresh 400 KB outputs cost about 30 µs after other
    work, more than the scan of 100,000 steps itself, and 32 MiB about 7 ms. Such a
    tensor's storage cannot grow (``resize_`` to a larger size raises); it is otherwise
    an ordinary tensor, and its block returns to the cache when its storage is freed.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= POOLED_MIN:
        blocks = _BLOCKS if _BLOCKS is not None else _block_cache()
        if blocks:
            t = torch.frombuffer(blocks.empty(nbytes), dtype=dtype)
            return t if len(shape) == 1 else t.view(shape)
    return torch.empty(shape, dtype=dtype)


def allocator(shape, dtype):
    """What allocates a CPU output of this shape and dtype: :func:`empty` where it takes
    the block cache, else ``torch.empty`` (the C replay calls it: one call fewer)."""
    blocks = _BLOCKS if _BLOCKS is not None else _block_cache()
    return empty if blocks and math.prod(shape) * dtype.itemsize >= POOLED_MIN else torch.empty
