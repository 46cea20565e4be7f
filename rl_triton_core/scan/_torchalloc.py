"""The C replay's tensor work through torch's C++ API (``_torchalloc.cpp``): built
once per torch version and cached, loaded by the first recorded call (CPU or CUDA).

A repeated CUDA call (``_claunch``) allocates its outputs in C. Without this
extension it calls ``torch.empty_strided`` as a Python function, whose argument
parsing costs a few microseconds a tensor, about half the host time of a two-output
call; with it, ``at::empty_strided`` is called directly. A repeated CPU call reads its
tensors (address, shape, strides, dtype, whether it requires grad) from the tensors
themselves instead of through DLPack and attribute reads, and makes its outputs over
the block cache's memory without DLPack's conversion: on RLlib's 100,000-step row
(2-core VM, after other work) 8 of a 55 us call, mostly memory pages the call no
longer touches.

The extension is compiled against the installed torch's headers with the system C++
compiler (``$CXX``, else ``c++``): no CUDA toolkit, no new dependency, about 4-6 s.
Nothing is built at import or install time. The first call that is recorded
loads it from the cache, or, where it is not there yet, starts the build in a
background thread and the replay goes through Python and DLPack until it is done;
:func:`build` builds it in the foreground (``python -m rl_triton_core.build`` does,
e.g. while an image is built). The cache is ``$RL_TRITON_CORE_CACHE_DIR``, else
``$XDG_CACHE_HOME/rl_triton_core``, else ``~/.cache/rl_triton_core``, one file per
torch version, Python and source. A build that fails is remembered there, and not
tried again for that torch. ``RL_TRITON_CORE_TORCH_ALLOC=0`` (read at the first
recorded call) neither builds nor loads it. ``rl_triton_core.describe()`` reports
its state and build time.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import threading

import torch

from rl_triton_core.scan import _cpu_c

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torchalloc.cpp")
_NAME = "rl_triton_core.scan._torchalloc_ext"  # (not imported by name: loaded from the cache)
# c10::ScalarType of the dtypes a call allocates; checked against the extension's own
# reading of each dtype before it is used, and a record of another dtype allocates
# through Python
SCALAR = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
          torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bool: 11,
          torch.bfloat16: 15}

_lock = threading.Lock()
_thread: threading.Thread | None = None
state = "not loaded"  # "loaded", "building", "failed: ...", "off", "unsupported: ..."
build_seconds: float | None = None  # the build's time, where this cache entry was built
module = None  # the loaded extension
_cuda_views = None  # whether view reads CUDA tensors (None: not checked since use(True))


def use(on: bool):
    """Allocate, check and read tensors through the loaded extension (``on``), or
    through torch's Python functions and DLPack (tests compare the two). Its ``view``
    (a tensor read from the tensor itself) is used only where it describes every tensor
    of :func:`_view_samples` exactly as DLPack does: CPU tensors from here, CUDA tensors
    once :func:`cuda_views` has checked them."""
    global _cuda_views
    cs = _cpu_c._cscan
    _cuda_views = None
    if cs is None:  # no C extension: nothing allocates through it
        return
    if on and module is not None:
        view = getattr(module, "view", None)
        cs.gpu_alloc(module.alloc, getattr(module, "plain", None),
                     getattr(module, "blob", None), view, getattr(module, "scratch", None))
        if view is not None and not _views_agree(torch.device("cpu")):
            cs.gpu_alloc(module.alloc, getattr(module, "plain", None),
                         getattr(module, "blob", None), None, getattr(module, "scratch", None))
    else:
        cs.gpu_alloc(None, None)


def cuda_views() -> bool:
    """Let the C replay read CUDA tensors through the extension's ``view`` where it
    describes CUDA samples (:func:`_view_samples`: metadata only, no kernel) exactly as
    DLPack does; checked once after :func:`use`, from a recorded CUDA call's thread
    (never while a CUDA graph is captured: then at a later record). True where it reads
    them."""
    global _cuda_views
    if _cuda_views is None and module is not None and getattr(module, "view", None) is not None \
            and torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
        ok = _views_agree(torch.device("cuda", torch.cuda.current_device()))
        _cpu_c._cscan.gpu_views(ok)
        _cuda_views = ok
    return bool(_cuda_views)


def _view_samples(device) -> list:
    """Tensors on ``device`` of every dtype the extension's ``view`` reads, contiguous,
    strided, offset, expanded, 0-d, empty, transposed; one requiring grad, one negative
    view. Made with ``torch.empty`` and views only: no kernel runs."""
    base = torch.empty(2, 3, 4, device=device)
    out = [base, base[:, 1:, ::2], base.transpose(0, 2), base[1], base[0, 0, 0],
           torch.empty(0, 3, device=device), torch.empty(5, device=device).expand(3, 5),
           torch.empty(2, 3, device=device).requires_grad_(True),
           torch.empty(3, dtype=torch.complex64, device=device).conj().imag]
    out += [torch.empty(3, 2, dtype=d, device=device)[:, 1] for d in SCALAR]
    return out


def _views_agree(device) -> bool:
    views = _cpu_c._cscan.views
    for t in _view_samples(device):
        ext, dl = views(t, True), views(t, False)
        if ext is None:  # (read through DLPack then)
            continue
        plain = not t.requires_grad and not t.is_neg()
        if ext[-1] != plain or (dl is None and plain) or (dl is not None and ext[:-1] != dl[:-1]):
            return False
    return True


def cache_dir() -> str:
    d = os.environ.get("RL_TRITON_CORE_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "rl_triton_core")
    return d


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX") or "c++")


def _torch_dirs() -> tuple[str, str]:
    root = os.path.dirname(os.path.abspath(torch.__file__))
    return os.path.join(root, "include"), os.path.join(root, "lib")


def path() -> str:
    """The cached extension's file for this torch, Python, compiler and source."""
    with open(SOURCE, "rb") as f:
        h = hashlib.sha256(f.read())
    h.update(" ".join([torch.__version__, _torch_dirs()[0], sys.version, *_compiler()]).encode())
    return os.path.join(cache_dir(), f"_torchalloc-{h.hexdigest()[:16]}"
                        + sysconfig.get_config_var("EXT_SUFFIX"))


