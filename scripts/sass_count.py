"""The scan kernel of one call compiled for sm_90 without a GPU: registers, shared
memory and SASS instruction counts, per tuning variant (a way to count instructions
before a device run).

    python scripts/sass_count.py 16384 512 gae default,lb32

N streams x T steps, time-major float32 data with done flags. The call runs on CPU
tensors through the Triton path; the first kernel launch is compiled for sm_90 by
Triton (with its bundled ptxas) instead of launched, and its cubin is read with the
bundled ``cuobjdump`` and ``nvdisasm``. Needs a Triton wheel with the NVIDIA backend;
``BATCH=1``: batch-major ``[N, T]`` data instead. ``LAUNCH=k`` takes the call's k-th
launch instead of its first (k = 2: the three launches' last; the count is then per call,
not per variant). ``TTGIR=1`` also writes
the kernel's TTGIR (its layouts) to /tmp, ``SASS=1`` its SASS.
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from tm_sweep import variant  # a sibling script: its variants, and tNxTwW tiles
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver
from triton.runtime.jit import JITFunction

import rl_triton_core as rc
from rl_triton_core.scan import _launch
from rl_triton_core.token import _group_kernel  # noqa: F401 (compiled, not interpreted)

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


class _Sm90(CudaDriver):
    """A driver that reports an sm_90 device and compiles, never launches."""

    def __init__(self):
        pass

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


class _Compiled(Exception):
    pass


def _capture():
    """Make every Triton launch compile only and raise with its kernel."""
    real = JITFunction.run

    skip = [int(os.environ.get("LAUNCH", "0"))]  # which launch of the call: 0 the first

    def run(self, *args, grid, warmup, **kw):
        kernel = real(self, *args, grid=grid, warmup=True, **kw)
        if skip[0] > 0:
            skip[0] -= 1
            return kernel
        raise _Compiled(kernel, grid, kw)

    JITFunction.run = run


def _tool(name, path, *flags):
    return subprocess.run([os.path.join(BIN, name), *flags, path], capture_output=True,
                          text=True).stdout


def main(argv):
    N, T, est = int(argv[0]), int(argv[1]), argv[2]
    names = argv[3].split(",") if len(argv) > 3 else ["default"]
    os.environ["RL_TRITON_CORE_BACKEND"] = "triton"
    os.environ["TRITON_INTERPRET"] = "1"  # (read by the dispatch check only: the kernels
    # were decorated before this, as compiled kernels)
    driver.set_active(_Sm90())
    _launch._sm_count = lambda device: 132  # an H100 / H200
    _capture()
    batch = os.environ.get("BATCH") == "1"  # batch-major [N, T] data instead
    shape, td = ((N, T), -1) if batch else ((T, N), 0)
    r, v, lr = torch.randn(shape), torch.randn(shape), 0.5 * torch.randn(shape)
    d = torch.rand(shape) < 0.02
    b = torch.randn(N)
    calls = {"gae": lambda: rc.gae(r, v, d, bootstrap_value=b, time_dim=td),
             "vtrace": lambda: rc.vtrace(lr, r, v, d, bootstrap_value=b, time_dim=td),
             "eligibility_traces": lambda: rc.eligibility_traces(r, d, time_dim=td),
             "lambda_returns": lambda: rc.lambda_returns(r, v, d, bootstrap_value=b,
                                                         time_dim=td),
             # N scores in groups of 8 (T is not read)
             "group_advantages": lambda: rc.group_advantages(torch.randn(N), torch.arange(N) // 8),
             "group_rloo": lambda: rc.group_advantages(torch.randn(N), torch.arange(N) // 8,
                                                       method="rloo")}
    for name in names:
        with rc.tuning(cached_launch=False, **variant(name)):
            try:
                calls[est]()
                print(name, "no kernel was launched")
                continue
            except _Compiled as c:
                kernel, grid, kw = c.args
        if os.environ.get("TTGIR"):
            with open(f"/tmp/ttgir_{est}_{name}.mlir", "w") as f:
                f.write(kernel.asm["ttgir"])
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            res = _tool("cuobjdump", f.name, "-res-usage")
            sass = _tool("nvdisasm", f.name, "-c")
        if os.environ.get("SASS"):
            with open(f"/tmp/sass_{est}_{name}.txt", "w") as f:
                f.write(sass)
        use = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res)
        ins = [ln.split("*/")[1].strip() for ln in sass.splitlines()
               if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
        ops = collections.Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", i).split()[0].split(".")[0]
                                  for i in ins if i)
        phases = {k: kw[k] for k in ("PHASE", "BLOCK_N", "BLOCK_T") if k in kw}
        print(f"{est} {N}x{T} {name}: grid {grid} {phases} warps {kw.get('num_warps')} "
              f"registers {use.group(1) if use else '?'} local {use.group(3) if use else '?'} "
              f"shared {kernel.metadata.shared} B, {len(ins)} SASS instructions: "
              + ", ".join(f"{o} {n}" for o, n in ops.most_common(8)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