def _command(out: str, std: str) -> list[str]:
    inc, lib = _torch_dirs()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [*_compiler(), "-O2", f"-std={std}", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I" + sysconfig.get_paths()["include"],
            "-I" + inc, SOURCE, "-o", out, "-L" + lib, "-lc10", "-ltorch_cpu",
            "-ltorch_python", "-Wl,-rpath," + lib]


# The build runs in a process of its own (no torch import: the commands come from here),
# which holds a lock on the cache entry while it compiles and moves the finished file
# into place itself: a caller that exits mid-build (a short script, a test process) leaves
# neither a half-written file nor a compiler without an owner, and several processes
# (RLlib's env runners, pytest's workers) starting at once compile it once.
_BUILDER = r"""
import fcntl, json, os, subprocess, sys, tempfile, time
dest, suffix, commands = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
fd = os.open(dest + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | (0 if sys.argv[4] == "wait" else fcntl.LOCK_NB))
except OSError:
    sys.exit(3)  # another process is building it
if os.path.exists(dest):
    sys.exit(0)  # built while this one waited
start = time.perf_counter()
tfd, tmp = tempfile.mkstemp(suffix=suffix, dir=os.path.dirname(dest))
os.close(tfd)
err = ""
try:
    for command in commands:
        try:
            p = subprocess.run([tmp if a == "{out}" else a for a in command],
                               capture_output=True, text=True)
        except OSError as e:  # no compiler
            err = str(e)
            break
        if p.returncode == 0:
            seconds = time.perf_counter() - start
            os.replace(tmp, dest)
            with open(dest + ".seconds", "w") as f:
                f.write(f"{seconds:.1f}\n")
            sys.exit(0)
        err = (p.stderr or p.stdout).strip()[-2000:]
finally:
    if os.path.exists(tmp):
        os.unlink(tmp)
with open(dest + ".failed", "w") as f:
    f.write(err + "\n")
sys.exit(1)
"""


def _start_build(wait: bool) -> subprocess.Popen:
    """The builder process for :func:`path` (``wait``: it waits for another builder's
    lock instead of leaving at once with exit code 3)."""
    dest = path()
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # torch 2.13's headers want C++20; older ones take 17
    commands = [_command("{out}", std) for std in ("c++20", "c++17")]
    return subprocess.Popen([sys.executable, "-c", _BUILDER, dest,
                             sysconfig.get_config_var("EXT_SUFFIX"), json.dumps(commands),
                             "wait" if wait else "try"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def build() -> float:
    """Compile the extension into the cache (atomically: a finished file or none; where
    another process is compiling it, wait for that one) and return the seconds it took;
    RuntimeError with the compiler's message where it fails (remembered: the first
    recorded call does not try again)."""
    if sys.platform == "win32":
        raise RuntimeError("not built on Windows (the C replay does not run there)")
    dest = path()
    code = _start_build(wait=True).wait()
    return _built(dest, code)


def _built(dest: str, code: int) -> float:
    """The build time of the finished builder's file, or RuntimeError with its error."""
    if code == 0 and os.path.exists(dest):
        try:
            with open(dest + ".seconds") as f:
                return float(f.read())
        except (OSError, ValueError):
            return 0.0
    try:
        with open(dest + ".failed") as f:
            err = f.read().strip()
    except OSError:
        err = f"the builder process exited with {code}"
    raise RuntimeError(f"rl_triton_core: {os.path.basename(SOURCE)} was not built: {err}")


def _load(p: str) -> bool:
    """Load the built extension at ``p`` and hand its functions to the C replay."""
    global state, build_seconds, module
    loader = importlib.machinery.ExtensionFileLoader(_NAME, p)
    spec = importlib.util.spec_from_file_location(_NAME, p, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    if any(mod.scalar_type(d) != code for d, code in SCALAR.items()):
        state = "unsupported: this torch numbers its dtypes differently"
        return False
    module = mod
    use(True)
    try:
        with open(p + ".seconds") as f:
            build_seconds = float(f.read())
    except (OSError, ValueError):
        build_seconds = None
    state = "loaded"
    return True


def _build_and_load(proc=None):
    """Build (or wait for the builder ``proc``) and load; the state says what happened.
    Where another process holds the build, this one goes on without the extension."""
    global state
    try:
        if proc is None:
            build()
        else:
            code = proc.wait()
            if code == 3:
                state = "not loaded (another process is building it)"
                return
            _built(path(), code)
        with _lock:
            _load(path())
    except Exception as e:  # a compiler error, or a library that does not load
        state = f"failed: {str(e).splitlines()[0][:200]}"


def ensure(wait: bool = False) -> bool:
    """Load the cached extension, or start its build in a background thread (``wait``:
    build in this thread). True where the C replay allocates through it now."""
    global state, _thread
    if state == "loaded":
        return True
    if _cpu_c._cscan is None or not hasattr(_cpu_c._cscan, "gpu_alloc"):
        state = "unsupported: the C extension is not built"
        return False
    if os.environ.get("RL_TRITON_CORE_TORCH_ALLOC", "1") == "0":
        state = "off"
        return False
    if _thread is not None and _thread.is_alive():
        if wait:
            _thread.join()
        return state == "loaded"
    try:
        p = path()
    except OSError as e:  # the source is missing
        state = f"failed: {e}"
        return False
    if os.path.exists(p):
        with _lock:
            try:
                return _load(p)
            except Exception as e:  # a stale or broken file: rebuilt below
                state = f"failed: {str(e).splitlines()[0][:200]}"
                os.unlink(p)
    if os.path.exists(p + ".failed") and not wait:
        with open(p + ".failed") as f:
            state = "failed: " + (f.read().strip().splitlines() or ["?"])[-1][:200]
        return False
    state = "building"
    if wait:
        _build_and_load()
        return state == "loaded"
    try:
        proc = _start_build(wait=False)
    except OSError as e:  # no process could be started
        state = f"failed: {e}"
        return False
    _thread = threading.Thread(target=_build_and_load, args=(proc,),
                               name="rl_triton_core-torchalloc", daemon=True)
    _thread.start()
    return False
